"""preset=deepseek_v3 against transformers' DeepseekV3ForCausalLM: the preset's model with every parameter and the
experts' bias drawn at random, exported, gives the same logits (float32 within 1e-4; float64 to 1e-10 with the
module's float32 casts lifted), decodes the same greedy tokens through its caches, round-trips through a checkpoint
folder, and what the family cannot hold is refused by name."""

from __future__ import annotations

import pytest
import torch
from helpers import lift_to_float64

import zoo
from zoo.core.errors import ConfigError
from zoo.models.hf import to_hf_model
from zoo.models.hf.family import model_settings

transformers = pytest.importorskip("transformers")

#: Tiny: 3 layers (the dense one, two of experts), 4 heads of 8 content and 4 rotary features, 8 experts in 4 groups.
TINY = ["preset=deepseek_v3", "block.d_model=32", "block.d_ff=16", "model.n_layers=3", "model.layers.0.d_ff=48",
        "block.attn.kv_rank=16", "block.attn.q_rank=12", "block.attn.rope_dim=4"]  # fmt: skip
IDS = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(1))


def drawn(*overrides: str) -> zoo.LanguageModel:
    """The tiny preset's model, every parameter and buffer (the experts' bias) drawn."""
    torch.manual_seed(0)
    model = zoo.build_model(zoo.compose([*TINY, *overrides])).eval()
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.normal_(0, 0.3)
    return model


@pytest.fixture
def deepseek64(monkeypatch):
    """transformers' DeepSeek-V3 module with its float32 casts (norms, router, softmax, rotary) in float64."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek

    lift_to_float64(monkeypatch, deepseek)


def test_the_export_is_deepseek_v3_at_the_presets_sizes():
    """Read from transformers' own model, not the exporter: the class, the dense layer then experts, the sizes."""
    model = drawn()
    theirs = to_hf_model(model)
    config, layers = theirs.config, theirs.model.layers
    assert type(theirs).__name__ == "DeepseekV3ForCausalLM" and config.model_type == "deepseek_v3"
    assert [type(layer.mlp).__name__ for layer in layers] == ["DeepseekV3MLP", "DeepseekV3MoE", "DeepseekV3MoE"]
    assert [type(block.mlp).__name__ for block in model.blocks] == ["SwiGLU", "MoE", "MoE"]
    assert config.first_k_dense_replace == 1 and layers[0].mlp.gate_proj.out_features == 48
    attn = layers[1].self_attn
    assert (attn.q_lora_rank, attn.kv_lora_rank, attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.v_head_dim) == (
        12, 16, 8, 4, 8)  # fmt: skip
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0} and config.rope_interleave
    router = layers[2].mlp.gate
    assert (router.num_experts, router.top_k, router.num_group, router.topk_group) == (8, 2, 4, 2)
    assert (router.routed_scaling_factor, router.norm_topk_prob, config.n_shared_experts) == (2.5, True, 1)
    assert layers[2].mlp.experts.intermediate_dim == 16 and config.num_nextn_predict_layers == 0
    assert not config.tie_word_embeddings and config.rms_norm_eps == 1e-6


def test_same_logits_in_float32():
    model = drawn()
    theirs = to_hf_model(model)
    with torch.no_grad():
        difference = (theirs(IDS).logits - model(IDS)).abs().max().item()
    print(f"float32 max abs difference: {difference:.2e}")
    assert difference < 1e-4


#: The preset, and queries projected directly (q_proj) under two dense layers (first_k_dense_replace 2).
VARIANTS = {"preset": [], "q_proj, 2 dense": ["block.attn.q_rank=null", "+model.layers.1.mlp=swiglu",
                                               "+model.layers.1.d_ff=48"]}  # fmt: skip


@pytest.mark.parametrize("overrides", list(VARIANTS.values()), ids=list(VARIANTS))
def test_same_logits_in_float64(overrides, deepseek64):
    model = drawn(*overrides)  # drawn in float32, so both sides hold the same float64 weights
    theirs, model = to_hf_model(model).double(), model.double()
    theirs.set_experts_implementation("eager")  # grouped_mm counts tokens with .float(), which float64 lifts
    with torch.no_grad():
        ours = model(IDS)
        difference = (theirs(IDS).logits - ours).abs().max().item()
    print(f"float64 max abs difference ({', '.join(overrides) or 'preset'}): {difference:.2e}")
    assert theirs.config.first_k_dense_replace == sum(type(block.mlp).__name__ == "SwiGLU" for block in model.blocks)
    assert difference < 1e-10


def test_cached_greedy_decoding_equals_transformers():
    """Greedy decoding with each side's cache (zoo's latent caches, transformers' DynamicCache) past every layer:
    the same tokens, and each step's logits alike, step by step."""
    model = drawn()
    theirs = to_hf_model(model)
    prompt, steps = IDS[:, :5], 8
    ours = model.generate(prompt, steps)
    with torch.no_grad():
        hf = theirs.generate(prompt, max_new_tokens=steps, do_sample=False, use_cache=True, pad_token_id=0)
    assert torch.equal(hf[:, prompt.shape[1] :], ours)
    caches, cache, ids = model.new_caches(prompt.shape[1] + steps), transformers.DynamicCache(), prompt
    with torch.no_grad():
        for _ in range(steps):
            mine = model(ids, caches=caches)[:, -1]
            out = theirs(ids, cache=cache, use_cache=True)
            torch.testing.assert_close(out.logits[:, -1], mine, rtol=0, atol=1e-4)
            cache, ids = out.cache, mine.argmax(-1, keepdim=True)


def test_a_folder_loads_in_transformers_and_back_with_the_same_config(tmp_path):
    model = drawn()
    zoo.to_hf(model, tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(theirs).__name__ == "DeepseekV3ForCausalLM"
    back = zoo.from_hf(tmp_path)
    with torch.no_grad():
        mine = model(IDS)
        torch.testing.assert_close(theirs(IDS).logits, mine, rtol=0, atol=1e-4)
        assert torch.equal(back(IDS), mine)  # the same weights in the same layout: bit for bit
    assert model_settings(back) == model_settings(model)  # every layer's every setting: the dense layer first


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("block.attn.xsa=true", "block.attn.xsa=True"),
        ("block.mlp.router_bias=true", "block.mlp.router_bias=True"),  # an option of the experts' layers alone
        ("+model.layers.2.mlp=swiglu", "model.layers.2.mlp='swiglu'"),  # a dense layer after the experts
        ("+model.layers.2.d_ff=24", "model.layers.2.d_ff=24"),  # experts of two widths
        ("block.mlp.routing=softmax", "block.mlp.routing='softmax'"),
    ],
)
def test_what_the_family_cannot_hold_is_refused_by_name(override, field, tmp_path):
    with pytest.raises(ConfigError, match="DeepseekV3ForCausalLM") as error:
        zoo.to_hf(drawn(override), tmp_path, family="deepseek_v3")
    assert str(error.value).startswith(field), str(error.value)
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                              "original_max_position_embeddings": 4096}}, "rope_parameters.rope_type='yarn'"),
        ({"rope_interleave": False}, "rope_interleave=False"),
        ({"qk_nope_head_dim": 16}, "qk_nope_head_dim=16"),
    ],
)  # fmt: skip
def test_an_import_zoo_cannot_build_is_refused_by_name(change, field):
    config = to_hf_model(drawn()).config.to_dict()
    config = transformers.DeepseekV3Config(**{**config, **change})
    with pytest.raises(ConfigError) as error:
        zoo.from_hf(transformers.DeepseekV3ForCausalLM(config))
    assert str(error.value).startswith(field), str(error.value)
