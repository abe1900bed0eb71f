"""Hugging Face export of a model under μP: its score and logit multipliers folded into the weights."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

import zoo
from zoo import build_model, compose
from zoo.lab.recipe.param import infer_for, parametrize
from zoo.models.hf import family_for, to_hf_model
from zoo.models.hf.family import model_settings
from zoo.models.hf.weights import convert

transformers = pytest.importorskip("transformers")  # installed by .ci/run (the hf extra)

SMALL = ["block.d_model=64", "block.n_heads=4", "model.n_layers=2", "block.max_len=48", "model.vocab_size=256"]
CASES = {
    "llama gqa (2 kv heads), tied": ["preset=llama", "block.attn.n_kv_heads=2"],
    "llama gqa (2 kv heads), bias, untied": [
        "preset=llama", "block.attn.n_kv_heads=2", "block.bias=true", "model.tie_embeddings=false",
    ],
    "llama mha, untied": ["preset=llama", "attn=mha", "model.tie_embeddings=false"],
    "gpt2, tied": ["preset=gpt", "pos=learned"],
    "gpt2, untied": ["preset=gpt", "pos=learned", "model.tie_embeddings=false"],
}  # fmt: skip
IDS = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(1))


def under_mup(overrides: list[str], base_width: int = 32) -> zoo.LanguageModel:
    """A random model at width 64 under μP with base width 32, its weights perturbed."""
    raw = OmegaConf.to_container(compose([*overrides, *SMALL]), resolve=True)
    raw["param"] = {"name": "mup", "base_width": base_width}
    torch.manual_seed(0)
    model = parametrize(build_model(raw), infer_for(raw, base_width)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("overrides", list(CASES.values()), ids=list(CASES))
def test_export_of_a_mup_model_keeps_the_logits(overrides, tmp_path):
    model = under_mup(overrides)
    assert model.logit_scale == 0.5
    assert all(block.attn.score_scale == math.sqrt(8) / 16 for block in model.blocks)  # d_head 8 -> 16
    before = {k: v.clone() for k, v in model.state_dict().items()}
    zoo.to_hf(model, tmp_path)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the zoo model unchanged
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert theirs.config.tie_word_embeddings is False  # a tied head under a logit multiplier is untied
    back = zoo.from_hf(tmp_path)
    assert back.head is not None and back.logit_scale is None
    with torch.no_grad():
        mine = model(IDS)
        torch.testing.assert_close(theirs(IDS).logits, mine, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(back(IDS), mine, rtol=1e-5, atol=1e-5)
        if model.head is None:  # the input embedding is exported as it is
            assert torch.equal(theirs.get_input_embeddings().weight, model.embed.weight)


@pytest.mark.parametrize("overrides", [CASES["llama gqa (2 kv heads), tied"], CASES["gpt2, untied"]])
def test_without_the_fold_the_logits_differ(overrides):
    # The plain conversion (as before the fold) of the same weights: the multipliers are not 1.
    model = under_mup(overrides)
    family = family_for(model)
    config = family.hf_config(model, model_settings(model)[0], model.head is None)
    unfolded = getattr(transformers, family.hf_class)(config)
    plain = convert(model.state_dict(), family.weights, family.geometries(model), to="hf")
    unfolded.load_state_dict(plain, strict=False)
    if model.head is None:
        unfolded.tie_weights()
    with torch.no_grad():
        mine, plain = model(IDS), unfolded.eval()(IDS).logits
        assert (plain - mine).abs().max() > 1e-2
        model.logit_scale = None
        for block in model.blocks:
            block.attn.score_scale = None
        torch.testing.assert_close(plain, model(IDS), rtol=1e-5, atol=1e-5)  # the multipliers are the difference


def test_at_the_base_width_the_export_is_the_standard_one(tmp_path):
    model = under_mup(CASES["llama gqa (2 kv heads), tied"], base_width=64)
    assert model.logit_scale is None and all(block.attn.score_scale is None for block in model.blocks)
    theirs = to_hf_model(model)
    assert type(theirs).__name__ == "LlamaForCausalLM" and theirs.config.tie_word_embeddings
    with torch.no_grad():
        torch.testing.assert_close(theirs(IDS).logits, model(IDS), rtol=1e-5, atol=1e-5)
