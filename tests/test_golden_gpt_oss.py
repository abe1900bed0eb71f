"""preset=gpt_oss against transformers' GptOssForCausalLM: the preset's model at a tiny size, every parameter drawn
at random, copied into the transformers class gives its logits (float32 to 1e-4; float64 to 1e-10, transformers'
float32 casts in its norms and rotary lifted), decodes the same tokens with both caches across its sliding and
full layers, exports and imports through a folder, and what the family cannot hold is refused by name."""

from __future__ import annotations

import pytest
import torch
from helpers import lift_to_float64
from omegaconf import OmegaConf

import zoo
from zoo.core.errors import ConfigError
from zoo.models.hf import FAMILIES, from_hf, to_hf_model
from zoo.models.hf.family import model_settings

transformers = pytest.importorskip("transformers")  # the hf extra
from transformers.models.gpt_oss import modeling_gpt_oss  # noqa: E402

#: The preset at a tiny size, its pattern as the preset has it (sliding window 32, then full attention), 2 periods.
TINY = ["preset=gpt_oss", "block.d_model=32", "block.n_heads=4", "block.attn.head_dim=12", "block.d_ff=24",
        "block.mlp.n_experts=4", "model.n_layers=4", "model.vocab_size=64"]  # fmt: skip
WINDOW = 32
#: Longer than the window, so the sliding layers drop keys that the full ones keep.
IDS = torch.randint(0, 64, (2, WINDOW + 8), generator=torch.Generator().manual_seed(1))
FLOAT32, FLOAT64 = 1e-4, 1e-10


def drawn(*overrides: str) -> zoo.LanguageModel:
    """The tiny preset's model (eval mode) with every parameter drawn: no zero bias or unit gain hides a swap."""
    torch.manual_seed(0)
    model = zoo.build_model(zoo.compose([*TINY, *overrides])).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    return model


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def test_logits_equal_transformers_in_float32():
    model = drawn()
    theirs = to_hf_model(model)
    assert type(theirs) is transformers.GptOssForCausalLM
    with torch.no_grad():
        diff = max_diff(model(IDS), theirs(IDS).logits)
    print(f"gpt_oss float32 max |logits diff| = {diff:.1e}")
    assert diff < FLOAT32


def test_logits_equal_transformers_in_float64(monkeypatch):
    """transformers' norms and rotary compute in float32 whatever the input: lifted to float64 (the model built
    under the lift, so its rotary frequencies are float64 too), and its experts run by their eager loop (the
    grouped matmul takes no float64)."""
    model = drawn()
    lift_to_float64(monkeypatch, modeling_gpt_oss)
    theirs = to_hf_model(model).double()
    theirs.set_experts_implementation("eager")
    with torch.no_grad():
        diff = max_diff(model.double()(IDS), theirs(IDS).logits)
    print(f"gpt_oss float64 max |logits diff| = {diff:.1e}")
    assert diff < FLOAT64


def test_the_exported_config_is_gpt_oss_at_the_presets_sizes():
    """Read from the composed config and transformers' own modules, not from the exporter."""
    cfg = zoo.compose(TINY)
    theirs = to_hf_model(zoo.build_model(cfg))
    config = theirs.config
    kinds = ["sliding_attention" if entry.get("attn", {}).get("window") else "full_attention"
             for entry in OmegaConf.to_container(cfg.model.pattern)]  # fmt: skip
    assert kinds == ["sliding_attention", "full_attention"]
    assert config.layer_types == kinds * 2 and config.sliding_window == WINDOW
    assert [layer.self_attn.sliding_window for layer in theirs.model.layers] == [WINDOW, None] * 2
    heads = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim)
    assert heads == (32, 4, 2, 12)
    assert (config.num_local_experts, config.num_experts_per_tok, config.intermediate_size) == (4, 2, 24)
    assert (config.num_hidden_layers, config.vocab_size, config.tie_word_embeddings) == (4, 64, False)
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 150000.0}
    options = (config.rms_norm_eps, config.swiglu_limit, config.swiglu_alpha, config.attention_bias)
    assert options == (1e-5, 7.0, 1.702, True)


def test_cached_greedy_decoding_equals_transformers_across_sliding_and_full_layers():
    """From a prompt 4 short of the window, 12 tokens: the sliding layers' caches drop keys from the 5th on, the full
    layers' keep them; the tokens are transformers' generate's, each step's logits its within float32's tolerance."""
    model = drawn()
    theirs = to_hf_model(model)
    prompt, n = IDS[:, : WINDOW - 4], 12
    ours = model.generate(prompt, n)
    out = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False,
                          use_cache=True, output_logits=True, return_dict_in_generate=True, pad_token_id=0)  # fmt: skip
    assert torch.equal(out.sequences[:, prompt.shape[1] :], ours)
    caches = model.new_caches(prompt.shape[1] + n)
    with torch.no_grad():
        steps = [model(prompt, caches=caches)[:, -1]]
        steps += [model(token[:, None], caches=caches)[:, -1] for token in ours.T[:-1]]
    diff = max(max_diff(mine, step) for mine, step in zip(steps, out.logits, strict=True))
    print(f"gpt_oss cached decoding max |step logits diff| = {diff:.1e}")
    assert diff < FLOAT32


