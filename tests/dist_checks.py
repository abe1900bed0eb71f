"""Checks that run inside gloo processes on CPU (spawned by test_distributed.py): each compares a
sharded model with the same model in one process, computed on every rank from the same seed.

One launch runs several checks, so the processes start (and import torch) once per world size.
"""

from __future__ import annotations

import copy
import os
import socket
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from zoo import LanguageModel, resolve_block
from zoo.assembly.compat import tp_refusal
from zoo.lab.planning.mesh import ProcessMesh
from zoo.lab.records import checkpoint_writers as writers
from zoo.lab.training.scale import parallelize
from zoo.parts.attention import KVCache
from zoo.parts.gated_deltanet import DeltaState
from zoo.testing.combos import VOCAB, block_config, combo_id, context_of, covering_combinations, scramble


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, checks: list[tuple[str, Any]], out: Path) -> None:
    """Run each named check of this module (arguments: a tuple, or a dict of keywords) in ``world`` gloo
    processes; raise with every rank's failures."""
    import torch.multiprocessing as mp

    port = free_port()
    mp.start_processes(_worker, args=(world, port, checks, str(out)), nprocs=world, start_method="spawn", join=True)
    failures = [p.read_text() for p in sorted(out.glob("failed-*.txt"))]
    if failures:
        raise AssertionError("\n".join(failures))


def _worker(rank: int, world: int, port: int, checks: list[tuple[str, Any]], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for name, args in checks:
            try:
                CHECKS[name](**args) if isinstance(args, dict) else CHECKS[name](*args)
            except Exception:  # recorded, and the other checks still run (every rank runs the same)
                Path(out, f"failed-{name}-{rank}.txt").write_text(f"{name} rank {rank}:\n{traceback.format_exc()}")
            dist.barrier()
    finally:
        dist.destroy_process_group()


def tiny_model(
    combo: dict[str, str], n_layers: int = 2, model: dict[str, Any] | None = None, **overrides: Any
) -> LanguageModel:
    """A float64 model of ``combo``'s block (``overrides`` on it), with ``model``: LanguageModel's own options."""
    torch.manual_seed(0)
    model = LanguageModel(resolve_block(block_config(combo, **overrides)), VOCAB, n_layers, **(model or {})).double()
    scramble(model)
    return model


def full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: full(p.grad) for name, p in model.named_parameters()}


def check_tp_matches_one_process(tp: int, dp_shard: int = 1) -> None:
    """TP (x FSDP2) forward and backward of each covering combination equal one process (float64)."""
    parallel = ProcessMesh(dp_shard=dp_shard, tp=tp)
    mesh = parallel.mesh("cpu")
    checked = 0
    for combo in covering_combinations():
        if context_of(block_config(combo))[0] is None:
            continue  # parts that cannot be combined at all (refused with their reason)
        spec = resolve_block(block_config(combo))
        refusal = tp_refusal(spec, tp)
        if refusal is not None:
            # By design, without a plan: canon layers and the branch-output convolutions (a convolution over the
            # sequence), the value residual (its weights mix every key/value head, which no rank holds whole), a
            # qk-norm over all heads (the same), the norm's low-rank gate (not planned), Mamba-2 (its norm over each
            # group's heads: not planned)
            by_design = refusal.field in ("block.canon", "block.out_conv", "block.attn.value_residual",
                                          "block.attn.qk_norm_scope", "block.norm.gate_rank") or (
                refusal.field == "block.attn.name" and refusal.value == "mamba2")  # fmt: skip
            assert by_design or (refusal.field == "parallel.tp" and "n_kv_heads" in str(refusal)), (
                combo_id(combo),
                refusal,
            )
            continue
        one = tiny_model(combo)
        sharded = parallelize(copy.deepcopy(one), parallel, mesh)
        ids = torch.randint(0, VOCAB, (2 * parallel.dp, 8), generator=torch.Generator().manual_seed(1))
        mine = ids.chunk(parallel.dp)[parallel.dp_rank(dist.get_rank())]  # this rank's share of the batch
        weights = torch.linspace(-1, 1, VOCAB, dtype=torch.float64)
        expected = one(ids)
        (expected * weights).mean().backward()
        got = sharded(mine)
        (got * weights).mean().backward()  # FSDP averages gradients over dp: mean of means
        torch.testing.assert_close(got, expected.chunk(parallel.dp)[parallel.dp_rank(dist.get_rank())],
                                   rtol=1e-10, atol=1e-10, msg=lambda m, c=combo: f"{combo_id(c)}: {m}")  # fmt: skip
        want = grads(one)
        for name, g in grads(sharded).items():
            torch.testing.assert_close(g, want[name], rtol=1e-9, atol=1e-10,
                                       msg=lambda m, c=combo, n=name: f"{combo_id(c)} {n}: {m}")  # fmt: skip
        checked += 1
    assert checked >= len(covering_combinations()) // 2, checked


