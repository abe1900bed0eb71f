"""One-line mistakes a module's own tests once let through, each caught here by the property it breaks:
the residual stream's RMS, the best rate of a tuning sweep and of the report's learning-rate section, a
branch's rate check (up to the last step before it), the spike detector's noise and window, the bootstrap's
quantiles. (A branch rerun from another start: tests/test_branch.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import fake_run

from zoo import build_block
from zoo.core.errors import ConfigError
from zoo.lab.planning.branch import check_same_rates
from zoo.lab.planning.train_config import TrainConfig
from zoo.lab.recipe import Recipe, lr_at
from zoo.lab.records.summary import RunRecord, write_record
from zoo.lab.reports.report import write_report
from zoo.lab.studies.stats import CONFIDENCE, bootstrap_interval
from zoo.lab.studies.tune import choose_lr
from zoo.lab.studies.variants import build_report
from zoo.lab.training import spikes
from zoo.lab.training.probes import LAYER_KEYS, layer_stats
from zoo.testing.combos import TINY


def test_the_residual_rms_probe_is_the_root_of_the_mean_square():
    """resid_rms of a block's output: sqrt(mean(x^2)), which is 3 for a stream of 3s and -3s (the mean
    square, 9, without its root is what a missing sqrt reports)."""
    block = build_block({**TINY, "placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "none", "mlp": "gelu"})
    x = torch.randn(2, 5, TINY["d_model"])
    out = torch.full((2, 5, TINY["d_model"]), 3.0)
    out[..., ::2] = -3.0
    stats = dict(zip(LAYER_KEYS, layer_stats(block, x, out), strict=True))
    assert stats["resid_rms"].item() == pytest.approx(3.0, rel=1e-6)
    noise = torch.randn(4, 7, TINY["d_model"])
    rms = dict(zip(LAYER_KEYS, layer_stats(block, x, noise), strict=True))["resid_rms"]
    assert rms.item() == pytest.approx(noise.pow(2).mean().sqrt().item(), rel=1e-5)


def test_the_residual_peak_is_the_largest_absolute_value():
    """resid_max: one feature at -40 in a stream of 3s and -3s is the peak (the signed maximum would say 3)."""
    block = build_block({**TINY, "placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "none", "mlp": "gelu"})
    out = torch.full((2, 5, TINY["d_model"]), 3.0)
    out[..., ::2] = -3.0
    out[1, 4, 1] = -40.0
    stats = dict(zip(LAYER_KEYS, layer_stats(block, torch.randn(2, 5, TINY["d_model"]), out), strict=True))
    assert stats["resid_max"].item() == 40.0


def tuning_run(root, lr: float, seed: int, status: str, value: float | None) -> None:
    config = {"task": {"name": "bytes"}, "train": {"lr": lr, "steps": 10}, "seed": seed,
              "tune": {"lr": [1e-3, 3e-3, 1e-2], "seeds": [0, 1]}}  # fmt: skip
    record = RunRecord(status=status, config=config, overrides=[f"train.lr={lr}", f"seed={seed}"],
                       metric={"name": "val_bpb", "mode": "min", "value": value}, final={"val_bpb": value})  # fmt: skip
    write_record(root / f"lr={lr},seed={seed}", record)


def test_the_best_rate_never_counts_a_diverged_run_at_its_loss(tmp_path):
    """A rate whose run diverged on one seed has no mean, whatever that run's last loss: the rate the other
    runs finished best at is chosen (a diverged run counted at its recorded value would win here)."""
    for seed in (0, 1):
        tuning_run(tmp_path, 1e-3, seed, "ok", 3.0 + seed / 10)
        tuning_run(tmp_path, 3e-3, seed, "ok", 2.5 + seed / 10)
    tuning_run(tmp_path, 1e-2, 0, "ok", 2.0)
    tuning_run(tmp_path, 1e-2, 1, "diverged", 1.0)  # its last value is the lowest of all
    config = {"task": {"name": "bytes"}, "train": {"lr": 1e-3, "steps": 10}, "seed": 0,
              "tune": {"lr": [1e-3, 3e-3, 1e-2], "seeds": [0, 1]}}  # fmt: skip
    chosen = choose_lr(config, tmp_path)
    assert chosen["lr"] == 3e-3 and chosen["searched"][1e-2] is None
    assert chosen["searched"][3e-3] == pytest.approx(2.55)


def test_the_learning_rate_sections_best_rate_is_never_one_where_a_seed_diverged_or_failed(tmp_path):
    """The report's best lr among rates where every tune seed finished ok: at 1e-2 seed 0 diverged and at 1e-1
    seed 2 failed, the others finishing lower than any run at 1e-3; their means over the seeds that finished
    (2.05, 1.55) would win, so the best is 1e-3, at 2.9, the section says it and the main table's best lr too."""
    values = {1e-3: (2.8, 2.9, 3.0), 1e-2: (None, 2.0, 2.1), 1e-1: (1.5, 1.6, None)}
    for rate, seeds in values.items():
        for seed, value in enumerate(seeds):
            status = "ok" if value is not None else ("diverged" if rate == 1e-2 else "failed")
            fake_run(tmp_path / "tune", ["norm=rmsnorm", f"seed={seed}", f"train.lr={rate}"], status=status,
                     value=value)  # fmt: skip
            fake_run(tmp_path / "tune", ["norm=none", f"seed={seed}", f"train.lr={rate}"], value=3.5)  # a baseline
    for norm in ("none", "rmsnorm"):
        for seed in range(3):
            tune = {"lr": 1e-3, "searched": {str(r): None for r in values}, "seeds": [0, 1, 2], "metric": "val_bpb"}
            fake_run(tmp_path, [f"norm={norm}", f"seed={seed}"], value=3.0, tune=tune, job=seed)
    curve = build_report(tmp_path).lr.curves[("rmsnorm",)]
    assert curve.best_lr == 1e-3 and curve.edge == "lowest"
    text = write_report(tmp_path)
    assert "| norm=rmsnorm | 0.001 (edge: lowest) | 2.9000 [" in text  # the section's row
    assert "| 0.001 (edge: lowest) | 0.001 (edge: lowest) |" in text  # the main table's lr (tuned) and best lr


