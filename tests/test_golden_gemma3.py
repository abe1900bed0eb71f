"""``preset=gemma3`` against transformers' ``Gemma3ForCausalLM`` at a tiny size: the preset's model with every
parameter drawn at random, exported, gives the same logits (float32 to 1e-4; float64 to 1e-10 with the float32
steps of transformers' Gemma 3, its norms and rotary tables, lifted), decodes the same tokens with its
cache across the local and global layers, saves, loads and comes back with the same logits and config; what the
family cannot hold is refused by name both ways."""

from __future__ import annotations

import importlib

import pytest
import torch
from omegaconf import OmegaConf

import zoo
from zoo import build_model, compose
from zoo.core.errors import ConfigError
from zoo.models.hf import FAMILIES, from_hf, to_hf, to_hf_model
from zoo.models.hf.family import model_settings

transformers = pytest.importorskip("transformers")  # installed by .ci/run (the hf extra)

#: The preset at a tiny size: 4 query heads of 16 features (not 32 / 4), 2 key/value heads, scores at 12^-0.5,
#: 8 layers (the 6-layer pattern, then 2 more local layers, as the 1B's 26 end), window 32 from the preset.
TINY = ["preset=gemma3", "block.d_model=32", "block.d_ff=48", "block.attn.head_dim=16", "block.attn.n_kv_heads=2",
        "block.attn.scale_dim=12", "model.n_layers=8", "model.vocab_size=64"]  # fmt: skip
#: Longer than the window, so the local layers' mask (and, decoding, the sliding cache) matters.
IDS = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(3))


