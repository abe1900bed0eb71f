"""Auxiliary losses (zoo.core.auxiliary): any part records them, the model collects them, the trainer
adds them with their weights and logs them."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny

from zoo import MLPS, ConfigError, LanguageModel, resolve_block
from zoo.core.auxiliary import aux_weights, collect_aux, record_aux
from zoo.lab.records.metrics import read_metrics
from zoo.lab.training.run import run
from zoo.parts.mlps import GeluMLP


class Spread(GeluMLP):
    """A GELU MLP that records the mean square of its hidden units as an auxiliary loss."""

    aux_losses = {"hidden_square": 0.5}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.activation(self.up(x))
        record_aux(self, "hidden_square", hidden.square().mean())
        return self.down(hidden)


@pytest.fixture
def spread():
    MLPS.register("spread")(Spread)
    yield
    MLPS.unregister("spread")


BLOCK = {"d_model": 16, "n_heads": 2, "placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "none"}


def model(n_layers: int = 3, mlp: str = "spread") -> LanguageModel:
    return LanguageModel(resolve_block({**BLOCK, "mlp": mlp}), 32, n_layers).double()


def test_the_model_collects_each_layers_loss_as_their_mean_then_clears(spread):
    lm, ids = model(), torch.randint(0, 32, (2, 5))
    lm.train()
    lm(ids)
    aux = collect_aux(lm)
    hidden = []
    with torch.no_grad():  # recompute each layer's hidden units independently (records nothing)
        x = lm.embed(ids)
        for block in lm.blocks:
            x = x + block.attn(block.placement.norms[0](x))
            hidden.append(block.mlp.activation(block.mlp.up(block.placement.norms[1](x))).square().mean())
            x = x + block.mlp(block.placement.norms[1](x))
    assert set(aux) == {"hidden_square"}
    torch.testing.assert_close(aux["hidden_square"], torch.stack(hidden).mean())
    assert collect_aux(lm) == {}  # cleared
    lm.eval()
    lm(ids)
    assert collect_aux(lm) == {}  # nothing is recorded in eval()
    lm.train()
    with torch.no_grad():
        lm(ids)
    assert collect_aux(lm) == {}  # nor without gradients


def test_weights_default_to_the_parts_and_configured_ones_override(spread):
    lm = model()
    assert aux_weights(lm, {}) == {"hidden_square": 0.5}
    assert aux_weights(lm, {"hidden_square": 0.0}) == {"hidden_square": 0.0}
    with pytest.raises(ConfigError, match="train.aux_weights.balance.*declared: hidden_square"):
        aux_weights(lm, {"balance": 1.0})
    with pytest.raises(ConfigError, match="no part of this model"):
        aux_weights(model(1, "gelu"), {"balance": 1.0})


def test_the_trainer_adds_weighted_aux_losses_and_logs_them(spread, tmp_path):
    overrides = ["mlp=gelu", "block.mlp.name=spread", "train.steps=4", "train.log_every=2"]
    plain = run(tiny(*overrides, "+train.aux_weights.hidden_square=0.0"), tmp_path / "zero")
    weighted = run(tiny(*overrides, "+train.aux_weights.hidden_square=100.0"), tmp_path / "heavy")
    assert plain["status"] == weighted["status"] == "ok", (plain["error"], weighted["error"])
    logged = [r for r in read_metrics(tmp_path / "heavy") if r["kind"] == "train"]
    assert all(r["aux_hidden_square"] > 0 for r in logged)
    assert weighted["final"]["aux_hidden_square"] == logged[-1]["aux_hidden_square"]
    # Weighted heavily, training shrinks the hidden units; at weight 0 it only logs them.
    first = [r for r in read_metrics(tmp_path / "zero") if r["kind"] == "train"][0]["aux_hidden_square"]
    assert logged[0]["aux_hidden_square"] == pytest.approx(first)  # the same first step
    assert weighted["final"]["aux_hidden_square"] < plain["final"]["aux_hidden_square"]
