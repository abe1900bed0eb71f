"""Fair comparisons end to end: compute-matched budgets (train.budget) and a learning rate per variant (tune.lr)."""

from __future__ import annotations

import csv
import json
import math

import pytest
from helpers import folder_bytes, tiny, zoo_cli
from matplotlib.image import imread

from zoo.core.errors import ConfigError
from zoo.lab.planning.train_config import TrainConfig
from zoo.lab.records.summary import read_summary
from zoo.lab.training.run import run

TOKENS_PER_STEP = 4 * 32  # tiny(): batch_size 4 x seq_len 32


def test_a_token_budget_sets_the_steps(tmp_path):
    summary = run(tiny("train.budget.tokens=1000"), tmp_path)
    assert summary["status"] == "ok"
    assert summary["steps"] == 1000 // TOKENS_PER_STEP == 7  # the most whole steps within the budget
    assert summary["budget"] == {"kind": "tokens", "value": 1000.0, "steps": 7, "tokens_per_step": TOKENS_PER_STEP,
                                 "flops_per_token": summary["flops_per_token"]}  # fmt: skip
    assert summary["flops"] == 7 * TOKENS_PER_STEP * summary["flops_per_token"]


def test_a_flops_budget_gives_costlier_variants_fewer_steps_and_the_same_compute(tmp_path):
    flops = 4e8
    cheap = run(tiny("train.budget.flops=4e8", "model.n_layers=1"), tmp_path / "cheap")
    dear = run(tiny("train.budget.flops=4e8", "model.n_layers=3"), tmp_path / "dear")
    assert cheap["flops_per_token"] < dear["flops_per_token"]
    for s in (cheap, dear):
        per_step = TOKENS_PER_STEP * s["flops_per_token"]
        assert s["steps"] == math.floor(flops / per_step) and s["flops"] <= flops < s["flops"] + per_step
    assert cheap["steps"] > dear["steps"]


