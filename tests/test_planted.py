"""Four one-line mistakes a module's own tests once let through, each caught here by the property it breaks:
the residual stream's RMS, the best rate of a tuning sweep, a branch's rate check, the bootstrap's quantiles."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zoo import build_block
from zoo.core.errors import ConfigError
from zoo.lab.planning.branch import check_same_rates
from zoo.lab.planning.train_config import TrainConfig
from zoo.lab.recipe import Recipe
from zoo.lab.records.summary import RunRecord, write_record
from zoo.lab.studies.stats import CONFIDENCE, bootstrap_interval
from zoo.lab.studies.tune import choose_lr
from zoo.lab.training.probes import layer_stats
from zoo.testing.combos import TINY


def test_the_residual_rms_probe_is_the_root_of_the_mean_square():
    """resid_rms of a block's output: sqrt(mean(x^2)), which is 3 for a stream of 3s and -3s (the mean
    square, 9, without its root is what a missing sqrt reports)."""
    block = build_block({**TINY, "placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "none", "mlp": "gelu"})
    x = torch.randn(2, 5, TINY["d_model"])
    out = torch.full((2, 5, TINY["d_model"]), 3.0)
    out[..., ::2] = -3.0
    _, _, rms = layer_stats(block, x, out)
    assert rms.item() == pytest.approx(3.0, rel=1e-6)
    noise = torch.randn(4, 7, TINY["d_model"])
    assert layer_stats(block, x, noise)[2].item() == pytest.approx(noise.pow(2).mean().sqrt().item(), rel=1e-5)


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
