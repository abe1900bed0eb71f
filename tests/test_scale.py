"""One process: activation checkpointing and the ``parallel`` keys' validation (the multi-process
checks are in test_distributed.py)."""

from __future__ import annotations

import pytest
import torch
from test_train import tiny

from zoo.lab.records import read_metrics
from zoo.lab.train import run


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