@pytest.mark.parametrize(
    ("key", "value"), [("lr", 2e-3), ("warmup_steps", 5), ("min_lr_ratio", 0.2), ("steps", 300), ("schedule", "wsd")]
)
def test_a_branch_whose_schedule_differs_in_any_one_key_is_refused(key, value):
    """The source trained 200 steps of a cosine from lr 1e-3 with 10 warmup steps down to 10%: a branch
    whose rates differ before its step in any one of the schedule's keys did not continue that run."""
    source = {"lr": 1e-3, "warmup_steps": 10, "min_lr_ratio": 0.1, "steps": 200}
    record = RunRecord(status="ok", config={"train": dict(source), "schedule": {"name": "cosine"}})
    mine = dict(source)
    schedule = {"name": "cosine"}
    if key == "schedule":
        schedule = {"name": value, "decay_fraction": 0.2}
    else:
        mine[key] = value
    train = TrainConfig.from_config(mine)
    check_same_rates(record, TrainConfig.from_config(source), Recipe(schedule={"name": "cosine"}), 100, "src")
    with pytest.raises(ConfigError, match="train.branch.step"):
        check_same_rates(record, train, Recipe(schedule=schedule), 100, "src")


def test_a_branch_whose_rate_differs_at_the_last_step_before_it_only_is_refused():
    """A 100-step WSD source decays from step 80: its rates are the peak up to step 80 and below it from step 81,
    where a 200-step WSD branch still trains at the peak. Branched at step 81 the two agree on every step it
    trained; at step 82 they differ on the last step only (81), and that branch did not continue the source."""
    source = {"lr": 1e-3, "warmup_steps": 10, "min_lr_ratio": 0.1, "steps": 100}
    record = RunRecord(status="ok", config={"train": dict(source), "schedule": {"name": "wsd"}})
    wsd = Recipe(schedule={"name": "wsd"})
    theirs, mine = TrainConfig.from_config(source), TrainConfig.from_config({**source, "steps": 200})
    was = [lr_at(wsd.schedule_entry(), s, theirs) for s in range(82)]
    now = [lr_at(wsd.schedule_entry(), s, mine) for s in range(82)]
    assert was[:81] == now[:81] and was[81] < now[81]  # they differ at step 81 only
    check_same_rates(record, mine, wsd, 81, "src")
    with pytest.raises(ConfigError, match="train.branch.step=82: .* at step 81 it trained at lr"):
        check_same_rates(record, mine, wsd, 82, "src")


