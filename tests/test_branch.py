"""Branches (``train.branch.from=DIR train.branch.step=N``): a run continued from another run's checkpoint
under its own steps and schedule is that run's continuation to the last bit (the WSD budgets from one run),
records where it came from, and refuses, before any model is built, a source it cannot continue."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import torch
from helpers import fake_run, interrupt, tiny, without_timings
from safetensors.torch import load_file

from zoo.lab.commands.report import main as report_main
from zoo.lab.records import checkpoint as ckpt
from zoo.lab.records.checkpoint import WEIGHTS
from zoo.lab.records.config import config_hash
from zoo.lab.records.metrics import read_metrics
from zoo.lab.records.state_tree import tensor_bytes
from zoo.lab.studies.runset import UNSET
from zoo.lab.studies.variants import build_report
from zoo.lab.training.run import run

#: A WSD run whose checkpoints (every 3 steps, all kept) lie in its stable phase up to step 9 at 12 steps.
WSD = ("schedule=wsd", "train.checkpoint_every=3", "train.keep_checkpoints=10", "block.dropout=0.1")


def branch(source, step: int, *overrides: str) -> dict:
    return tiny(*WSD, f"train.branch.from={source}", f"train.branch.step={step}", *overrides)


def same_weights(a, b) -> bool:
    x, y = load_file(a / WEIGHTS), load_file(b / WEIGHTS)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 12-step WSD run (the direct run), and a 24-step one (the long stable run to branch from)."""
    root = tmp_path_factory.mktemp("branch")
    for steps in (12, 24):
        done = run(tiny(*WSD, f"train.steps={steps}"), root / f"wsd{steps}")
        assert done["status"] == "ok", done["error"]
    return root


@pytest.mark.parametrize("source_steps", [12, 24])
def test_a_branch_from_the_stable_phase_is_the_direct_run_to_the_last_bit(runs, tmp_path, source_steps):
    """Branched at step 9 of a WSD run of 12 or 24 steps (both at the peak rate up to step 9) and decayed to
    12 steps: the 12-step run's metrics, curve and weights, bit for bit."""
    direct = runs / "wsd12"
    source = runs / f"wsd{source_steps}"
    done = run(branch(source, 9, "train.steps=12"), tmp_path / "branch")
    assert done["status"] == "ok", done["error"]
    whole = run(tiny(*WSD, "train.steps=12"), direct)  # skipped as done: its summary
    assert done["final"] == whole["final"] and done["steps"] == 12
    assert without_timings(read_metrics(tmp_path / "branch")) == without_timings(read_metrics(direct))
    assert same_weights(tmp_path / "branch", direct)
    checksum = hashlib.sha256((source / "checkpoints" / "step_000009" / "manifest.json").read_bytes()).hexdigest()
    identity = {"config_hash": config_hash(run_config(source)), "step": 9, "checksum": checksum}
    assert done["branch"] == {"from": str(source.absolute()), **identity}
    assert done["resumed_from"] == []  # a branch's start is not a resume
    assert done["config_hash"] != whole["config_hash"]  # another run than the direct one (it started elsewhere)


def run_config(folder) -> dict:
    import json

    return json.loads((folder / "summary.json").read_text())["config"]


def test_a_branch_with_its_own_decay_differs_from_its_source_after_the_branch_step_only(runs, tmp_path):
    """Decayed over 6 steps from step 9 of the 24-step run: the source's curve up to step 9, then its own."""
    done = run(branch(runs / "wsd24", 9, "train.steps=15", "schedule.decay_fraction=0.4"), tmp_path / "b")
    assert done["status"] == "ok", done["error"]
    mine, theirs = read_metrics(tmp_path / "b"), read_metrics(runs / "wsd24")
    upto = [r for r in theirs if r["step"] <= 9]
    assert without_timings(mine[: len(upto)]) == without_timings(upto)
    after = [r for r in mine if r["kind"] == "train" and r["step"] > 9]
    assert after and all(r["lr"] < 3e-3 for r in after)  # decaying (train.lr's default peak is 3e-3)
    source_lr = {r["step"]: r["lr"] for r in theirs if r["kind"] == "train"}
    assert source_lr[12] == 3e-3  # where the source stayed at the peak


