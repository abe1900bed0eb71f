"""A run's throughput (zoo.lab.training.throughput): model FLOPs per second over its steady steps, without
evaluation or the first step's warm-up, and its mfu against the table of dense bf16 peaks."""

from __future__ import annotations

import json
import time

import pytest
from helpers import tiny

from zoo.lab.records.summary import SUMMARY
from zoo.lab.throughput import PEAKS, measured, peak_of
from zoo.lab.training.evaluation import Evaluator
from zoo.lab.training.run import run
from zoo.lab.training.step import Stepper


@pytest.mark.parametrize(
    ("name", "entry"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
    ],
)
def test_a_device_takes_the_longest_peak_its_name_holds(name, entry):
    assert peak_of(name) == (entry, PEAKS[entry])


def test_mfu_is_the_rate_over_the_devices_peak_by_hand():
    one = measured(2e15, 4.0, "cuda", "NVIDIA H100 80GB HBM3")
    assert one["flops_per_second"] == 5e14 and one["mfu"] == pytest.approx(5e14 / 989e12)
    assert one["mfu_peak"] == {"device": "H100", "flops_per_second": 989e12}
    assert measured(2e15, 4.0, "cuda", "NVIDIA H100 80GB HBM3", world=2)["mfu"] == pytest.approx(5e14 / 1978e12)


@pytest.mark.parametrize(
    ("device", "name", "reason"),
    [
        ("cpu", None, "no peak for a cpu device"),
        ("cuda", "Tesla T4", "'Tesla T4' is not in the table of dense bf16 peaks"),
        ("mps", None, "no peak for a mps device"),
    ],
)
def test_no_mfu_without_a_known_peak_and_the_reason_says_why(device, name, reason):
    result = measured(1e12, 1.0, device, name)
    assert result["flops_per_second"] == 1e12 and result["mfu"] is None
    assert result["mfu_reason"].startswith(reason)


def test_a_run_records_its_flops_per_second_without_evaluation_or_the_first_steps_warm_up(tmp_path, monkeypatch):
    """The first step (compile's warm-up) and the evaluation between two log steps made 2 s slower each leave the
    rate as it was: the steady steps' FLOPs over a training time under those 2 s (7 tiny steps take far less)."""
    evaluate, step = Evaluator.evaluate, Stepper.__call__
    evaluations, steps = [], []

    def slow_evaluation(self):
        evaluations.append(1)
        if len(evaluations) == 2:  # step 4's: steps 5 to 8 are timed after it
            time.sleep(2.0)
        return evaluate(self)

    def slow_first_step(self, batch):
        steps.append(1)
        if len(steps) == 1:
            time.sleep(2.0)
        return step(self, batch)

    monkeypatch.setattr(Evaluator, "evaluate", slow_evaluation)
    monkeypatch.setattr(Stepper, "__call__", slow_first_step)
    summary = run(tiny("train.steps=8", "train.eval_every=4", "train.log_every=4"), tmp_path)
    assert summary["status"] == "ok" and summary["train_time_s"] > 2.0  # the first step's sleep is training
    written = json.loads((tmp_path / SUMMARY).read_text())
    assert written["mfu"] is None and written["mfu_reason"].startswith("no peak for a cpu device")
    tokens_per_step = summary["tokens"] / summary["steps"]
    steady_flops = (summary["steps"] - 1) * tokens_per_step * summary["flops_per_token"]
    assert 0 < steady_flops / written["flops_per_second"] < 2.0
