"""preset=qwen3_next against transformers' Qwen3NextForCausalLM: the preset's model (three Gated DeltaNet layers to
one full-attention layer, a sparse MoE with a gated shared expert) with every weight drawn at random, exported, gives
the same logits in float32 and in float64, decodes the same tokens with its cache, and comes back through a
checkpoint folder with the same logits and the same layers."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import lift_to_float64
from omegaconf import OmegaConf

import zoo
from zoo.core.errors import ConfigError
from zoo.lab.recipe.param import infer_for, parametrize
from zoo.models.hf import from_hf, to_hf, to_hf_model
from zoo.models.hf.family import model_settings
from zoo.models.hf.qwen3_next import QWEN3_NEXT

transformers = pytest.importorskip("transformers")  # installed by .ci/run (the hf extra)
from transformers.models.qwen3_next import modeling_qwen3_next as qwen  # noqa: E402

#: The preset at a tiny width (its head widths, heads and experts as the preset sets them): one period, 4 layers.
TINY = ["preset=qwen3_next", "block.d_model=32", "model.vocab_size=64"]
IDS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
FLOAT32 = 1e-4
FLOAT64 = 1e-10


def drawn(*overrides: str) -> zoo.LanguageModel:
    """The preset's model with every parameter drawn (zero or constant inits hide a swapped layout), eval mode."""
    torch.manual_seed(0)
    model = zoo.build_model(zoo.compose([*TINY, *overrides])).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


@pytest.fixture(scope="module")
def model() -> zoo.LanguageModel:
    return drawn()


def test_the_preset_is_the_released_models_block_and_pattern():
    """Read from the composed config, not from the exporter: the 3:1 pattern, and each layer's parts."""
    cfg = zoo.compose(["preset=qwen3_next"])
    built = zoo.build_model(cfg)
    assert [type(b.attn).__name__ for b in built.blocks] == ["GatedDeltaNet"] * 3 + ["Attention"]
    linear, full = built.blocks[0].attn, built.blocks[3].attn
    assert (linear.n_heads, linear.n_key_heads, linear.d_key, linear.d_head) == (8, 4, 16, 16)
    assert linear.out.in_features == 2 * cfg.block.d_model  # values twice d_model wide, as the released model's
    assert (full.n_heads, full.n_kv_heads, full.d_head, full.position.rotated) == (4, 2, 32, 8)
    assert all(b.mlp.n_experts == 8 and b.mlp.shared_gate is not None for b in built.blocks)
    assert built.head is not None and built.num_parameters() == 394208


def test_the_exported_config_is_qwen3_nexts_at_the_presets_sizes(model):
    """The class, each layer's type from the preset's pattern, and the sizes the preset sets."""
    cfg = OmegaConf.to_container(zoo.compose(TINY), resolve=True)
    theirs = to_hf_model(model)
    config = theirs.config
    linear = cfg["model"]["pattern"][0]
    kinds = ["linear_attention" if e.get("attn", {}).get("name") == "gated_deltanet" else "full_attention"
             for e in cfg["model"]["pattern"]]  # fmt: skip
    assert type(theirs) is qwen.Qwen3NextForCausalLM and config.model_type == "qwen3_next"
    assert config.layer_types == kinds == ["linear_attention"] * 3 + ["full_attention"]
    block = cfg["block"]
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (
        block["d_model"], block["n_heads"], block["attn"]["n_kv_heads"], block["attn"]["head_dim"])
    assert (config.linear_num_value_heads, config.linear_num_key_heads, config.linear_key_head_dim,
            config.linear_value_head_dim) == (linear["n_heads"], linear["attn"]["n_key_heads"], linear["attn"]["d_key"],
                                              linear["attn"]["head_dim"])  # fmt: skip
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": block["pos"]["base"],
                                      "partial_rotary_factor": block["pos"]["rotary_fraction"]}  # fmt: skip
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
            config.shared_expert_intermediate_size, config.norm_topk_prob) == (
        block["mlp"]["n_experts"], block["mlp"]["top_k"], block["d_ff"], block["d_ff"], True)  # fmt: skip
    assert config.rms_norm_eps == block["norm"]["eps"] and config.mlp_only_layers == []
    assert config.decoder_sparse_step == 1 and config.tie_word_embeddings is False


def test_same_logits_in_float32_and_float64(model, monkeypatch):
    """float32 within 1e-4; float64 within 1e-10: the zoo model cast, exported in float64 (the convolution's kernel,
    which zoo stores less the identity, summed in float64), transformers' float32 casts lifted (its norms, router,
    rotary and recurrence compute in float32 on purpose)."""
    theirs = to_hf_model(model)
    with torch.no_grad():
        diff32 = (theirs(IDS).logits - model(IDS)).abs().max().item()
        lift_to_float64(monkeypatch, qwen)  # .float() keeps float64: the export's weights and rotary frequencies too
        mine = copy.deepcopy(model).double()
        torch.set_default_dtype(torch.float64)  # transformers' model built in float64, the weights loaded as they are
        try:
            theirs = to_hf_model(mine)
        finally:
            torch.set_default_dtype(torch.float32)
        theirs.set_experts_implementation("eager")  # grouped_mm counts tokens with a float histogram
        diff64 = (theirs(IDS).logits - mine(IDS)).abs().max().item()
    print(f"max |logits difference|: float32 {diff32:.2e}, float64 {diff64:.2e}")
    assert diff32 < FLOAT32 and diff64 < FLOAT64


