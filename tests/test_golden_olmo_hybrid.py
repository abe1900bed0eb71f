"""preset=olmo_hybrid against transformers' OlmoHybridForCausalLM: the preset's model with every parameter drawn,
copied into the transformers class at the same small config, gives the same logits (float32, and float64 with the
module's float32 casts lifted), decodes the same tokens with its cache across the Gated DeltaNet and attention
layers, and goes through a checkpoint folder and back; what the family cannot hold is refused by name."""

from __future__ import annotations

import pytest
import torch
from helpers import lift_to_float64

import zoo
from zoo.core.errors import ConfigError
from zoo.models.hf import from_hf, to_hf_model
from zoo.models.hf.family import model_settings

transformers = pytest.importorskip("transformers")
from transformers.models.olmo_hybrid import modeling_olmo_hybrid as olmo  # noqa: E402

#: The preset at d_model 32 (attention heads 8 wide; Gated DeltaNet key heads 6, value heads 12, as the released
#: 0.75 d_model / n_heads and twice that), two periods of its pattern.
TINY = ["preset=olmo_hybrid", "block.d_model=32", "block.n_heads=4", "block.d_ff=48", "model.n_layers=8",
        *(f"model.pattern.{i}.attn.{key}={value}" for i in range(3) for key, value in (("d_key", 6), ("head_dim", 12)))]
NO_NEGATIVE_EIGENVALUES = [f"model.pattern.{i}.attn.allow_neg_eigval=false" for i in range(3)]
VARIANTS = {
    "preset (mha, NoPE, untied)": [],
    "rotary, gqa, tied, no negative eigenvalues": ["pos=rotary", "attn=gqa", "model.tie_embeddings=true",
                                                   *NO_NEGATIVE_EIGENVALUES],
}  # fmt: skip
IDS = torch.randint(0, 256, (2, 13), generator=torch.Generator().manual_seed(1))


def drawn(extra: list[str] = ()) -> zoo.LanguageModel:
    """The tiny preset's model (eval) with every parameter drawn off its init (a gain of one or a zero hides a swap)."""
    torch.manual_seed(0)
    model = zoo.build_model(zoo.compose([*TINY, *extra])).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_equal_transformers_in_float32(variant):
    model = drawn(VARIANTS[variant])
    theirs = to_hf_model(model)
    assert type(theirs) is olmo.OlmoHybridForCausalLM
    with torch.no_grad():
        diff = (theirs(IDS).logits - model(IDS)).abs().max().item()
    print(f"float32 max |logits difference| ({variant}): {diff:.2e}")
    assert diff < 1e-4


def test_logits_equal_transformers_in_float64(monkeypatch):
    """transformers computes its norms, rotary tables and delta rule in float32 whatever the input: those casts
    are lifted (helpers.lift_to_float64) once both models are built, so both run wholly in float64 on the same
    weights."""
    model = drawn(VARIANTS["rotary, gqa, tied, no negative eigenvalues"])
    with torch.no_grad():  # the export adds the identity tap back to each kernel in float32: drawn so that is exact
        for attn in (block.attn for block in model.blocks if hasattr(block.attn, "present")):
            attn.conv.copy_(torch.round(attn.conv * 4096) / 4096)
    theirs, model = to_hf_model(model).double(), model.double()
    lift_to_float64(monkeypatch, olmo)
    rotary = theirs.model.rotary_emb  # its inverse frequencies were computed in float32 when it was built
    rotary.inv_freq = rotary.compute_default_rope_parameters(theirs.config)[0]
    with torch.no_grad():
        diff = (theirs(IDS).logits - model(IDS)).abs().max().item()
    print(f"float64 max |logits difference|: {diff:.2e}")
    assert diff < 1e-10


def test_the_exported_config_is_olmo_hybrids_at_the_presets_sizes():
    """Read from the zoo model, not through the exporter: the layer types are the pattern's, sizes as set."""
    model = drawn()
    config = to_hf_model(model).config
    assert type(config) is transformers.OlmoHybridConfig and config.model_type == "olmo_hybrid"
    kinds = ["linear_attention" if type(b.attn).__name__ == "GatedDeltaNet" else "full_attention" for b in model.blocks]
    assert config.layer_types == kinds == (["linear_attention"] * 3 + ["full_attention"]) * 2
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads) == (32, 4, 4)
    assert (config.intermediate_size, config.num_hidden_layers, config.vocab_size) == (48, 8, 256)
    assert (config.linear_num_key_heads, config.linear_num_value_heads) == (4, 4)
    assert (config.linear_key_head_dim, config.linear_value_head_dim, config.linear_conv_kernel_dim) == (6, 12, 4)
    assert config.linear_allow_neg_eigval is True and config.rms_norm_eps == 1e-6
    assert config.rope_parameters["rope_theta"] is None and config.tie_word_embeddings is False  # NoPE, untied