def test_export_to_a_folder_loads_in_transformers_and_imports_back_to_the_same_model(tmp_path):
    model = drawn()
    zoo.to_hf(model, tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(theirs) is transformers.GptOssForCausalLM
    back = from_hf(tmp_path)
    with torch.no_grad():
        mine = model(IDS)
        assert max_diff(theirs(IDS).logits, mine) < FLOAT32
        assert torch.equal(back(IDS), mine)  # the same weights in the same layout: bit for bit
    assert model_settings(back) == model_settings(model)  # every layer's settings, the windows among them
    pattern = FAMILIES["gpt_oss"].zoo_config(theirs.config)["model"]["pattern"]
    assert pattern == OmegaConf.to_container(zoo.compose(TINY).model.pattern)


def tiny_config(**change: object) -> object:
    """A tiny GptOssConfig (default RoPE, eps 1e-6, base 1000: not the preset's) with ``change``."""
    sizes = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12, "num_local_experts": 4,
             "num_experts_per_tok": 2, "rms_norm_eps": 1e-6}  # fmt: skip
    rope = {"rope_type": "default", "rope_theta": 1000.0}
    return transformers.GptOssConfig(**{**sizes, "rope_parameters": rope, **change})


@pytest.mark.parametrize(
    ("layer_types", "pattern"),
    [
        (["sliding_attention", "sliding_attention", "full_attention"], [{"attn": {"window": 6}}] * 2 + [{}]),
        (["full_attention"] * 2, []),
        (["sliding_attention"] * 2, []),  # the window then on the block
    ],
)
def test_import_of_a_transformers_model_reads_its_layer_types_as_the_pattern(layer_types, pattern):
    config = tiny_config(num_hidden_layers=len(layer_types), layer_types=layer_types, sliding_window=6)
    torch.manual_seed(0)
    theirs = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.5)
    model = from_hf(theirs)
    assert FAMILIES["gpt_oss"].zoo_config(config)["model"]["pattern"] == pattern
    assert [block.attn.window for block in model.blocks] == [6 if kind == "sliding_attention" else None
                                                             for kind in layer_types]  # fmt: skip
    ids = IDS[:, :16]  # past the window
    with torch.no_grad():
        assert max_diff(model(ids), theirs(ids).logits) < FLOAT32


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("block.attn.xsa=true", "block.attn.xsa=True"),
        ("block.attn.sink=none", "block.attn.sink='none'"),
        ("block.mlp.expert=swiglu", "block.mlp.expert='swiglu'"),
        ("+model.layers.2.attn.window=16", "model.layers.2.attn.window=16"),  # gpt-oss has one sliding_window
    ],
)
def test_what_gpt_oss_cannot_hold_is_refused_by_name_before_anything_is_written(override, field, tmp_path):
    with pytest.raises(ConfigError) as error:
        zoo.to_hf(drawn(override), tmp_path)
    assert str(error.value).startswith(field) and "GptOssForCausalLM (gpt_oss)" in str(error.value), str(error.value)
    assert not any(tmp_path.iterdir())


def test_an_import_of_the_released_yarn_rope_is_refused_by_name(tmp_path):
    """The released checkpoints' config (GptOssConfig's own default): YaRN, factor 32; zoo's rotary is unscaled."""
    transformers.GptOssForCausalLM(tiny_config(rope_parameters=None)).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"^rope_parameters.rope_type='yarn': zoo's rotary is the default"):
        from_hf(tmp_path)


@pytest.mark.parametrize(
    ("change", "field"),
    [({"attention_bias": False}, "attention_bias"), ({"swiglu_limit": 5.0}, "swiglu_limit"),
     ({"swiglu_alpha": 1.0}, "swiglu_alpha"), ({"layer_types": ["chunked_attention"] * 2}, r"layer_types\[0\]")],
)  # fmt: skip
def test_an_import_zoo_cannot_build_is_refused_by_name(change, field):
    with pytest.raises(ConfigError, match=f"^{field}="):
        from_hf(transformers.GptOssForCausalLM(tiny_config(**change)))


def test_the_preset_takes_its_sizes_from_the_command_line_and_refuses_a_depth_shorter_than_its_pattern():
    model = zoo.build_model(zoo.compose(["preset=gpt_oss", "block.d_model=48", "model.n_layers=6"]))
    assert model.embed.embedding_dim == 48 and [block.attn.window for block in model.blocks] == [WINDOW, None] * 3
    with pytest.raises(ConfigError, match=r"^model.pattern\[1\]=\{\}: past the depth"):
        zoo.build_model(zoo.compose(["preset=gpt_oss", "model.n_layers=1"]))
