"""Final weights and training checkpoints: atomic, pruned, refused across configs, resumed to the last bit,
checked against their manifests (with fallback), never unpickled."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest
import torch
from helpers import interrupt, tiny, without_timings
from safetensors.torch import load_file

import zoo
from zoo.lab import files
from zoo.lab.records import checkpoint as ckpt
from zoo.lab.records import checkpoint_writers as writers
from zoo.lab.records import state_tree
from zoo.lab.records.config import config_hash
from zoo.lab.records.metrics import read_metrics
from zoo.lab.records.summary import read_summary
from zoo.lab.training.run import run

# Checkpoints every 3 steps fall between log steps (every 4): the running loss sum must travel too.
# Dropout draws from torch's generator, the data from the run's own: both must be restored.
RESUMABLE = ("train.checkpoint_every=3", "train.keep_checkpoints=10", "block.dropout=0.1")


def test_run_saves_final_weights_that_rebuild_the_model(tmp_path):
    summary = run(tiny("preset=llama"), tmp_path)
    weights = load_file(tmp_path / ckpt.WEIGHTS)
    from zoo import build_model

    model = build_model(summary["config"])
    assert set(weights) == set(model.state_dict())  # the summary's config rebuilds exactly this model
    assert all(weights[k].shape == v.shape for k, v in model.state_dict().items())
    assert not torch.equal(weights["embed.weight"], model.state_dict()["embed.weight"])  # trained, not init
    none = run(tiny("train.save=none"), tmp_path / "none")
    assert none["status"] == "ok" and not (tmp_path / "none" / ckpt.WEIGHTS).exists()


def test_checkpoints_are_pruned_and_leave_no_temp_files(tmp_path):
    run(tiny("train.checkpoint_every=2", "train.keep_checkpoints=2"), tmp_path)
    assert [p.name for p in ckpt.checkpoints(tmp_path)] == ["step_000008", "step_000010"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000008", "step_000010"]
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "step_000010").iterdir()) == [
        "manifest.json",
        "model.safetensors",
        "optimizer.safetensors",
        "state.json",
        "state.safetensors",
    ]
    state = ckpt.read_state(tmp_path / "checkpoints" / "step_000010")
    assert state["step"] == 10 and state["state"]["step"] == 10 and state["world_size"] == 1
    assert not list(tmp_path.glob(".*")) and sorted(ckpt.read_manifest(tmp_path)) == [ckpt.WEIGHTS]


@pytest.mark.parametrize("at_step", [3, 6, 9])
def test_resumed_run_ends_with_the_uninterrupted_runs_numbers(tmp_path, at_step):
    whole = run(tiny(*RESUMABLE), tmp_path / "whole")
    assert whole["status"] == "ok" and whole["resumed_from"] == []
    interrupt(tmp_path / "whole", tmp_path / "resumed", at_step)
    resumed = run(tiny(*RESUMABLE), tmp_path / "resumed")
    assert resumed["status"] == "ok" and resumed["resumed_from"] == [at_step]
    assert resumed["final"] == whole["final"]  # to the last bit
    assert without_timings(read_metrics(tmp_path / "resumed")) == without_timings(read_metrics(tmp_path / "whole"))
    a, b = load_file(tmp_path / "whole" / ckpt.WEIGHTS), load_file(tmp_path / "resumed" / ckpt.WEIGHTS)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_moe_balanced_by_bias_resumes_to_the_last_bit(tmp_path):
    """block.mlp.balance=bias: the routing bias, nudged after every step, travels in the checkpoint's weights."""
    biased = tiny(*RESUMABLE, "mlp=moe", "block.mlp.n_experts=4", "block.mlp.balance=bias", "block.mlp.bias_rate=0.01")
    whole = run(biased, tmp_path / "whole")
    interrupt(tmp_path / "whole", tmp_path / "resumed", 6)
    resumed = run(biased, tmp_path / "resumed")
    assert resumed["status"] == "ok" and resumed["resumed_from"] == [6]
    assert resumed["final"] == whole["final"]  # to the last bit
    assert without_timings(read_metrics(tmp_path / "resumed")) == without_timings(read_metrics(tmp_path / "whole"))
    a, b = load_file(tmp_path / "whole" / ckpt.WEIGHTS), load_file(tmp_path / "resumed" / ckpt.WEIGHTS)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    saved = load_file(tmp_path / "whole" / "checkpoints" / "step_000006" / ckpt.WEIGHTS)
    assert saved["blocks.0.mlp.expert_bias"].abs().sum() > 0  # the checkpoint holds the bias as it was at step 6
    assert not torch.equal(saved["blocks.0.mlp.expert_bias"], a["blocks.0.mlp.expert_bias"])  # and it moved on