def test_a_killed_branch_resumes_from_its_own_checkpoint(runs, tmp_path):
    whole = run(branch(runs / "wsd24", 6, "train.steps=12"), tmp_path / "whole")
    assert whole["status"] == "ok", whole["error"]
    interrupt(tmp_path / "whole", tmp_path / "resumed", 9)
    resumed = run(branch(runs / "wsd24", 6, "train.steps=12"), tmp_path / "resumed")
    assert resumed["status"] == "ok" and resumed["resumed_from"] == [9]  # the branch's start (6) is not a resume
    assert resumed["branch"]["step"] == 6
    assert resumed["final"] == whole["final"] and same_weights(tmp_path / "whole", tmp_path / "resumed")
    assert without_timings(read_metrics(tmp_path / "resumed")) == without_timings(read_metrics(tmp_path / "whole"))


def test_a_source_and_its_branch_moved_together_are_done_and_resume(runs, tmp_path, monkeypatch):
    """A branch is named by its source's config hash, step and checkpoint checksum, not by the path's spelling:
    moved with its source (and named from another working folder) it is already done, and a killed one resumes."""
    first = tmp_path / "first"
    shutil.copytree(runs / "wsd24", first / "wsd24")
    done = run(branch(first / "wsd24", 6, "train.steps=12"), first / "branch")
    assert done["status"] == "ok", done["error"]
    moved = tmp_path / "elsewhere" / "moved"
    shutil.move(first, moved)
    monkeypatch.chdir(moved)
    before = {p: p.read_bytes() for p in (moved / "branch").rglob("*") if p.is_file()}
    again = run(branch("wsd24", 6, "train.steps=12"), moved / "branch")  # relative now, another folder
    assert again["status"] == "ok" and again["final"] == done["final"]
    assert {p: p.read_bytes() for p in (moved / "branch").rglob("*") if p.is_file()} == before  # skipped as done
    interrupt(moved / "branch", moved / "killed", 9)
    resumed = run(branch("wsd24", 6, "train.steps=12"), moved / "killed")
    assert resumed["status"] == "ok" and resumed["resumed_from"] == [9] and resumed["final"] == done["final"]
    assert same_weights(moved / "branch", moved / "killed")


def test_a_branch_folder_of_another_start_is_refused_untouched(runs, tmp_path):
    done = run(branch(runs / "wsd24", 6, "train.steps=12"), tmp_path / "branch")
    assert done["status"] == "ok", done["error"]
    before = {p: p.read_bytes() for p in (tmp_path / "branch").rglob("*") if p.is_file()}
    other = run(branch(runs / "wsd24", 3, "train.steps=12"), tmp_path / "branch")
    assert other["status"] == "refused" and "another config" in other["error"], other
    assert "train.branch.step: 6 there, 3 here" in other["error"]
    assert {p: p.read_bytes() for p in (tmp_path / "branch").rglob("*") if p.is_file()} == before


def retrained(checkpoint) -> None:
    """The checkpoint as another training of its run would leave it: other weights, its manifest agreeing."""
    weights, meta = ckpt.read_weights(checkpoint / WEIGHTS)
    first = next(iter(weights))
    weights[first] = weights[first] + 1e-3
    ckpt.write_files(checkpoint, {WEIGHTS: tensor_bytes(weights, meta)}, ckpt.read_manifest(checkpoint))


def test_a_finished_branch_rerun_from_another_start_of_the_same_config_is_refused_untouched(runs, tmp_path):
    """The branch's config hash leaves out where its source lies: the same config branched from another
    run of the source's config but for its steps, or from a retrained checkpoint of the same run, is not the
    finished branch (its start differs) and is refused, never skipped as done."""
    shutil.copytree(runs / "wsd24", tmp_path / "src")
    done = run(branch(tmp_path / "src", 6, "train.steps=12"), tmp_path / "branch")
    assert done["status"] == "ok", done["error"]
    before = {p: p.read_bytes() for p in (tmp_path / "branch").rglob("*") if p.is_file()}
    shutil.rmtree(tmp_path / "src")
    shutil.copytree(runs / "wsd12", tmp_path / "src")  # another source run: its config hash and checkpoint differ
    other = run(branch(tmp_path / "src", 6, "train.steps=12"), tmp_path / "branch")  # the same config, path too
    assert other["status"] == "refused", other
    assert "branched from another start" in other["error"]
    shutil.rmtree(tmp_path / "src")
    shutil.copytree(runs / "wsd24", tmp_path / "src")
    retrained(tmp_path / "src" / "checkpoints" / "step_000006")  # the same source run, another checkpoint
    again = run(branch(tmp_path / "src", 6, "train.steps=12"), tmp_path / "branch")
    assert again["status"] == "refused" and "branched from another start" in again["error"], again
    assert {p: p.read_bytes() for p in (tmp_path / "branch").rglob("*") if p.is_file()} == before


