"""``train.tail_ema=<decay>``: the weights' EMA from ``train.tail_ema_from`` is each step's lerp by hand, evaluated at
the end beside the last weights (``val_loss_ema`` beside ``val_loss``); bad values are refused by name before any
model is built; a run with it resumes bit for bit (the EMA in the checkpoint's safetensors)."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny
from test_recipe import resumes_bit_identically

from zoo.lab.recipe import tail_ema
from zoo.lab.training.run import run


def test_the_ema_starts_as_the_weights_then_moves_by_one_minus_decay_each_step():
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        model.bias.fill_(4.0)
    ema = tail_ema.update({}, model, 0.75)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[5.0, -2.0]]))
        model.bias.fill_(0.0)
    ema = tail_ema.update(ema, model, 0.75)
    assert ema["weight"].tolist() == [[0.75 * 1 + 0.25 * 5, 0.75 * 2 + 0.25 * -2]]
    assert ema["bias"].tolist() == [0.75 * 4]
    assert model.weight.tolist() == [[5.0, -2.0]]  # the model's own weights untouched


def test_the_ema_is_evaluated_at_the_end_beside_the_last_weights_and_the_last_weights_are_saved(tmp_path):
    plain = run(tiny("train.steps=6"), tmp_path / "plain")
    ema = run(tiny("train.steps=6", "train.tail_ema=0.5", "train.tail_ema_from=3"), tmp_path / "ema")
    assert plain["status"] == ema["status"] == "ok"
    assert ema["final"]["val_loss"] == plain["final"]["val_loss"]  # the EMA changes no training number
    assert "val_loss_ema" not in plain["final"]
    assert ema["final"]["val_loss_ema"] != ema["final"]["val_loss"]
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "plain" / "model.safetensors"), load_file(tmp_path / "ema" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_an_ema_from_the_last_step_is_the_last_weights(tmp_path):
    summary = run(tiny("train.steps=6", "train.tail_ema=0.5", "train.tail_ema_from=6"), tmp_path)
    assert summary["final"]["val_loss_ema"] == summary["final"]["val_loss"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.tail_ema=1.0"], "train.tail_ema=1.0: must be in [0, 1)"),
        (["train.tail_ema=-0.1"], "train.tail_ema=-0.1: must be in [0, 1)"),
        (["train.tail_ema=0.9", "train.tail_ema_from=0"], "train.tail_ema_from=0: must be a step >= 1"),
    ],
)
def test_bad_values_are_refused_by_name_before_any_model(tmp_path, overrides, message):
    summary = run(tiny(*overrides), tmp_path)
    assert summary["status"] == "failed" and message in summary["error"], summary["error"]
    assert "parameters" not in summary


def test_a_run_with_a_tail_ema_resumes_to_the_last_bit(tmp_path):
    resumes_bit_identically(tmp_path, "train.tail_ema=0.5", "train.tail_ema_from=2")


def test_a_tail_ema_is_refused_by_name_under_fsdp2_and_tensor_parallel():
    from zoo.core.errors import ConfigError
    from zoo.lab.planning.plan import plan_run

    for mesh in ("parallel.dp_shard=2", "parallel.tp=2"):
        with pytest.raises(ConfigError, match=r"train.tail_ema=0.9: 0 under FSDP2 or tensor parallelism"):
            plan_run(tiny("train.tail_ema=0.9", mesh), {}, [], world=2)
    plan_run(tiny("train.tail_ema=0.9", "parallel.dp_shard=1"), {}, [], world=2)  # plain DDP: whole weights


def test_a_tail_ema_starting_after_the_last_step_is_said_so(tmp_path, caplog):
    summary = run(tiny("train.steps=4", "train.tail_ema=0.5", "train.tail_ema_from=9"), tmp_path)
    assert summary["status"] == "ok" and not any(k.endswith("_ema") for k in summary["final"])
    assert "train.tail_ema_from=9 is past the run's last step 4: no tail EMA" in caplog.text