def test_a_run_resumed_twice_records_both_steps(tmp_path):
    run(tiny(*RESUMABLE), tmp_path / "whole")
    interrupt(tmp_path / "whole", tmp_path / "once", 3)
    run(tiny(*RESUMABLE), tmp_path / "once")
    interrupt(tmp_path / "once", tmp_path / "twice", 9)
    twice = run(tiny(*RESUMABLE), tmp_path / "twice")
    assert twice["resumed_from"] == [3, 9] and twice["final"] == read_summary(tmp_path / "whole")["final"]


def test_checkpoint_of_another_config_is_refused(tmp_path):
    run(tiny(*RESUMABLE), tmp_path / "whole")
    interrupt(tmp_path / "whole", tmp_path / "run", 6)
    files = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    other = run(tiny(*RESUMABLE, "train.lr=1e-2"), tmp_path / "run")
    assert other["status"] == "refused" and "holds a resumable run of another config" in other["error"]
    assert "train.lr: 0.003 there, 0.01 here" in other["error"], other["error"]
    assert {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == files  # untouched
    fresh = run(tiny(*RESUMABLE, "train.lr=1e-2"), tmp_path / "run", resume=False)  # asked to start over
    assert fresh["status"] == "ok" and fresh["resumed_from"] == []


def test_saving_and_checkpointing_keys_do_not_change_what_a_run_is():
    base = tiny()
    assert config_hash(base) == config_hash(
        tiny("train.save=none", "train.checkpoint_every=7", "train.keep_checkpoints=3")
    )
    assert config_hash(base) != config_hash(tiny("train.steps=13"))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.save=best", "train.save='best': final or none"),
        ("train.checkpoint_every=-1", "train.checkpoint_every=-1: must be >= 0"),
        ("train.keep_checkpoints=0", "train.keep_checkpoints=0: must be a positive integer"),
    ],
)
def test_bad_saving_options_are_config_errors(tmp_path, override, message):
    summary = run(tiny(override), tmp_path)
    assert summary["status"] == "failed" and message in summary["error"], summary["error"]


def test_the_report_says_which_runs_resumed_from_which_step(tmp_path):
    from zoo.lab.reports.sections import markdown
    from zoo.lab.studies.variants import build_report

    run(tiny(*RESUMABLE), tmp_path / "sweep" / "whole")
    interrupt(tmp_path / "sweep" / "whole", tmp_path / "sweep" / "resumed", 6)
    run(tiny(*RESUMABLE), tmp_path / "sweep" / "resumed")
    text = markdown(build_report(tmp_path / "sweep"))
    assert text.endswith("Resumed from a checkpoint:\n- resumed: from step 6\n") and "- whole" not in text


def test_state_round_trips_through_safetensors_and_json_exactly():
    """Optimizer state (int keys, tuples), generator states, non-finite floats: back as they were."""
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), betas=(0.9, 0.95))
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    value = {"optim": optimizer.state_dict(), "rng": torch.get_rng_state(), "x": [float("nan"), float("-inf"), 1 / 3]}
    tensors: dict = {}
    tree = json.loads(json.dumps(state_tree.to_tree(value, tensors), allow_nan=False))
    back = state_tree.from_tree(tree, tensors, ckpt.STATE)
    assert back["optim"]["param_groups"] == optimizer.state_dict()["param_groups"]  # betas a tuple again
    assert back["optim"]["state"].keys() == {0, 1}
    for key, state in optimizer.state_dict()["state"].items():
        assert all(torch.equal(state[k], back["optim"]["state"][key][k]) for k in state)
    assert torch.equal(back["rng"], value["rng"]) and back["x"][2] == 1 / 3 and str(back["x"][:2]) == "[nan, -inf]"
    with pytest.raises(TypeError, match="/a: a object is not saved"):
        state_tree.to_tree({"a": object()}, {})