def test_the_branch_keys_leave_the_config_hash_of_other_runs_as_it_was():
    cfg = tiny()
    assert cfg["train"]["branch"] == {"from": None, "step": None}
    before = {**cfg, "train": {k: v for k, v in cfg["train"].items() if k != "branch"}}
    assert config_hash(cfg) == config_hash(before)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("from=NOWHERE", "step=9"), "NOWHERE': a run folder (summary.json, checkpoints/): not a folder"),
        (("from=EMPTY", "step=9"), "a run folder (summary.json, checkpoints/): no summary.json"),
        (("from=wsd24", "step=5"), "train.branch.step=5: the step of an intact checkpoint of "),
        (("from=wsd24", "step=12"), "train.branch.step=12: in 1..11: below train.steps=12"),
        (("from=wsd24",), "train.branch.from="),
        (("step=decay",), "train.branch.step='decay': needs train.branch.from too"),
        (
            ("from=wsd24", "step=last"),
            "train.branch.step='last': the step of one of train.branch.from's checkpoints (an integer), or decay",
        ),
        (("from=wsd24", "step=9", "block.d_ff=64"), "it differs in block.d_ff: None there, 64 here"),
        (("from=wsd24", "step=9", "seed=1"), "it differs in seed: 0 there, 1 here"),
        (("from=wsd24", "step=9", "optim=sgd"), "it differs in optim.dampening"),
        (("from=wsd24", "step=9", "train.lr=0.01"), "it differs in train.lr: 0.003 there, 0.01 here"),
        (("from=wsd24", "step=9", "schedule=cosine"), "train.branch.step=9: a checkpoint of "),
        (("from=wsd24", "step=9", "train.warmup_steps=4"), "at step 0 it trained at lr 0.001, this run's"),
        (("from=wsd24", "step=9", "train.budget.tokens=2000"), "train.budget="),
    ],
)
def test_a_branch_it_cannot_continue_is_refused_before_any_model_is_built(runs, tmp_path, overrides, message):
    (tmp_path / "EMPTY").mkdir()
    keys = []
    for o in overrides:
        key, value = o.split("=", 1)
        if key in ("from", "step"):
            value = {"NOWHERE": str(tmp_path / "NOWHERE"), "EMPTY": str(tmp_path / "EMPTY")}.get(value) or (
                str(runs / value) if key == "from" else value
            )
            key = f"train.branch.{key}"
        keys.append(f"{key}={value}")
    done = run(tiny(*WSD, *keys), tmp_path / "run")
    assert done["status"] == "failed" and message in done["error"], done["error"]
    assert "parameters" not in done  # refused before the model was built


def test_a_checkpoint_inside_the_decay_is_refused_naming_where_it_starts(runs, tmp_path):
    """At decay_fraction=0.5 the 12-step run decays from step 6 (its rate first below the peak at step 7): its
    step-9 checkpoint is inside the decay, and a longer branch would not continue it."""
    src = run(tiny(*WSD, "schedule.decay_fraction=0.5"), tmp_path / "src")
    assert src["status"] == "ok", src["error"]
    done = run(branch(tmp_path / "src", 9, "train.steps=24", "schedule.decay_fraction=0.5"), tmp_path / "b")
    assert done["status"] == "failed" and "parameters" not in done
    assert "at step 7 it trained at lr" in done["error"] and "its decay starts at step 6" in done["error"]
    last = run(branch(tmp_path / "src", 6, "train.steps=16", "schedule.decay_fraction=0.25"), tmp_path / "ok")
    assert last["status"] == "ok", last["error"]  # its last stable checkpoint: steps 0-5 trained as 16 steps' do


def test_a_damaged_checkpoint_is_not_branched_from(runs, tmp_path):
    import shutil

    shutil.copytree(runs / "wsd24", tmp_path / "src")
    victim = tmp_path / "src" / "checkpoints" / "step_000009" / "optimizer.safetensors"
    victim.write_bytes(victim.read_bytes()[:-8])
    done = run(branch(tmp_path / "src", 9, "train.steps=12"), tmp_path / "b")
    assert done["status"] == "failed" and "train.branch.step=9: the step of an intact checkpoint" in done["error"]
    assert "3, 6, 12, 15, 18, 21" in done["error"]


