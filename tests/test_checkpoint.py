"""Final weights and training checkpoints: atomic, pruned, refused across configs, resumed to the last bit."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from test_train import tiny, without_timings

from zoo.lab import checkpoint as ckpt
from zoo.lab.records import config_hash, read_metrics, read_summary
from zoo.lab.train import run

# Checkpoints every 3 steps fall between log steps (every 4): the running loss sum must travel too.
# Dropout draws from torch's generator, the data from the run's own: both must be restored.
RESUMABLE = ("train.checkpoint_every=3", "train.keep_checkpoints=10", "block.dropout=0.1")


def interrupt(src, dst, at_step: int) -> None:
    """``dst``: ``src`` as a run killed after writing the checkpoint at ``at_step`` would leave it:
    later checkpoints gone, no final weights, summary ``running``, metrics past the checkpoint and a
    line cut short."""
    shutil.copytree(src, dst)
    for folder in ckpt.checkpoints(dst):
        if int(folder.name.removeprefix("step_")) > at_step:
            shutil.rmtree(folder)
    (dst / ckpt.WEIGHTS).unlink()
    summary = read_summary(dst)
    summary.update(status="running", final=None)
    (dst / "summary.json").write_text(json.dumps(summary))
    with open(dst / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 1')


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
        "model.safetensors",
        "optimizer.pt",
        "state.pt",
    ]
    state = ckpt.read_state(tmp_path / "checkpoints" / "step_000010")
    assert state["step"] == 10 and state["state"]["step"] == 10 and state["world_size"] == 1


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
    other = run(tiny(*RESUMABLE, "train.lr=1e-2"), tmp_path / "run")
    assert other["status"] == "failed" and other["error"].startswith("ConfigError: checkpoint=")
    mine, theirs = other["config_hash"], read_summary(tmp_path / "whole")["config_hash"]
    assert f"written by config {theirs}, this run's config is {mine}" in other["error"]
    assert [p.name for p in ckpt.checkpoints(tmp_path / "run")] == ["step_000003", "step_000006"]  # untouched
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
    from zoo.lab.report import markdown
    from zoo.lab.variants import build_report

    run(tiny(*RESUMABLE), tmp_path / "sweep" / "whole")
    interrupt(tmp_path / "sweep" / "whole", tmp_path / "sweep" / "resumed", 6)
    run(tiny(*RESUMABLE), tmp_path / "sweep" / "resumed")
    text = markdown(build_report(tmp_path / "sweep"))
    assert text.endswith("Resumed from a checkpoint:\n- resumed: from step 6\n") and "- whole" not in text