def zero_bytes(path, n: int = 1000) -> None:
    """Zero ``n`` bytes in the middle of a file (same size, different content)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + n] = bytes(n)
    path.write_bytes(bytes(data))


CORRUPTIONS = {  # how a checkpoint's files are damaged, and what the log then says
    "garbage state": (lambda f: (f / ckpt.STATE).write_bytes(b"\x80garbage" * 50), "state.json"),
    "garbage weights": (lambda f: (f / ckpt.WEIGHTS).write_bytes(b"\x00garbage" * 50), "truncated"),
    "zeroed weights": (lambda f: zero_bytes(f / ckpt.WEIGHTS), "model.safetensors': altered: sha256"),
    "truncated optimizer": (
        lambda f: (f / ckpt.OPTIMIZER).write_bytes((f / ckpt.OPTIMIZER).read_bytes()[:-9]),
        "truncated",
    ),
    "no manifest": (lambda f: (f / ckpt.MANIFEST).unlink(), "manifest.json': missing"),
}


@pytest.mark.parametrize("damage", sorted(CORRUPTIONS))
def test_resume_falls_back_past_a_checkpoint_that_fails_its_check(tmp_path, damage, caplog):
    whole = run(tiny(*RESUMABLE), tmp_path / "whole")
    interrupt(tmp_path / "whole", tmp_path / "resumed", 9)
    corrupt, said = CORRUPTIONS[damage]
    corrupt(ckpt.step_dir(tmp_path / "resumed", 9))
    assert ckpt.verify_checkpoint(ckpt.step_dir(tmp_path / "resumed", 9)) is not None
    assert ckpt.verify_checkpoint(ckpt.step_dir(tmp_path / "resumed", 6)) is None
    with caplog.at_level("INFO", logger="zoo.lab.training.run"):
        resumed = run(tiny(*RESUMABLE), tmp_path / "resumed")
    assert resumed["status"] == "ok" and resumed["resumed_from"] == [6], resumed.get("error")
    assert list(resumed["resume_skipped"]) == ["step_000009"] and said in resumed["resume_skipped"]["step_000009"]
    assert "resumed from step_000006 (newer ones failed their check: step_000009)" in caplog.text
    assert f"not resuming from step_000009: {resumed['resume_skipped']['step_000009']}" in caplog.text
    assert resumed["final"] == whole["final"]  # to the last bit
    assert without_timings(read_metrics(tmp_path / "resumed")) == without_timings(read_metrics(tmp_path / "whole"))
    a, b = load_file(tmp_path / "whole" / ckpt.WEIGHTS), load_file(tmp_path / "resumed" / ckpt.WEIGHTS)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(ckpt.verify_checkpoint(f) is None for f in ckpt.checkpoints(tmp_path / "resumed"))  # rewritten


def test_with_no_intact_checkpoint_the_run_starts_over_and_says_so(tmp_path, caplog):
    whole = run(tiny(*RESUMABLE), tmp_path / "whole")
    interrupt(tmp_path / "whole", tmp_path / "resumed", 6)
    for folder in ckpt.checkpoints(tmp_path / "resumed"):
        zero_bytes(folder / ckpt.WEIGHTS)
    with caplog.at_level("INFO", logger="zoo.lab.training.run"):
        resumed = run(tiny(*RESUMABLE), tmp_path / "resumed")
    assert resumed["status"] == "ok" and resumed["resumed_from"] == []
    assert sorted(resumed["resume_skipped"]) == ["step_000003", "step_000006"]
    assert "no intact checkpoint: training from step 0" in caplog.text and "resumed from" not in caplog.text
    assert resumed["final"] == whole["final"]
    assert without_timings(read_metrics(tmp_path / "resumed")) == without_timings(read_metrics(tmp_path / "whole"))


class Payload:
    """Unpickling this creates ``marker``: what a planted pickle could do instead."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_planted_pickle_is_never_unpickled_on_resume(tmp_path):
    """A pickle planted in a single-process run's checkpoints (dcp/.metadata, format 1's state.pt) does
    not run: resuming reads only safetensors and JSON, and a DCP checkpoint only with several processes."""
    marker, payload = tmp_path / "pwned", pickle.dumps(Payload(tmp_path / "pwned"))
    pickle.loads(payload)  # the payload works: loading it once creates the marker
    assert marker.exists()
    marker.unlink()
    whole = run(tiny(*RESUMABLE), tmp_path / "whole")
    interrupt(tmp_path / "whole", tmp_path / "run", 9)
    nine, six = ckpt.step_dir(tmp_path / "run", 9), ckpt.step_dir(tmp_path / "run", 6)
    (nine / ckpt.DCP).mkdir()
    (nine / ckpt.DCP / ".metadata").write_bytes(payload)  # beside intact files: never looked at
    (six / ckpt.MANIFEST).unlink()  # step 6: as format 1 wrote it (pickles, no manifest)
    for name in ckpt.LEGACY:
        (six / name).write_bytes(payload)
    resumed = run(tiny(*RESUMABLE), tmp_path / "run")
    assert resumed["status"] == "ok" and resumed["resumed_from"] == [9] and resumed["final"] == whole["final"]
    assert not marker.exists()
    interrupt(tmp_path / "whole", tmp_path / "old", 6)  # only format 1 checkpoints left: start over
    for folder in ckpt.checkpoints(tmp_path / "old"):
        for name in ckpt.LEGACY:
            (folder / name).write_bytes(payload)
        (folder / ckpt.MANIFEST).unlink()
    old = run(tiny(*RESUMABLE), tmp_path / "old")
    assert old["status"] == "ok" and old["resumed_from"] == [] and old["final"] == whole["final"]
    assert "format 1 (state.pt and optimizer.pt are pickles" in old["resume_skipped"]["step_000006"]
    assert not marker.exists()