def test_the_report_pairs_branches_of_each_seeds_own_source_run_by_seed(tmp_path):
    """Each seed branches from its own long run: the source folder is not an axis, the branch step is (a run that
    is not a branch reads ``unset`` for it)."""
    for seed in range(3):
        fake_run(tmp_path, ["schedule=cosine", f"seed={seed}"], value=3.0 + 0.01 * seed)
        source = f"train.branch.from=runs/long{seed}"
        fake_run(tmp_path, ["schedule=wsd", source, "train.branch.step=80", f"seed={seed}"], value=2.9 + 0.01 * seed)
    report = build_report(tmp_path)
    assert report.axes == ["schedule", "train.branch.step"] and len(report.variants) == 2
    wsd = report.variant(("wsd", "80"))
    assert wsd is not None and len(wsd.by_seed("val_bpb")) == 3
    assert sorted(v.key for v in report.variants) == [("cosine", UNSET), ("wsd", "80")]


def test_a_partial_baseline_completes_from_the_runs_it_names(tmp_path, capsys):
    """``--baseline schedule=cosine`` in a sweep whose first job is a branch: the cosine runs' own branch step
    (``unset``), not the first job's (``20``, which no cosine run has: nothing to compare with)."""
    for seed in range(3):
        for job, step in enumerate((20, 40)):
            fake_run(tmp_path, ["schedule=wsd", f"train.branch.from=runs/long{seed}", f"train.branch.step={step}",
                                f"seed={seed}"], value=2.9 + 0.01 * seed + 0.2 * job, job=3 * seed + job)  # fmt: skip
        fake_run(tmp_path, ["schedule=cosine", f"seed={seed}"], value=3.0 + 0.02 * seed, job=3 * seed + 2)
    assert build_report(tmp_path).baseline == ("wsd", "20")  # job 0's values by default
    report = build_report(tmp_path, baseline={"schedule": "cosine"})
    assert report.baseline == ("cosine", UNSET)
    assert {report.label(k): c.verdict for k, c in report.comparisons.items()} == {
        "schedule=wsd train.branch.step=20": "better", "schedule=wsd train.branch.step=40": "worse"}  # fmt: skip
    report_main([str(tmp_path), "--no-plots", "--baseline", "schedule=cosine"])
    text = (tmp_path / "report.md").read_text()
    assert "nothing to compare with" not in text and "| cosine | unset |" in text
    assert "baseline schedule=cosine train.branch.step=unset" in text


def test_a_branch_from_a_sweep_folder_at_its_decay_finds_its_source_run(runs, tmp_path):
    """``train.branch.from=<sweep folder> train.branch.step=decay`` (a ladder's budgets): the one run there of
    this config but for its steps, branched where this run's decay starts (15 steps: step 12), as if named."""
    sweep = tmp_path / "sweep"
    shutil.copytree(runs / "wsd24", sweep / "wsd24")
    found = run(branch(sweep, "decay", "train.steps=15"), tmp_path / "found")
    assert found["status"] == "ok", found["error"]
    assert found["config"]["train"]["branch"] == {"from": str(sweep / "wsd24"), "step": 12}
    named = run(branch(runs / "wsd24", 12, "train.steps=15"), tmp_path / "named")
    assert found["final"] == named["final"] and found["branch"]["checksum"] == named["branch"]["checksum"]
    two = run(branch(runs, "decay", "train.steps=15"), tmp_path / "two")  # wsd12 and wsd24 both match
    assert two["status"] == "failed" and "it holds 2 runs (wsd12, wsd24)" in two["error"]
    none = run(branch(sweep, "decay", "train.steps=15", "mlp=swiglu"), tmp_path / "none")
    assert none["status"] == "failed" and "it holds no finished run" in none["error"]
    cosine = tiny("train.checkpoint_every=3", "train.keep_checkpoints=10", "block.dropout=0.1",
                  f"train.branch.from={sweep}", "train.branch.step=decay", "train.steps=15")  # fmt: skip
    refused = run(cosine, tmp_path / "cosine")
    assert refused["status"] == "failed"
    assert "train.branch.step='decay': a WSD schedule's decay start" in refused["error"]