@pytest.mark.parametrize(
    ("budget", "message"),
    [({"tokens": 100, "flops": 1e9}, "one of tokens or flops"), ({"tokens": -5}, "train.budget.tokens=-5"),
     ({"steps": 5}, "train.budget.steps=5: unknown key")],
)  # fmt: skip
def test_bad_budgets_are_refused(budget, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig.from_config({"budget": budget})


def test_tune_lr_needs_a_sweep(tmp_path):
    summary = run(tiny("tune.lr=[1e-3,1e-2]"), tmp_path)
    assert summary["status"] == "failed" and "tunes a sweep" in summary["error"]


def test_a_finished_tuned_run_is_known_before_its_tuning_and_no_failed_tuning_writes_it(tmp_path):
    """A rerun with the same tune.lr skips a finished tuned run without reading the tuning runs (gone here); a
    rerun whose tuning finishes no rate (tune.lr=[1000.0]) is refused and writes nothing, and the next plain
    rerun skips the run again instead of training it anew."""
    tune_dir, out, rate = tmp_path / "tune", tmp_path / "run", 3e-3
    assert run(tiny(f"train.lr={rate}"), tune_dir / "lr", multirun=True)["status"] == "ok"  # its one tuning run
    tuned = tiny(f"tune.lr=[{rate}]", "seed=1")
    assert run(tuned, out, multirun=True, tune_dir=tune_dir)["status"] == "ok"
    first = read_summary(out)  # as a skipped run returns it
    assert first["tune"]["lr"] == first["config"]["train"]["lr"] == rate
    before = folder_bytes(out)
    assert run(tuned, out, multirun=True, tune_dir=tmp_path / "gone") == first  # skipped, untouched
    other = run(tiny("tune.lr=[1000.0]", "seed=1"), out, multirun=True, tune_dir=tune_dir)
    assert other["status"] == "refused" and "holds a finished run (status ok)" in other["error"], other
    assert "ConfigError: tune.lr=[1000.0]: no tuning run of this variant finished ok" in other["error"]
    assert folder_bytes(out) == before
    assert run(tuned, out, multirun=True, tune_dir=tune_dir) == first


def test_a_rerun_over_a_wider_grid_that_keeps_the_rate_skips_the_run_and_records_the_wider_grid(tmp_path):
    """A finished tuned run whose rate a wider tune.lr keeps is skipped, not retrained, and its summary's
    ``tune.searched`` becomes the wider grid's: the report reads the grid from it (the old one would call the
    rate the grid's edge and leave the new rates' tuning runs out)."""
    tune_dir, out, rate = tmp_path / "tune", tmp_path / "run", 3e-3
    assert run(tiny(f"train.lr={rate}"), tune_dir / "lr", multirun=True)["status"] == "ok"
    assert run(tiny(f"tune.lr=[{rate}]", "seed=1"), out, multirun=True, tune_dir=tune_dir)["status"] == "ok"
    first = read_summary(out)
    assert run(tiny("train.lr=1000.0"), tune_dir / "high", multirun=True)["status"] == "diverged"
    wider = run(tiny(f"tune.lr=[{rate},1000.0]", "seed=1"), out, multirun=True, tune_dir=tune_dir)
    after = read_summary(out)
    assert after["tune"]["searched"] == {str(rate): first["tune"]["searched"][str(rate)], "1000.0": None}
    assert after["tune"]["lr"] == rate and wider["tune"] == after["tune"]
    assert {k: v for k, v in after.items() if k != "tune"} == {k: v for k, v in first.items() if k != "tune"}


@pytest.mark.slow
def test_tune_lr_picks_each_variants_best_rate_then_runs_the_seeds(tmp_path):
    # Two MLPs at matched parameters, a FLOPs budget, and two rates: all three compose.
    args = ["mlp=gelu,swiglu", "seed=1,2", "tune.lr=[1e-4,3e-2]", "block.mlp.match=params", "block.d_ff=64",
            "train.budget.flops=2e8", "block.d_model=32", "block.n_heads=4", "model.n_layers=1",
            "task.max_bytes=30000", "task.seq_len=32", "train.batch_size=4", "train.warmup_steps=2",
            "train.eval_every=0", "train.eval_batches=2", "threads=1", f"hydra.sweep.dir={tmp_path / 's'}"]  # fmt: skip
    zoo_cli("zoo.train", "-m", *args, cwd=tmp_path)
    root = tmp_path / "s"
    tuning = [json.loads(p.read_text()) for p in (root / "tune").glob("*/summary.json")]
    assert sorted((t["choices"]["mlp"], t["config"]["train"]["lr"], t["config"]["seed"]) for t in tuning) == [
        ("gelu", 1e-4, 0), ("gelu", 3e-2, 0), ("swiglu", 1e-4, 0), ("swiglu", 3e-2, 0)]  # fmt: skip
    best = {}  # independently: the rate with the lower val_bpb per MLP
    for mlp in ("gelu", "swiglu"):
        mine = [t for t in tuning if t["choices"]["mlp"] == mlp]
        best[mlp] = min(mine, key=lambda t: t["final"]["val_bpb"])["config"]["train"]["lr"]
    runs = [json.loads(p.read_text()) for p in root.glob("*/summary.json")]
    assert len(runs) == 4 and {r["config"]["seed"] for r in runs} == {1, 2}
    for r in runs:
        mlp = r["choices"]["mlp"]
        assert r["status"] == "ok" and r["config"]["train"]["lr"] == r["tune"]["lr"] == best[mlp]
        assert set(r["tune"]["searched"]) == {"0.0001", "0.03"} or set(r["tune"]["searched"]) == {1e-4, 3e-2}
        assert r["budget"]["kind"] == "flops" and r["flops"] <= 2e8
        assert r["config"]["block"]["mlp"]["match"] == "params"
    with open(root / "report.csv") as f:
        rows = {row["mlp"]: row for row in csv.DictReader(f)}
    assert {m: float(rows[m]["lr"]) for m in rows} == best
    assert rows["gelu"]["budget"] == "2e+08 flops" and float(rows["gelu"]["flops"]) <= 2e8
    text = (root / "report.md").read_text()
    assert (
        "| lr (tuned) |" in text
        and "Learning rate tuned per variant (tune.lr)" in text
        and "Budget: 2e+08 flops" in text
    )
    assert imread(root / "lr.png").shape[1] > 600
    assert (root / "tune" / "report.md").is_file()  # the tuning sweep's own report
    assert "tune/" not in (root / "runs.csv").read_text()  # the sweep's table holds its own runs only