def zoo_steps(model: zoo.LanguageModel, prompt: torch.Tensor, n: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and each step's logits, the prompt prefilled into zoo's per-layer states, then one token."""
    caches, ids, tokens, logits = model.new_caches(prompt.shape[1] + n), prompt, [], []
    for _ in range(n):
        step = model.logits(model.hidden_states(ids, caches=caches)[:, -1])
        logits.append(step)
        tokens.append(int(step.argmax(-1)))
        ids = step.argmax(-1, keepdim=True)
    return tokens, logits


def hf_steps(theirs: torch.nn.Module, prompt: torch.Tensor, n: int) -> tuple[list[int], list[torch.Tensor]]:
    """The same with transformers' cache (convolution and recurrent states beside keys and values)."""
    cache, ids, tokens, logits = None, prompt, [], []
    for _ in range(n):
        out = theirs(ids, cache=cache, use_cache=True)
        cache, step = out.cache, out.logits[:, -1]
        logits.append(step)
        tokens.append(int(step.argmax(-1)))
        ids = step.argmax(-1, keepdim=True)
    return tokens, logits


@pytest.mark.parametrize("extra", list(VARIANTS.values()), ids=list(VARIANTS))
def test_cached_greedy_decoding_equals_transformers(extra):
    """12 new tokens after a 5-token prompt, each through every layer of both kinds with its state carried."""
    model, n = drawn(extra), 12
    theirs, prompt = to_hf_model(model), IDS[:1, :5]
    with torch.no_grad():
        mine, my_logits = zoo_steps(model, prompt, n)
        tokens, their_logits = hf_steps(theirs, prompt, n)
        generated = theirs.generate(prompt, max_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=0)
        assert model.generate(prompt, n)[0].tolist() == mine  # zoo's own generate, with its cache
    assert mine == tokens == generated[0, 5:].tolist()
    diff = max((a - b).abs().max().item() for a, b in zip(my_logits, their_logits, strict=True))
    print(f"cached decoding, max |step logits difference| over {n} steps: {diff:.2e}")
    assert diff < 1e-4


def test_a_checkpoint_folder_loads_in_transformers_and_back_with_the_same_logits(tmp_path):
    model = drawn()
    zoo.to_hf(model, tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(theirs) is olmo.OlmoHybridForCausalLM and theirs.model.rotary_emb is None  # NoPE survives the file
    back = from_hf(tmp_path)
    with torch.no_grad():
        mine = model(IDS)
        torch.testing.assert_close(theirs(IDS).logits, mine, rtol=0, atol=1e-4)
        assert torch.equal(back(IDS), mine)  # the same weights in the same layout
    assert model_settings(back) == model_settings(model)  # every layer's settings: the pattern and its sizes


def test_a_transformers_model_imports_with_its_layer_types_as_a_pattern():
    """A model transformers drew (not one zoo wrote): 2 key heads for 4 value heads, rotary, and layer types that
    repeat every 5 layers (a 5-entry pattern, truncated at 7 layers)."""
    types = ["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"]
    config = transformers.OlmoHybridConfig(
        vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=7, num_attention_heads=4,
        num_key_value_heads=2, layer_types=(types * 2)[:7], linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=6, linear_value_head_dim=10, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        pad_token_id=None, eos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    theirs = olmo.OlmoHybridForCausalLM(config).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.2 * torch.randn_like(p))
    model = from_hf(theirs)
    assert [type(b.attn).__name__ for b in model.blocks][:5] == ["GatedDeltaNet", "Attention", *["GatedDeltaNet"] * 2,
                                                                 "Attention"]  # fmt: skip
    assert model.blocks[0].attn.n_key_heads == 2 and model.blocks[1].attn.position.base == 500.0
    with torch.no_grad():
        torch.testing.assert_close(model(IDS % 64), theirs(IDS % 64).logits, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["block.attn.xsa=true"], "block.attn.xsa=True"),
        ([f"+model.pattern.{i}.attn.norm_eps=1e-6" for i in range(3)], "block.attn.norm_eps=1e-06"),
        (["+model.pattern.0.attn.norm_eps=1e-6"], "model.layers.1.attn.norm_eps=1e-05"),  # unlike layer 0
        (["model.pattern.1.attn.d_key=4"], "model.layers.1.attn.d_key=4"),
        (["+model.pattern.3.placement=pre"], "model.layers.3.placement='pre'"),
        (["model.pattern=[{}]"], "block.attn='mha'"),
    ],
)
def test_what_olmo_hybrid_cannot_hold_is_refused_by_name_before_anything_is_written(extra, field, tmp_path):
    with pytest.raises(ConfigError, match="OlmoHybridForCausalLM") as error:
        zoo.to_hf(drawn(extra), tmp_path)
    assert str(error.value).startswith(field), str(error.value)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, "rope_parameters.rope_type"),
        ({"attention_bias": True}, "attention_bias"),
        ({"linear_num_key_heads": 3}, "linear_num_key_heads"),
    ],
)
def test_an_olmo_hybrid_config_zoo_cannot_build_is_refused_by_name(change, field):
    config = transformers.OlmoHybridConfig(
        vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        layer_types=["linear_attention", "full_attention"], linear_key_head_dim=6, linear_value_head_dim=12,
        pad_token_id=None, eos_token_id=None, **change,
    )  # fmt: skip
    with pytest.raises(ConfigError) as error:
        from_hf(olmo.OlmoHybridForCausalLM(config))
    assert error.value.field == field