def test_cached_decoding_equals_transformers_generate(model):
    """Greedy decoding of 6 tokens after a 5-token prompt (through every layer of the pattern at each step): zoo's
    cache (its Gated DeltaNet state and convolution tail, the attention's keys and values) and transformers'
    generate with its cache: the same tokens, each step's logits within the float32 tolerance."""
    theirs = to_hf_model(model)
    prompt, steps = IDS[:, :5], 6
    out = theirs.generate(prompt, max_new_tokens=steps, do_sample=False, use_cache=True, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=0)  # fmt: skip
    tokens = model.generate(prompt, steps)
    assert torch.equal(out.sequences[:, 5:], tokens)
    caches = model.new_caches()
    with torch.no_grad():
        logits = [model(prompt, caches=caches)[:, -1]]
        logits += [model(tokens[:, i : i + 1], caches=caches)[:, -1] for i in range(steps - 1)]
    diff = (torch.stack(logits, 1) - torch.stack(out.logits, 1)).abs().max().item()
    print(f"max |step logits difference| over {steps} cached steps: {diff:.2e}")
    assert diff < FLOAT32


def test_a_folder_loads_in_transformers_and_back_with_the_same_logits_and_layers(model, tmp_path):
    to_hf(model, tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    back = from_hf(tmp_path)
    cfg = QWEN3_NEXT.zoo_config(theirs.config)
    with torch.no_grad():
        mine = model(IDS)
        torch.testing.assert_close(theirs(IDS).logits, mine, rtol=0, atol=FLOAT32)
        assert torch.equal(back(IDS), mine)  # the same weights in the same layout: bit for bit
    assert model_settings(back) == model_settings(model) and back.settings == model.settings
    assert len(cfg["model"]["pattern"]) == 4


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("block.attn.xsa=true", "block.attn.xsa"),  # the full-attention layer's option
        ("block.norm.zero_centred=false", "block.norm.zero_centred"),
        ("model.pattern=[{n_heads: 8, pos: none, attn: {name: gated_deltanet, n_key_heads: 4, d_key: 16, "
         "head_dim: 16, norm_eps: 1.0e-05}}, {}]", "block.attn.norm_eps"),  # every linear layer's, not rms_norm_eps
        ("+model.layers.1={attn: {norm_eps: 1.0e-06, allow_neg_eigval: true}}", "model.layers.1.attn.allow_neg_eigval"),
        ("+model.layers.3={attn: {head_dim: 16}}", "model.layers.7.attn.head_dim"),  # layer 7 unlike layer 3
    ],
)
def test_what_qwen3_next_cannot_hold_is_refused_by_name_before_writing(override, field, tmp_path):
    model = drawn(override, "model.n_layers=8")
    out = tmp_path / "hf"
    with pytest.raises(ConfigError) as refused:
        to_hf(model, out, family="qwen3_next")
    assert refused.value.field == field and "Qwen3NextForCausalLM (qwen3_next)" in str(refused.value)
    assert not out.exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                              "original_max_position_embeddings": 64}}, "rope_parameters.rope_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"shared_expert_intermediate_size": 12}, "shared_expert_intermediate_size"),
    ],
)  # fmt: skip
def test_an_import_of_what_zoo_cannot_build_is_refused_by_name(change, field, model):
    config = to_hf_model(model).config.to_dict()
    config = transformers.Qwen3NextConfig(**{**config, **change})
    with pytest.raises(ConfigError) as refused:
        from_hf(qwen.Qwen3NextForCausalLM(config))
    assert refused.value.field == field


def test_a_dense_layer_exports_as_mlp_only_layers_and_comes_back():
    model = drawn("+model.layers.3={mlp: swiglu, d_ff: 48}")
    theirs = to_hf_model(model)
    assert theirs.config.mlp_only_layers == [3] and theirs.config.intermediate_size == 48
    back = from_hf(theirs)
    with torch.no_grad():
        torch.testing.assert_close(theirs(IDS).logits, model(IDS), rtol=0, atol=FLOAT32)
        assert torch.equal(back(IDS), model(IDS))
    assert model_settings(back) == model_settings(model)


def test_an_import_of_a_sparse_step_gives_its_dense_layers_in_the_pattern(model):
    """decoder_sparse_step 2: layers 0 and 2 dense (Qwen3NextMLP), 1 and 3 sparse; every weight drawn."""
    config = {**to_hf_model(model).config.to_dict(), "decoder_sparse_step": 2, "intermediate_size": 48}
    torch.manual_seed(0)
    theirs = qwen.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**config)).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.3)
    back = from_hf(theirs)
    assert [b.mlp.__class__.__name__ for b in back.blocks] == ["SwiGLU", "MoE", "SwiGLU", "MoE"]
    assert len(QWEN3_NEXT.zoo_config(theirs.config)["model"]["pattern"]) == 4
    with torch.no_grad():
        torch.testing.assert_close(back(IDS), theirs(IDS).logits, rtol=0, atol=FLOAT32)


def test_a_mup_model_exports_with_its_score_multiplier_on_the_query_norm():
    """Under μP a full-attention layer without a set head_dim scores q . k x s; its queries are RMS-normalized after
    qkv, so the export multiplies the zero-centred q_norm's gain (1 + w) by s sqrt(d_head)."""
    raw = OmegaConf.to_container(zoo.compose([*TINY, "block.d_model=64", "block.attn.head_dim=null"]), resolve=True)
    raw["param"] = {"name": "mup", "base_width": 32}
    torch.manual_seed(0)
    model = parametrize(zoo.build_model(raw), infer_for(raw, 32)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    assert model.blocks[3].attn.score_scale not in (None, 16**-0.5)
    with torch.no_grad():
        torch.testing.assert_close(to_hf_model(model)(IDS).logits, model(IDS), rtol=0, atol=FLOAT32)