CHECKS: dict[str, Callable[..., None]] = {
    "tp": check_tp_matches_one_process,
}


STEPS = 3


def train_steps(model: torch.nn.Module, ids: torch.Tensor, steps: int = STEPS) -> list[float]:
    """``steps`` AdamW steps on next-token loss over ``ids`` (float64), with gradient clipping as in
    training; returns the losses (this rank's batch)."""
    from zoo.lab.planning.train_config import TrainConfig
    from zoo.lab.training.trainer import make_optimizer

    cfg = TrainConfig(lr=1e-2, grad_clip=0.5)
    optimizer = make_optimizer(model, cfg)
    losses = []
    for _ in range(steps):
        logits = model(ids[:, :-1])  # float64 throughout (training's loss_fn would round to float32)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), cfg.grad_clip, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


TRAIN_COMBO = {"placement": "pre", "norm": "rmsnorm", "attn": "gqa", "pos": "rotary", "mlp": "swiglu"}


def check_training_matches_one_process(
    dp_replicate: int = 1,
    dp_shard: int = 1,
    tp: int = 1,
    compile: bool = False,
    ac: bool = False,
    model: dict[str, Any] | None = None,
    **combo: str,
) -> None:
    """N steps of FSDP2 / HSDP / TP (compiled, checkpointed) training end with the parameters of the
    same N steps in one process over the whole batch (float64); the losses agree at every step. ``model``: the
    model's own options (an embedding norm, a logit cap)."""
    parallel = ProcessMesh(dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp)
    mesh = parallel.mesh("cpu")
    options = model
    model = tiny_model({**TRAIN_COMBO, **combo}, model=options, dropout=0.0)
    one = copy.deepcopy(model)
    ids = torch.randint(0, VOCAB, (2 * parallel.dp, 9), generator=torch.Generator().manual_seed(2))
    expected = train_steps(one, ids)
    model.checkpoint_blocks = ac
    parallelize(model, parallel, mesh, compile=compile, backend="aot_eager")
    mine = train_steps(model, ids.chunk(parallel.dp)[parallel.dp_rank(dist.get_rank())])
    means = torch.tensor(mine, dtype=torch.float64)
    dist.all_reduce(means)
    means /= dist.get_world_size()  # mean over ranks of the per-batch means = the whole batch's mean
    torch.testing.assert_close(means, torch.tensor(expected, dtype=torch.float64), rtol=1e-10, atol=1e-10)
    want = dict(one.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(
            full(p.detach()), want[name].detach(), rtol=1e-8, atol=1e-10, msg=lambda m, n=name: f"{n}: {m}"
        )


MUP_COMBO = {**TRAIN_COMBO, "pos": "learned"}  # a learned table too: every role but the untied readout


def check_mup_under_ddp(width: int = 32, base_width: int = 16) -> None:
    """param=mup under DDP (the trainer's wrapper for a world of replicas): the model is parametrized
    before it is wrapped and its optimizer built on the inner model (as zoo.lab.training.trainer does), so every
    rank ends N steps with the parameters of one process over the whole batch (float64)."""
    from torch.nn.parallel import DistributedDataParallel

    from zoo.assembly import mup
    from zoo.lab.planning.train_config import TrainConfig
    from zoo.lab.recipe.build import Recipe

    build = lambda w: LanguageModel(resolve_block(block_config(MUP_COMBO, d_model=w, d_ff=None)), VOCAB, 2)  # noqa: E731
    found = mup.infer(build, width, base_width)
    torch.manual_seed(0)
    model = build(width).double()
    scramble(model)
    mup.apply(model, found)
    one = copy.deepcopy(model)
    ids = torch.randint(0, VOCAB, (2 * dist.get_world_size(), 9), generator=torch.Generator().manual_seed(4))
    cfg = TrainConfig(lr=1e-2, grad_clip=0.5)
    losses: dict[str, list[float]] = {}
    for label, inner, forward, batch in (
        ("one", one, one, ids),
        ("ddp", model, DistributedDataParallel(model), ids.chunk(dist.get_world_size())[dist.get_rank()]),
    ):
        optimizer = Recipe().build(inner, cfg)
        assert len({g["lr"] for g in optimizer.param_groups}) > 1, "μP rates were not applied"
        losses[label] = train_loop(inner, forward, optimizer, batch, cfg.grad_clip)
    means = torch.tensor(losses["ddp"], dtype=torch.float64)
    dist.all_reduce(means)
    means /= dist.get_world_size()
    torch.testing.assert_close(means, torch.tensor(losses["one"], dtype=torch.float64), rtol=1e-10, atol=1e-10)
    want = dict(one.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(
            p.detach(), want[name].detach(), rtol=1e-8, atol=1e-10, msg=lambda m, n=name: f"{n}: {m}"
        )
    assert model.logit_scale == base_width / width and "head.weight" not in want  # tied head: logits scaled


def train_loop(
    model: torch.nn.Module, forward: torch.nn.Module, optimizer: Any, ids: torch.Tensor, clip: float
) -> list[float]:
    """:func:`train_steps` with its optimizer given and the forward through ``forward`` (a wrapper)."""
    losses = []
    for _ in range(STEPS):
        logits = forward(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), clip, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def check_generation_under_tp(tp: int) -> None:
    """Cached greedy generation with the model split over ``tp`` ranks (no sequence parallelism: each
    rank holds its heads' cache, or Gated DeltaNet's and KDA's state) gives the one-process tokens."""
    parallel = ProcessMesh(tp=tp)
    mesh = parallel.mesh("cpu")
    for pos in ("rotary", "alibi", "learned"):
        model = tiny_model({**TRAIN_COMBO, "pos": pos})
        one = copy.deepcopy(model)
        parallelize(model, parallel, mesh, sequence_parallel=False)
        prompt = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(3))
        expected = one.generate(prompt, 4)
        caches = model.new_caches(7)
        got = model.generate(prompt, 4)
        assert torch.equal(got, expected), (pos, got, expected)
        heads = model.blocks[0].attn.n_kv_heads // tp
        model.hidden_states(prompt, caches=caches)
        assert caches[0].mixer_state(KVCache).k.shape[1] == heads  # this rank's key/value heads only
    for mixer in ("gated_deltanet", "kda"):
        model = tiny_model({**TRAIN_COMBO, "attn": mixer})
        one = copy.deepcopy(model)
        parallelize(model, parallel, mesh, sequence_parallel=False)
        prompt = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(3))
        got = model.generate(prompt, 4)
        assert torch.equal(got, one.generate(prompt, 4)), (mixer, got)
        caches = model.new_caches(7)
        model.hidden_states(prompt, caches=caches)
        state, attn = caches[0].mixer_state(DeltaState), one.blocks[0].attn
        assert state.matrix.shape[1] == attn.n_heads // tp  # this rank's heads' matrices
        assert state.conv.shape[-1] == attn.channels // tp  # and their channels' last convolution inputs


