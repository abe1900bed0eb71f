"""One process: activation checkpointing and the ``parallel`` keys' validation (the multi-process
checks are in test_distributed.py)."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny

from zoo.lab.records.metrics import read_metrics
from zoo.lab.training.run import run


def losses(run_dir) -> list[float]:
    return [r["loss"] for r in read_metrics(run_dir) if r["kind"] == "train"]


@pytest.mark.slow
def test_activation_checkpointing_keeps_the_loss_trajectory(tmp_path):
    # Dropout on: the recomputed forward must draw the same masks (checkpoint restores the RNG state).
    overrides = ["block.dropout=0.1", "train.steps=6", "train.log_every=1", "train.eval_every=0"]
    plain = run(tiny(*overrides), tmp_path / "plain")
    checkpointed = run(tiny(*overrides, "train.activation_checkpointing=true"), tmp_path / "ac")
    assert plain["status"] == checkpointed["status"] == "ok", checkpointed["error"]
    assert len(losses(tmp_path / "plain")) == 6
    assert losses(tmp_path / "ac") == pytest.approx(losses(tmp_path / "plain"), rel=1e-6, abs=1e-7)
    assert checkpointed["config_hash"] == plain["config_hash"]  # the same experiment, run differently


def test_activation_checkpointing_recomputes_each_block():
    from zoo import compose
    from zoo.models.language import build_model

    model = build_model(compose(["block.d_model=16", "block.n_heads=4", "model.n_layers=2"]))
    calls = []
    for block in model.blocks:
        block.register_forward_pre_hook(lambda *args: calls.append(1))
    ids = torch.randint(0, 256, (2, 8))
    model(ids).sum().backward()
    assert len(calls) == 2
    calls.clear()
    model.checkpoint_blocks = True
    model(ids).sum().backward()
    assert len(calls) == 4  # each block's forward again in backward
    calls.clear()
    with torch.no_grad():
        model(ids)
    assert len(calls) == 2  # no recomputation without gradients


def test_parallel_keys_are_checked_against_the_world_size():
    from zoo import ConfigError
    from zoo.lab.planning.mesh import ProcessMesh

    assert ProcessMesh.from_config(None, 4) == ProcessMesh(dp_replicate=4)  # DDP over every process
    assert ProcessMesh.from_config({"dp_shard": 2, "tp": 2}, 8) == ProcessMesh(dp_replicate=2, dp_shard=2, tp=2)
    with pytest.raises(ConfigError, match=r"parallel.tp=3: .* = 3 must divide the world size 4"):
        ProcessMesh.from_config({"tp": 3}, 4)
    with pytest.raises(ConfigError, match=r"parallel.dp_shard=3: .* = 6 must divide the world size 8"):
        ProcessMesh.from_config({"dp_shard": 3, "tp": 2}, 8)
    with pytest.raises(
        ConfigError, match=r"dp_replicate x parallel.dp_shard x parallel.tp = 2 must equal the world size 4"
    ):
        ProcessMesh.from_config({"dp_replicate": 1, "dp_shard": 2}, 4)
    with pytest.raises(ConfigError, match=r"parallel.pp=2: unknown key"):
        ProcessMesh.from_config({"pp": 2}, 2)
    with pytest.raises(ConfigError, match=r"parallel.tp=0: must be a positive integer"):
        ProcessMesh.from_config({"tp": 0}, 2)


def specs(*overrides: str):
    from zoo import compose
    from zoo.models.config import block_section, layer_specs, model_options

    raw = compose(["block.d_model=64", "block.n_heads=16", *overrides])
    options = model_options(raw)
    return layer_specs(block_section(raw), options["n_layers"], options["layers"], "model.layers")


@pytest.mark.parametrize(
    ("overrides", "tp", "message"),
    [
        ((), 3, r"parallel.tp=3: must divide block.n_heads=16 and the key/value heads"),
        (
            ("attn=mqa",),
            2,
            r"parallel.tp=2: must divide block.n_heads=16 and the key/value heads \(block.attn.n_kv_heads=1\)",
        ),
        (("block.d_ff=36",), 8, r"parallel.tp=8: must divide the MLP's hidden width 36"),
        (("model.vocab_size=100",), 8, r"parallel.tp=8: must divide model.vocab_size=100"),
        (("+model.layers.1.attn=mqa",), 2, r"n_kv_heads=1\): .* \(layer 1\)"),
    ],
)
def test_tensor_parallel_rules_name_the_key_and_the_rule(overrides, tp, message):
    from zoo import ConfigError, compose
    from zoo.lab.planning.mesh import ProcessMesh

    vocab = compose(list(overrides))["model"]["vocab_size"] if any("vocab" in o for o in overrides) else 256
    with pytest.raises(ConfigError, match=message):
        ProcessMesh(tp=tp).check_model(specs(*overrides), vocab)
    ProcessMesh(tp=1).check_model(specs(*overrides), vocab)  # no rule without tensor parallelism


def test_sequence_lengths_must_split_between_tp_ranks():
    from zoo import ConfigError
    from zoo.lab.planning.mesh import ProcessMesh

    with pytest.raises(ConfigError, match=r"parallel.tp=4: must divide the sequence length 30"):
        ProcessMesh(tp=4).check_model(specs(), 256, [32, 30])


#: Built-in parts with no tensor-parallel plan yet, each with why (refused by name under parallel.tp > 1).
WITHOUT_PLAN = {
    ("attn", "mamba2"): "its gated norm spans each group's heads and a group's heads share B and C: a plan splits "
    "whole groups, not written yet",
}


def test_every_built_in_part_has_a_plan_and_a_part_without_one_is_refused_by_name():
    from torch import nn

    from zoo import AXES, MLPS, resolve_block
    from zoo.assembly.compat import tp_refusal
    from zoo.core.tp import has_plan
    from zoo.parts.mlps import SwiGLU
    from zoo.testing.combos import block_config

    for axis, registry in AXES.items():
        for part in registry.parts():
            if part.origin == "built-in" and (axis, part.name) not in WITHOUT_PLAN:
                assert has_plan(part.cls), f"{axis}={part.name}"
    for (axis, name), why in WITHOUT_PLAN.items():  # each refused by name under tp, and only under tp
        assert not has_plan(AXES[axis].get(name).cls), f"{axis}={name} has a plan now: take it off WITHOUT_PLAN"
        combo = {"placement": "pre", "norm": "rmsnorm", axis: name, "pos": "none", "mlp": "gelu"}
        spec = resolve_block(block_config({"attn": "mha", **combo}))
        error = tp_refusal(spec, 2)
        assert error is not None and error.field == f"block.{axis}.name" and error.value == name, why
        assert "has no tensor-parallel plan" in str(error) and tp_refusal(spec, 1) is None

    @MLPS.register("mixture")
    class Mixture(SwiGLU):  # its own forward: SwiGLU's plan does not fit it
        def forward(self, x):
            return super().forward(x)

    class Plain(nn.Module):
        pass

    try:
        assert not has_plan(Mixture) and not has_plan(Plain)
        spec = resolve_block(
            block_config({"placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "none", "mlp": "mixture"})
        )
        error = tp_refusal(spec, 2)
        assert error is not None and error.field == "block.mlp.name" and error.value == "mixture"
        assert "has no tensor-parallel plan" in str(error) and "parallel.tp=2" in str(error)
        assert tp_refusal(spec, 1) is None
    finally:
        MLPS.unregister("mixture")


def test_a_mesh_that_does_not_fit_fails_the_run_before_any_tensor_work(tmp_path):
    summary = run(tiny("parallel.tp=2"), tmp_path)
    assert summary["status"] == "failed"
    assert (
        "parallel.dp_replicate x parallel.dp_shard x parallel.tp" in summary["error"]
        or "world size 1" in summary["error"]
    )
    assert "parameters" not in summary  # no model was built


def doc_launches() -> list[tuple[int, list[str]]]:
    """(world size, zoo.train overrides) of each torchrun command in a bash block of docs/scale.md,
    and of each run of each ``zoo-sweep`` command there (one per value of the swept axes)."""
    import re
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "scale.md").read_text()
    found = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE):
        words = shlex.split(block.replace("\\\n", " "))
        if "torchrun" in words:
            options = dict(w.removeprefix("--").split("=", 1) for w in words if w.startswith("--") and "=" in w)
            world = int(options.get("nnodes", 1)) * int(options["nproc_per_node"])
            found.append((world, words[words.index("zoo.train") + 1 :]))
        elif words and words[0] == "zoo-sweep":
            found += sweep_launches(words[1], words[2:])
    return found


def sweep_launches(name: str, words: list[str]) -> list[tuple[int, list[str]]]:
    """One (world size, overrides) per value of each axis ``sweeps/<name>.yaml`` sweeps."""
    import yaml

    from zoo import AXES
    from zoo.lab.commands.sweep import SWEEPS_DIR

    launcher = dict(w.removeprefix("hydra.launcher.").split("=", 1) for w in words if w.startswith("hydra.launcher."))
    world = int(launcher.get("nodes", 1)) * int(launcher["tasks_per_node"])
    fixed = [f"+sweeps={name}", *(w for w in words if not w.startswith("hydra"))]
    params = yaml.safe_load((SWEEPS_DIR / f"{name}.yaml").read_text())["hydra"]["sweeper"]["params"]
    runs = []
    for axis, values in params.items():
        if axis not in AXES:
            continue
        excluded = values.partition("exclude=")[2].rstrip(")").split(",") if "exclude=" in values else []
        names = AXES[axis].names() if values.startswith("glob(") else values.split(",")
        runs += [(world, [*fixed, f"{axis}={v}"]) for v in names if v not in excluded]
    return runs


@pytest.mark.parametrize(("world", "overrides"), doc_launches(), ids=lambda v: str(v) if isinstance(v, int) else "")
def test_the_cluster_commands_in_the_docs_fit_their_mesh(world, overrides):
    """docs/scale.md's commands compose as written and pass every check a run makes before any tensor
    work at their world size (the mesh, the parts' plans, divisibility); only device=cuda is swapped
    for cpu, as this machine has no GPU."""
    from omegaconf import OmegaConf

    from zoo import check_combination, compose
    from zoo.lab.planning.mesh import ProcessMesh
    from zoo.lab.planning.train_config import check_run_config
    from zoo.models.config import block_section, layer_specs, model_options

    composed = compose(overrides)
    assert check_combination(composed) is None
    raw = OmegaConf.to_container(composed, resolve=True)
    raw["device"] = "cpu"
    train_cfg, _ = check_run_config(raw)
    parallel = ProcessMesh.from_config(raw["parallel"], world)
    assert parallel.world == world and parallel.tp > 1 and parallel.dp_shard > 1
    options = model_options(raw)
    specs = layer_specs(block_section(raw), options["n_layers"], options["layers"], "model.layers")
    parallel.check_model(specs, options["vocab_size"], [raw["task"]["seq_len"]])
    assert train_cfg.eval_batches % parallel.dp == 0


def test_doc_launches_are_found():
    from zoo import MLPS

    worlds = [world for world, _ in doc_launches()]
    assert sorted(worlds) == [8] * len(MLPS.names()) + [16]  # one node, each MLP but moe swept at 8; two nodes
