"""``preset=smollm3`` against transformers' ``SmolLM3ForCausalLM``: the preset's model with random weights, exported,
computes the same logits (float32 and float64) and decodes the same tokens with its cache across the rotary and
NoPE layers; the export's config is SmolLM3's (its ``no_rope_layers`` the pattern's); a folder written by
``zoo.to_hf`` loads in transformers and comes back through ``zoo.from_hf`` with the same logits and pattern."""

from __future__ import annotations

import copy

import pytest
import torch

import zoo
from zoo.core.errors import ConfigError
from zoo.models.hf import to_hf_model

transformers = pytest.importorskip("transformers")  # installed by .ci/run (the hf extra)

#: Two periods of the preset's 3:1 pattern, minus two layers: the depth ends on rotary layers.
TINY = ["preset=smollm3", "block.d_model=32", "block.n_heads=4", "model.n_layers=6", "model.vocab_size=64"]
IDS = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(3))


def drawn(overrides: list[str] = TINY) -> zoo.LanguageModel:
    """The preset's model with every parameter drawn (a gain left at 1 would hide a swapped norm)."""
    torch.manual_seed(0)
    model = zoo.build_model(zoo.compose(overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


@pytest.fixture(scope="module")
def pair() -> tuple[zoo.LanguageModel, torch.nn.Module]:
    model = drawn()
    return model, to_hf_model(model, "smollm3")


def test_the_export_is_smollm3s_config_with_the_presets_nope_layers(pair):
    model, theirs = pair
    assert type(theirs).__name__ == "SmolLM3ForCausalLM"
    assert theirs.config.no_rope_layers == [1, 1, 1, 0, 1, 1]  # the pattern [{}, {}, {}, {pos: none}] over 6
    assert [type(block.attn.position).__name__ for block in model.blocks] == ["Rotary"] * 3 + ["NoPosition"] + [
        "Rotary"] * 2  # fmt: skip
    assert (theirs.config.num_key_value_heads, theirs.config.head_dim) == (2, 8)  # the preset's 2 kv heads, of 4 here
    assert theirs.config.rope_parameters["rope_theta"] == 5e6 and theirs.config.tie_word_embeddings


def test_the_same_logits_in_float32_and_float64(pair, float64):
    model, theirs = pair
    with torch.no_grad():
        torch.testing.assert_close(theirs(IDS).logits, model(IDS), rtol=0, atol=1e-4)
    float64(transformers.models.smollm3.modeling_smollm3)  # its rotary tables are computed in float32 on purpose
    mine, weights = copy.deepcopy(model).double(), theirs.state_dict()
    theirs = type(theirs)(theirs.config).double().eval()  # built under the lift: its rotary table in float64 too
    theirs.load_state_dict(weights)
    with torch.no_grad():
        torch.testing.assert_close(theirs(IDS).logits, mine(IDS), rtol=0, atol=1e-10)


def test_cached_decoding_across_rotary_and_nope_layers_equals_transformers(pair):
    model, theirs = pair
    prompt, new = IDS[:, :5], 12
    mine = model.generate(prompt, new)
    out = theirs.generate(prompt, max_new_tokens=new, do_sample=False, use_cache=True, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=0)  # fmt: skip
    assert torch.equal(out.sequences[:, 5:], mine)
    caches = model.new_caches(5 + new)
    with torch.no_grad():
        steps = [model.logits(model.hidden_states(prompt, caches=caches)[:, -1])]
        for token in mine[:, :-1].T:  # each generated token in turn, against the cache
            steps.append(model.logits(model.hidden_states(token[:, None], caches=caches)[:, -1]))
    torch.testing.assert_close(torch.stack(out.logits, 1), torch.stack(steps, 1), rtol=0, atol=1e-4)


def test_a_written_folder_loads_in_transformers_and_comes_back_with_the_pattern(pair, tmp_path):
    model, _ = pair
    zoo.to_hf(model, tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    back = zoo.from_hf(tmp_path)
    assert [type(block.attn.position).__name__ for block in back.blocks] == [
        type(block.attn.position).__name__ for block in model.blocks]  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(theirs(IDS).logits, model(IDS), rtol=0, atol=1e-4)
        assert torch.equal(back(IDS), model(IDS))


def test_what_smollm3_cannot_hold_is_refused_by_name_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match=r"^block.attn.xsa=True: SmolLM3ForCausalLM \(smollm3\) has no counterpart"):
        zoo.to_hf(drawn([*TINY, "block.attn.xsa=true"]), tmp_path, family="smollm3")
    with pytest.raises(ConfigError, match=r"^model.layers.4.pos.base=500.0: .*every layer alike in block.pos.base"):
        zoo.to_hf(drawn([*TINY, "+model.layers.4.pos.base=500.0"]), tmp_path, family="smollm3")
    assert not any(tmp_path.iterdir())


def test_an_import_of_what_zoo_cannot_build_is_refused_by_name():
    config = transformers.SmolLM3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                        num_hidden_layers=4, intermediate_size=48, use_sliding_window=True,
                                        sliding_window=8, pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
    with pytest.raises(ConfigError, match=r"^use_sliding_window=True: false"):
        zoo.from_hf(transformers.SmolLM3ForCausalLM(config))
    config.use_sliding_window, config.rope_parameters = False, {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}
    with pytest.raises(ConfigError, match=r"^rope_parameters.rope_type='yarn'"):
        zoo.from_hf(transformers.SmolLM3ForCausalLM(config))
