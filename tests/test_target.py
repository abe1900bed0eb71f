"""Reaching a target (zoo.lab.studies.target, ``report.target``): the crossing read between evaluations, its
FLOPs and seconds, modded-nanogpt's pass rule on synthetic runs with known answers and its false-pass rate
at the nominal one, and the report's section and columns on a tiny trained sweep."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import tiny
from scipy.stats import norm

from zoo.core.errors import ConfigError
from zoo.lab.commands.report import main as report_main
from zoo.lab.planning.options import report_options, target_options
from zoo.lab.records.metrics import read_metrics
from zoo.lab.reports.report import write_built
from zoo.lab.studies.target import crossing_step, pass_rule, run_crossing, smoothed
from zoo.lab.studies.variants import build_report
from zoo.lab.training.run import run


def test_the_crossing_is_linear_in_step_between_the_evaluations_around_it():
    loss = [(0, 5.0), (10, 3.0), (20, 2.0)]
    assert crossing_step(loss, 2.5, "min") == 15.0  # 10 + (2.5 - 3) x 10 / (2 - 3)
    assert crossing_step(loss, 3.0, "min") == 10.0 and crossing_step(loss, 6.0, "min") == 0.0
    assert crossing_step(loss, 1.9, "min") is None
    accuracy = [(0, 0.1), (4, 0.3), (8, 0.7)]
    assert crossing_step(accuracy, 0.5, "max") == pytest.approx(6.0)  # 4 + (0.5 - 0.3) x 4 / 0.4


def test_a_runs_flops_and_seconds_at_the_crossing_by_hand():
    """Evaluations at steps 0, 4, 8 (64 tokens a step); train records every 2 steps at known rates: the target
    3.5 is crossed at step 6: 384 tokens, 3,840 FLOPs at 10 a token, 7 s of training (the rates below)."""
    records = [
        {"kind": "val", "step": 0, "tokens": 0, "val_loss": 5.0},
        {"kind": "train", "step": 2, "tokens": 128, "tokens_per_s": 64.0},  # 2 s
        {"kind": "train", "step": 4, "tokens": 256, "tokens_per_s": 128.0},  # 1 s: 3 s so far
        {"kind": "val", "step": 4, "tokens": 256, "val_loss": 4.0},
        {"kind": "train", "step": 6, "tokens": 384, "tokens_per_s": 32.0},  # 4 s: 7 s so far
        {"kind": "train", "step": 8, "tokens": 512, "tokens_per_s": 128.0},  # 1 s: 8 s so far
        {"kind": "val", "step": 8, "tokens": 512, "val_loss": 3.0},
    ]
    crossing, final = run_crossing(records, "val_loss", 3.5, "min", 0.0, flops_per_token=10.0)
    assert crossing.step == 6.0 and crossing.flops == 3840.0 and crossing.seconds == 7.0 and final == 3.0
    never, final = run_crossing(records, "val_loss", 2.0, "min", 0.0, flops_per_token=10.0)
    assert never.step is None and never.flops is None and final == 3.0


def test_the_ema_is_bias_corrected_and_moves_the_crossing():
    assert smoothed([2.0, 0.0], 0.5) == pytest.approx([2.0, 0.5 / 0.75])
    assert smoothed([1.0, 1.0, 1.0], 0.9) == pytest.approx([1.0, 1.0, 1.0])
    assert smoothed([3.0, 1.0], 0.0) == [3.0, 1.0]
    records = [{"kind": "val", "step": s, "tokens": 8 * s, "val_loss": v} for s, v in ((0, 9.0), (2, 4.0), (4, 2.0))]
    raw, _ = run_crossing(records, "val_loss", 3.0, "min", 0.0, None)
    ema, final = run_crossing(records, "val_loss", 3.0, "min", 0.5, None)
    assert raw.step == 3.0 and final == pytest.approx(0.5 * 2 / 0.75 + 1 / 0.75) and ema.step > raw.step


@pytest.mark.parametrize(
    ("finals", "margin", "mode", "verdict"),
    [
        ([3.0, 3.2], 0.5, "min", "pass"),  # (3.5 - 3.1) x sqrt(2) = 0.566
        ([3.0, 3.2], 0.6, "min", "fail"),
        ([3.6, 3.7, 3.8], 0.0, "min", "fail"),  # worse than the target
        ([3.9, 4.1], 0.5, "max", "pass"),  # (4.0 - 3.5) x sqrt(2) = 0.707
        ([3.0], 0.0, "min", "too few runs"),
        ([], 0.0, "min", "too few runs"),
    ],
)
def test_the_pass_rule_on_known_answers(finals, margin, mode, verdict):
    score, said, reason = pass_rule(finals, 3.5, margin, mode)
    assert said == verdict
    if verdict == "too few runs":
        assert score is None and reason.endswith("the rule needs 2")
    else:
        mean = sum(finals) / len(finals)
        assert score == pytest.approx((3.5 - mean if mode == "min" else mean - 3.5) * math.sqrt(len(finals)))


@pytest.mark.parametrize("alpha", [0.05, 0.2])
def test_a_variant_at_the_target_passes_at_the_nominal_rate_when_the_margin_is_z_sigma(alpha):
    """Null case: 4 runs drawn about a true mean at the target with spread sigma; a margin of z(1 - alpha) x
    sigma passes a share alpha of such variants, within binomial error over 4,000 draws."""
    sigma, target, n, cases = 0.02, 3.28, 4, 4000
    margin = norm.ppf(1 - alpha) * sigma
    draws = np.random.default_rng(0).normal(target, sigma, size=(cases, n))
    passed = sum(pass_rule(list(row), target, margin, "min")[1] == "pass" for row in draws)
    assert abs(passed / cases - alpha) <= 3 * math.sqrt(alpha * (1 - alpha) / cases)


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"target": "low"}, "report.target='low'"),
        ({"target": 3.0, "margin": -0.1}, "report.margin=-0.1"),
        ({"target": 3.0, "target_ema": 1.0}, "report.target_ema=1.0"),
        ({"target": float("nan")}, "report.target=nan"),
    ],
)
def test_a_bad_target_option_is_refused_naming_the_key(section, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.", 1)):
        report_options(section)
    assert target_options({"target": 3, "margin": None}) == {"target": 3.0, "margin": 0.0, "target_ema": 0.0}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Two variants, two seeds each: a tiny sweep's runs, launched with a target every run meets at step 0."""
    root = tmp_path_factory.mktemp("target")
    for norm_ in ("layernorm", "rmsnorm"):
        for seed in (0, 1):
            overrides = [f"norm={norm_}", f"seed={seed}"]
            done = run(tiny(*overrides, "report.target=100"), root / ",".join(overrides), overrides=overrides)
            assert done["status"] == "ok", done["error"]
    return root