def random_model(overrides: list[str] = TINY) -> zoo.LanguageModel:
    """The model of ``overrides`` with every parameter drawn anew (norm gains included, so a swap shows)."""
    torch.manual_seed(0)
    model = build_model(compose(overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return model


@pytest.fixture(scope="module")
def pair() -> tuple[zoo.LanguageModel, torch.nn.Module]:
    model = random_model()
    return model, to_hf_model(model)


def test_the_exported_config_is_gemma3s_with_the_presets_pattern(pair):
    """Read off the composed config, not the exporter: the class, the layer kinds the pattern gives, the sizes."""
    model, theirs = pair
    cfg = compose(TINY)
    pattern = OmegaConf.to_container(cfg.model.pattern)
    kinds = ["sliding_attention" if "window" in pattern[i % len(pattern)].get("attn", {}) else "full_attention"
             for i in range(cfg.model.n_layers)]  # fmt: skip
    config = theirs.config
    assert type(theirs).__name__ == "Gemma3ForCausalLM" and config.model_type == "gemma3_text"
    assert config.layer_types == kinds == ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 2
    assert config.sliding_window == pattern[0]["attn"]["window"] == 32
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == pattern[0]["pos"]["base"] == 10000.0
    assert config.rope_parameters["full_attention"]["rope_theta"] == cfg.block.pos.base == 1e6
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (32, 48, 8)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 16)
    assert config.query_pre_attn_scalar == 12 and config.hidden_activation == "gelu_pytorch_tanh"
    assert config.rms_norm_eps == cfg.block.norm.eps and config.tie_word_embeddings
    assert config.final_logit_softcapping is None and config.attn_logit_softcapping is None


def float64_throughout(theirs: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> torch.nn.Module:
    """``theirs`` in float64 with transformers' float32 steps lifted: its RMSNorm casts to float32, its rotary
    tables are computed in float32 and its embedding factor is rounded to float32 (each compute in float64 here,
    the formulas unchanged)."""
    module = importlib.import_module(type(theirs).__module__)

    def rotary(self, x, position_ids, layer_type):
        base, dim = self.config.rope_parameters[layer_type]["rope_theta"], self.config.head_dim
        freqs = position_ids[..., None].double() / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    monkeypatch.setattr(module.Gemma3RMSNorm, "forward", lambda self, x: self._norm(x) * (1.0 + self.weight))
    monkeypatch.setattr(module.Gemma3RotaryEmbedding, "forward", rotary)
    theirs = theirs.double()
    theirs.model.embed_tokens.embed_scale.fill_(theirs.config.hidden_size**0.5)
    return theirs


def test_same_logits_in_float32_and_float64(pair, monkeypatch):
    """float32 within 1e-4; float64 within 1e-10 once transformers' float32 steps are lifted (as they stand, its
    norms and rotary tables keep float64 logits to float32's rounding, printed as the third figure)."""
    model, theirs = pair
    with torch.no_grad():
        mine32, theirs32 = model(IDS), theirs(IDS).logits
        mine64, as_is = random_model().double()(IDS), to_hf_model(model).double()(IDS).logits
        theirs64 = float64_throughout(to_hf_model(model), monkeypatch)(IDS).logits
    diffs = [(a - b).abs().max().item() for a, b in ((mine32, theirs32), (mine64, theirs64), (mine64, as_is))]
    print(f"gemma3 golden: max |logits| {mine32.abs().max():.2f}, max abs diff float32 {diffs[0]:.1e}, "
          f"float64 {diffs[1]:.1e} (transformers' float32 casts kept: {diffs[2]:.1e})")  # fmt: skip
    torch.testing.assert_close(theirs32, mine32, rtol=1e-4, atol=1e-4)
    assert theirs64.dtype == torch.float64
    torch.testing.assert_close(theirs64, mine64, rtol=1e-10, atol=1e-10)


def test_cached_greedy_decoding_across_local_and_global_layers(pair):
    """A 30-token prompt and 12 new tokens (past the window of 32): zoo's cache (generate, and a step loop for
    the logits) against transformers' generate with its own cache: the same tokens, each step's logits alike."""
    model, theirs = pair
    prompt, new = IDS[:, :30], 12
    tokens = model.generate(prompt, new)
    out = theirs.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True,
                          output_logits=True, return_dict_in_generate=True,
                          attention_mask=torch.ones_like(prompt))  # fmt: skip
    assert torch.equal(out.sequences[:, 30:], tokens)
    caches, steps, ids = model.new_caches(30 + new), [], prompt
    with torch.no_grad():
        for token in range(new):
            steps.append(model(ids, caches=caches)[:, -1])
            ids = tokens[:, token : token + 1]
    torch.testing.assert_close(torch.stack(out.logits, 1), torch.stack(steps, 1), rtol=1e-4, atol=1e-4)


def test_saved_folder_loads_in_transformers_and_comes_back_with_the_same_config(pair, tmp_path):
    model, _ = pair
    to_hf(model, tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(theirs).__name__ == "Gemma3ForCausalLM"
    back = from_hf(tmp_path)
    with torch.no_grad():
        mine = model(IDS)
        torch.testing.assert_close(theirs(IDS).logits, mine, rtol=1e-4, atol=1e-4)
        assert torch.equal(back(IDS), mine)  # the same weights, in the same layout: bit for bit
    assert model_settings(back) == model_settings(model)
    imported = FAMILIES["gemma3"].zoo_config(theirs.config)["model"]
    assert imported["pattern"] == OmegaConf.to_container(compose(TINY).model.pattern)


def test_a_transformers_gemma3_imports_with_its_logits():
    """A model transformers initialized (not one zoo wrote), its layer kinds from the old sliding_window_pattern
    and rope_local_base_freq keys as the released configs give them, an untied head and a logit softcap."""
    config = transformers.Gemma3TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=16, sliding_window=5, sliding_window_pattern=2,
        rope_theta=5e5, rope_local_base_freq=1e3, final_logit_softcapping=3.0, attn_logit_softcapping=50.0,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    theirs = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    model = from_hf(theirs)
    assert [block.attn.window for block in model.blocks] == [5, None, 5, None]
    assert [block.attn.position.base for block in model.blocks] == [1e3, 5e5, 1e3, 5e5]
    ids = IDS[:, :12]
    with torch.no_grad():
        torch.testing.assert_close(model(ids), theirs(ids).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("override", "field", "needs"),
    [
        ("block.attn.xsa=true", "block.attn.xsa=True", "needs block.attn.xsa=False"),
        ("model.scale_embedding=false", "model.scale_embedding=False", "the embedding times sqrt(d_model)"),
        ("block.norm.zero_centred=false", "block.norm.zero_centred=False", "zero-centred RMSNorm"),
        ("placement=pre", "block.placement='pre'", "sandwich norms"),
        ("+model.layers.1.attn.window=8", "model.layers.1.attn.window=8", "one block.attn.window on every"),
        ("+model.layers.6.pos.base=500.0", "model.layers.6.pos.base=500.0", "one block.pos.base on every"),
    ],
)
def test_what_gemma3_cannot_hold_is_refused_by_name_before_writing(override, field, needs, tmp_path):
    model = build_model(compose([*TINY, override]))
    with pytest.raises(ConfigError, match="Gemma3ForCausalLM \\(gemma3\\)") as error:
        to_hf(model, tmp_path, family="gemma3")
    assert str(error.value).startswith(field) and needs in str(error.value), str(error.value)
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
         "rope_parameters.full_attention.rope_type='linear'"),  # the released 4B's, 12B's and 27B's
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
        ({"attention_bias": True}, "attention_bias=True"),
        ({"hidden_activation": "tanh"}, "hidden_activation='tanh'"),
    ],
)  # fmt: skip
def test_a_gemma3_config_zoo_cannot_build_is_refused_by_name(change, field):
    sizes = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8}  # fmt: skip
    config = transformers.Gemma3TextConfig(**sizes, **change)
    with pytest.raises(ConfigError) as error:
        from_hf(transformers.Gemma3ForCausalLM(config))
    assert str(error.value).startswith(field), str(error.value)