#: Logs of a loss (as the spike detector reads it): steps 1-20 alternate 1.0 and 1.02, but for an earlier spike of
#: 1.5 at step 11. Its step-to-step differences: 17 of 0.02 and the two of the spike (0.48 each).
SPIKED = [1.5 if i == 10 else 1.0 + 0.02 * (i % 2) for i in range(20)]


def test_the_spike_noise_leaves_out_the_largest_step_to_step_differences():
    """The noise of :data:`SPIKED` without its 2 largest differences (the earlier spike's) is the mean of 17
    differences of 0.02 x sqrt(pi)/2; the level, the median of the last 5 steps, is 1.02. A step is a spike above
    1.02 + 7 x noise = 1.1441 (above 1.02 + log 1.1 too): just above it is, just below it is not. Trimmed of the 2
    smallest instead, the noise would hold the spike's 0.48s and 1.15 would be no spike."""
    noise = 0.02 * math.sqrt(math.pi) / 2
    threshold = 1.02 + spikes.Z * noise
    assert threshold > 1.02 + math.log1p(spikes.REL["loss"])  # the noise sets it here, not the 10% floor
    assert spikes.is_spike(threshold + 1e-3, SPIKED) and not spikes.is_spike(threshold - 1e-3, SPIKED)


def test_a_step_is_judged_against_the_steps_before_it_only():
    """Step 21 at 1.16 after :data:`SPIKED`: against steps 1-20 (noise and level as above) it is a spike, as the
    earlier one at step 11 is. Judged against a window already holding it, its own difference of 0.14 would be
    among the two largest left out, one of the earlier spike's kept: the noise would be (17 x 0.02 + 0.14) / 18
    x sqrt(pi)/2, the threshold 1.02 + 7 x 0.0236 = 1.1854, and step 21 no spike."""
    rows = [[i + 1, math.exp(x), None] for i, x in enumerate([*SPIKED, 1.16])]
    assert 1.02 + spikes.Z * (17 * 0.02 + 0.14) / 18 * math.sqrt(math.pi) / 2 > 1.16  # what the plant would do
    state = spikes.new_state()
    spikes.update(state, rows)
    assert spikes.result(state) == {"count": 2, "steps": [11, 21], "by": {"loss": [11, 21], "grad_norm": []},
                                    "judged": 21 - spikes.MIN_HISTORY}  # fmt: skip


def test_the_bootstrap_interval_is_the_central_95_percent_of_resampled_means():
    """The percentile interval's ends are the 2.5% and 97.5% quantiles of the resampled means, checked
    against a resampling of our own (another generator: they agree to Monte Carlo error, far closer than
    the 5% and 95% quantiles, or 1% and 99%, lie)."""
    diffs = np.random.default_rng(7).normal(0.3, 1.0, size=30)
    mean, low, high, _ = bootstrap_interval(diffs.tolist())
    means = np.random.default_rng(1).choice(diffs, size=(40_000, diffs.size)).mean(axis=1)
    alpha = 1 - CONFIDENCE
    want = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    wrong = np.quantile(means, [alpha, 1 - alpha])
    assert mean == pytest.approx(diffs.mean())
    assert abs(low - want[0]) < 0.01 and abs(high - want[1]) < 0.01, (low, high, want)
    assert abs(low - wrong[0]) > 0.04 and abs(high - wrong[1]) > 0.04  # the check can tell them apart