def check_dcp_save(folder: str) -> None:
    """A sharded (FSDP2 over 2) run's checkpoint after one step, and the whole state it holds."""
    from zoo.lab.planning.train_config import TrainConfig
    from zoo.lab.records import checkpoint as ckpt
    from zoo.lab.training.trainer import make_optimizer

    parallel = ProcessMesh(dp_shard=dist.get_world_size())
    model = tiny_model(TRAIN_COMBO)
    parallelize(model, parallel, parallel.mesh("cpu"))
    train_steps(model, torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(dist.get_rank())), 1)
    optimizer = make_optimizer(model, TrainConfig())
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    optimizer.step()  # optimizer state to save too
    state = ckpt.TrainState(step=1)
    written = writers.save_sharded_checkpoint(Path(folder), state, model, optimizer, config_hash="h", world_size=2)
    whole = writers.full_state_dict(model)
    if dist.get_rank() == 0:
        save_file(whole, Path(folder) / "expected.safetensors")
        assert (written / ckpt.DCP).is_dir() and (written / ckpt.STATE).is_file()
        assert ckpt.verify_checkpoint(written) is None  # the manifest lists every dcp/ file with its sha256


def check_dcp_load(folder: str, tp: int = 1) -> None:
    """The checkpoint written by 2 processes loads at this world size and layout, model and optimizer."""
    from zoo.lab.planning.train_config import TrainConfig
    from zoo.lab.records import checkpoint as ckpt
    from zoo.lab.training.trainer import make_optimizer

    world = dist.get_world_size()
    parallel = ProcessMesh(dp_shard=world // tp, tp=tp)
    model = tiny_model(TRAIN_COMBO)
    torch.manual_seed(5)
    for p in model.parameters():  # not the saved values
        p.data.normal_()
    parallelize(model, parallel, parallel.mesh("cpu"))
    optimizer = make_optimizer(model, TrainConfig())
    latest = ckpt.latest_checkpoint(Path(folder))
    ckpt.check_checkpoint(latest, config_hash="h", world_size=world)  # another world size: allowed for DCP
    ckpt.read_model_optimizer(latest, model, optimizer, world_size=world)
    expected = load_file(Path(folder) / "expected.safetensors")
    got = writers.full_state_dict(model)
    if dist.get_rank() == 0:
        assert got.keys() == expected.keys()
        for name, value in expected.items():
            torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
    steps = {int(s["step"]) for s in optimizer.state.values()}
    assert steps == {1}, steps  # the saved optimizer had taken one step: its state came back


CHECKS.update(
    train=check_training_matches_one_process,
    mup_ddp=check_mup_under_ddp,
    generate=check_generation_under_tp,
    dcp_save=check_dcp_save,
    dcp_load=check_dcp_load,
)