def test_a_checkpoint_that_says_it_is_sharded_is_refused_by_one_process(tmp_path):
    """Even with a manifest that lists the planted dcp/.metadata: one process never reads DCP."""
    marker, payload = tmp_path / "pwned", pickle.dumps(Payload(tmp_path / "pwned"))
    run(tiny(*RESUMABLE), tmp_path / "whole")
    interrupt(tmp_path / "whole", tmp_path / "run", 9)
    nine = ckpt.step_dir(tmp_path / "run", 9)
    (nine / ckpt.DCP).mkdir()
    (nine / ckpt.DCP / ".metadata").write_bytes(payload)
    state = json.loads((nine / ckpt.STATE).read_text())
    files = {ckpt.STATE: json.dumps({**state, "sharded": True}).encode(), ckpt.STATE_TENSORS: b""}
    files[ckpt.STATE_TENSORS] = (nine / ckpt.STATE_TENSORS).read_bytes()
    ckpt.write_files(nine, files, more={"dcp/.metadata": ckpt.file_entry(nine / ckpt.DCP / ".metadata")})
    assert ckpt.verify_checkpoint(nine) is None  # consistent: only the world size refuses it
    refused = run(tiny(*RESUMABLE), tmp_path / "run")
    assert (
        refused["status"] == "failed" and "sharded (dcp/, written by 1 processes), which only a run" in refused["error"]
    )
    assert not marker.exists() and (nine / ckpt.DCP / ".metadata").exists()  # refused, not deleted
    model = zoo.build_model(refused["config"])
    with pytest.raises(ckpt.CheckpointMismatch, match="read only by several processes"):
        ckpt.read_model_optimizer(nine, model, torch.optim.AdamW(model.parameters()), world_size=1)
    assert not marker.exists()


def test_old_final_weights_load_with_a_warning_and_old_state_is_never_read(tmp_path, caplog):
    from safetensors.torch import save_file

    summary = run(tiny(), tmp_path)
    tensors = load_file(tmp_path / ckpt.WEIGHTS)
    (tmp_path / ckpt.MANIFEST).unlink()
    with pytest.raises(ckpt.IntegrityError, match="no manifest.json beside it, though its format 2 writes one"):
        zoo.load_run(tmp_path)
    save_file(tensors, tmp_path / ckpt.WEIGHTS, metadata={"config_hash": summary["config_hash"], "step": "10"})
    with caplog.at_level("WARNING"):
        model, _ = zoo.load_run(tmp_path)  # written before manifests: loads, unverified
    assert "model.safetensors: written before checksums (no manifest.json beside it): loaded unverified" in caplog.text
    assert torch.equal(model.state_dict()["embed.weight"], tensors["embed.weight"])