def summaries(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(root.glob("*/summary.json"))]


def test_the_report_gives_each_variant_its_steps_flops_and_seconds_to_the_target(sweep):
    finals = [s["final"]["val_bpb"] for s in summaries(sweep)]
    target = max(finals) + 1e-6  # every run reaches it, between its last two evaluations or before
    text = write_built(build_report(sweep, target={"target": target, "margin": 0.0, "target_ema": 0.0}), plots=False)
    assert f"Reaching the target val_bpb = {target:g}" in text and "| 2/2 |" in text
    rows = list(csv.DictReader((sweep / "report.csv").open()))
    for row in rows:
        assert row["target_reached"] == "2/2" and row["target_verdict"] in ("pass", "fail")
        steps, flops = float(row["steps_to_target"]), float(row["flops_to_target"])
        assert 0 < steps <= 12 and float(row["seconds_to_target"]) > 0
        one = next(s for s in summaries(sweep) if s["config"]["block"]["norm"]["name"] == row["norm"])
        assert flops == pytest.approx(steps * one["tokens"] / one["steps"] * one["flops_per_token"])
    folder = sweep / "norm=rmsnorm,seed=0"
    evals = [r for r in read_metrics(folder) if r["kind"] == "val"]
    assert [r["step"] for r in evals] == [0, 6, 12]


def test_the_runs_own_report_target_is_the_default(sweep):
    study = build_report(sweep).target
    assert study is not None and study.target == 100.0
    assert all(c.step == 0.0 and c.flops == 0.0 for r in study.results.values() for c in r.crossings)


def test_runs_that_never_reach_the_target_are_said_so_not_dropped(sweep, capsys):
    target = min(s["final"]["val_bpb"] for s in summaries(sweep)) - 1.0
    report_main([str(sweep), "--no-plots", "--target", str(target)])
    text = (sweep / "report.md").read_text()
    assert text.count("| 0/2 (2 never) |") == 2 and text.count("fail: (target - mean) x sqrt(2)") == 2
    rows = list(csv.DictReader((sweep / "report.csv").open()))
    assert [(r["target_reached"], r["steps_to_target"], r["target_verdict"]) for r in rows] == [("0/2", "", "fail")] * 2


def test_the_target_gate_reads_each_variants_pass_rule(sweep):
    from zoo.lab.studies.gates import report_gates

    report = build_report(sweep)  # the runs' own report.target=100: every run far below it (the metric is a loss)
    answers = report_gates(report, ["target"])
    assert len(answers) == 1  # the one variant beside the baseline
    (result,) = next(iter(answers.values()))
    score = report.target.results[next(iter(answers))].score
    assert result.passed and result.reason == f"target rule pass: (target - mean) x sqrt(2) = {score:.4g} > margin 0"
