"""``model.smear`` and ``model.backout`` (modded-nanogpt's, nanochat's) against their formulas written out by hand,
their parameters and FLOPs, their decoding state and their refusals. Cached decoding and left padding: the model
contract (zoo.testing.combos.MODEL_OPTIONS)."""

from __future__ import annotations

import pytest
import torch

from zoo import build_model
from zoo.core.errors import ConfigError
from zoo.models.seq2seq import build_seq2seq
from zoo.testing.combos import TINY, make_model, scramble

COMBO = {"placement": "pre", "norm": "rmsnorm", "attn": "gqa", "pos": "rotary", "mlp": "swiglu"}
VOCAB = 32


def config(n_layers: int = 2, **model) -> dict:
    return {"block": {**TINY, **COMBO}, "model": {"n_layers": n_layers, "vocab_size": VOCAB, **model}}


def test_smear_adds_a_gated_fraction_of_the_previous_embedding():
    """nanochat: x[:, 1:] += lambda sigmoid(w . x[:, 1:, :k]) x[:, :-1]; the first token unchanged; k = d_model
    below 24 channels."""
    model = make_model(COMBO, options={"smear": True})
    ids = torch.randint(0, VOCAB, (2, 6))
    x = model.embed_tokens(ids)
    lam, w = model.smear.scale, model.smear.gate.weight
    assert w.shape == (1, TINY["d_model"]) and lam.item() != 0  # the contract's scramble moves it from 0
    gate = lam * torch.sigmoid(torch.einsum("btk,ok->bto", x[:, 1:, : w.shape[1]], w))
    by_hand = torch.cat([x[:, :1], x[:, 1:] + gate * x[:, :-1]], dim=1)
    torch.testing.assert_close(model.smear(x), by_hand, rtol=1e-12, atol=1e-12)


def test_smear_starts_at_zero_and_backout_at_a_fifth():
    model = build_model(config(smear=True, backout=True))
    assert model.smear.scale.item() == 0 and model.backout.scale.item() == pytest.approx(0.2)


def test_backout_subtracts_a_multiple_of_the_middle_layers_output_before_the_final_norm():
    """h = final_norm(h_3 - lambda h_2) in a 4-layer stack: layer n_layers // 2 = 2 (0-based), as nanochat."""
    torch.manual_seed(0)
    model = build_model(config(n_layers=4, backout=True)).double().eval()
    scramble(model)
    ids = torch.randint(0, VOCAB, (2, 5))
    x, outputs = model.embed_tokens(ids), []
    for block in model.blocks:
        x = block(x)
        outputs.append(x)
    by_hand = model.final_norm(outputs[3] - model.backout.scale * outputs[2])
    torch.testing.assert_close(model.hidden_states(ids), by_hand, rtol=1e-12, atol=1e-12)


def test_their_parameters_and_flops_are_counted():
    """Smear: its gate's k weights and its scale; backout: its scale; 6 training FLOPs per token for each."""
    seq, k = 8, TINY["d_model"]
    plain, smear, backout = (build_model(config(**o)) for o in ({}, {"smear": True}, {"backout": True}))
    assert smear.num_parameters() - plain.num_parameters() == k + 1
    assert backout.num_parameters() - plain.num_parameters() == 1
    assert smear.flops_per_token(seq) - plain.flops_per_token(seq) == 6 * (k + 1)
    assert backout.flops_per_token(seq) - plain.flops_per_token(seq) == 6
    assert smear.parameter_counts()["residual"] == k + 1


def test_the_smear_keeps_the_last_embedding_and_cannot_rewind():
    model = make_model(COMBO, options={"smear": True})
    caches = model.new_caches(8)
    model(torch.randint(0, VOCAB, (2, 3)), caches=caches)
    held = caches[0].canon["smear"]
    assert held.shape == (2, 1, TINY["d_model"])
    with pytest.raises(ConfigError, match="model.smear"):
        caches[0].truncate(2)


@pytest.mark.parametrize("key", ["smear", "backout"])
def test_a_non_boolean_or_an_encoder_decoder_is_refused_by_name(key):
    with pytest.raises(ConfigError, match=f"model.{key}='yes'"):
        build_model(config(**{key: "yes"}))
    with pytest.raises(ConfigError, match=f"model.{key}=True: false in an encoder-decoder"):
        build_seq2seq(config(**{key: True}))


@pytest.mark.parametrize("key", ["smear", "backout"])
def test_tensor_parallelism_is_refused_by_name_before_tensor_work(key):
    from helpers import tiny

    from zoo.lab.planning.plan import plan_run

    with pytest.raises(ConfigError, match=f"model.{key}=True: false under parallel.tp=2"):
        plan_run(tiny(f"model.{key}=true", "parallel.tp=2"), {}, world=2)