def test_no_single_process_path_unpickles():
    """No torch.load, torch.save or pickle anywhere in zoo; DCP (whose metadata torch unpickles) is read in
    one place, which one process never reaches."""
    sources = {p: p.read_text() for p in Path(zoo.__file__).parent.rglob("*.py")}
    banned = re.compile(r"torch\.(load|save)\(|\bimport pickle|from pickle|pickle\.loads?\(|weights_only|dcp\.load\(")
    for path, text in sources.items():
        found = (
            banned.findall(text.replace("dcp.load(state", "")) if path.name == "checkpoint.py" else banned.findall(text)
        )
        assert not found, f"{path}: {found}"
    text = sources[Path(ckpt.__file__)]
    assert text.count("dcp.load(") == 1 and text.count("read_sharded(") == 2  # its def, and one call
    call = text.index("read_sharded(folder / DCP")
    assert "if world_size == 1:\n            raise CheckpointMismatch" in text[call - 300 : call]


def test_a_checkpoint_appears_only_with_its_manifest_written_after_its_files(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    state = ckpt.TrainState(step=4, ranks=[{"rng": {"torch": torch.get_rng_state()}}])
    order = []
    real_write = files.write_atomic
    for module in (ckpt, files):  # the checkpoint's files, and the manifest (files.write_json_atomic)
        monkeypatch.setattr(
            module, "write_atomic", lambda path, data: (order.append(path.name), real_write(path, data))
        )
    written = ckpt.save_checkpoint(tmp_path, state, model, optimizer, config_hash="h")
    assert order[-1] == ckpt.MANIFEST and set(order[:-1]) == set(ckpt.read_manifest(written))
    assert ckpt.verify_checkpoint(written) is None

    def fail(folder, files):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "write_manifest", fail)  # killed before the manifest: no checkpoint at all
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(tmp_path, ckpt.TrainState(step=8), model, optimizer, config_hash="h")
    assert [p.name for p in (tmp_path / ckpt.CHECKPOINTS).iterdir()] == ["step_000004"]


def test_plain_and_sharded_checkpoints_share_their_state_manifest_and_pruning(tmp_path):
    """Both writers finish a checkpoint the same way: the same state.json (but for the optimizer, which DCP
    holds), a manifest of every file, the temp folder renamed into place, only the last ``keep`` kept."""
    import torch.distributed as dist

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    dist.init_process_group("gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1)
    try:
        for step in (2, 4, 6):
            state = ckpt.TrainState(step=step, loop={"first_loss": 1.5}, ranks=[{"rng": torch.get_rng_state()}])
            for folder, save in (("plain", ckpt.save_checkpoint), ("sharded", writers.save_sharded_checkpoint)):
                save(tmp_path / folder, state, model, optimizer, config_hash="h", world_size=1, keep=2)
    finally:
        dist.destroy_process_group()
    saved = {}
    for folder in ("plain", "sharded"):
        root = tmp_path / folder / ckpt.CHECKPOINTS
        assert sorted(p.name for p in root.iterdir()) == ["step_000004", "step_000006"]  # pruned, no temp left
        latest = ckpt.latest_checkpoint(tmp_path / folder)
        listed = ckpt.read_manifest(latest)
        on_disk = {p.relative_to(latest).as_posix() for p in latest.rglob("*") if p.is_file()} - {ckpt.MANIFEST}
        assert set(listed) == on_disk and {ckpt.STATE, ckpt.STATE_TENSORS} <= on_disk
        saved[folder] = json.loads((latest / ckpt.STATE).read_text())
    assert any(name.startswith(f"{ckpt.DCP}/") for name in ckpt.read_manifest(latest))
    plain, sharded = saved["plain"], saved["sharded"]
    assert plain.pop("optimizer") and plain == {**sharded, "sharded": False} and sharded["sharded"] is True
    assert plain["step"] == 6 and plain["config_hash"] == "h" and plain["world_size"] == 1
    assert ckpt.verify_checkpoint(ckpt.latest_checkpoint(tmp_path / "plain")) is None
