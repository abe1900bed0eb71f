"""The parts 2026's open model families need (Gemma 3, Qwen3-Next, OLMo 2/3 and OLMo-Hybrid, gpt-oss, nanochat),
each against its transformers module at a tiny config (float64 where the module keeps the input's precision; where
it computes in float32 whatever the input, at float32's tolerance) and against its formula written out by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from zoo import build_block, build_model
from zoo.core.dims import BlockDims
from zoo.parts.attention import fuse_qkv
from zoo.parts.mlps import fuse_gate_up, split_gate_up
from zoo.parts.norms import RMSNorm
from zoo.parts.placements import ReorderedNorm
from zoo.testing.combos import TINY

D = TINY["d_model"]
#: transformers' Gemma 3 and Qwen3-Next norms cast to float32 whatever the input: the tolerance of a comparison
#: through them (the rest of each module runs in float64).
THROUGH_FLOAT32 = 1e-6


def hf(module: str):
    """A transformers modeling module by family (``gemma3``), or skip without transformers."""
    pytest.importorskip("transformers")
    import importlib

    return importlib.import_module(f"transformers.models.{module}.modeling_{module}")


def randomized(module: torch.nn.Module, scale: float = 0.3) -> torch.nn.Module:
    """``module`` with every parameter drawn anew (so a gain of 1 or a zero bias cannot hide a swap)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * scale)
    return module


# --- Zero-centred RMSNorm ------------------------------------------------------------------------------------------


def test_zero_centred_rmsnorm_applies_one_plus_its_stored_weight():
    x = torch.randn(2, 5, D, dtype=torch.float64) * 3
    norm = randomized(RMSNorm(BlockDims(d_model=D), eps=1e-6, zero_centred=True).double())
    by_hand = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + norm.weight)
    torch.testing.assert_close(norm(x), by_hand, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family", ["gemma3", "qwen3_next"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_centred_rmsnorm_is_gemma3s_and_qwen3_nexts(family, dtype):
    """Same initial weight (zeros), same output in float32 and, with the product before the cast back, in
    bfloat16."""
    module = hf(family)
    theirs = getattr(module, f"{'Gemma3' if family == 'gemma3' else 'Qwen3Next'}RMSNorm")(D, eps=1e-6)
    mine = RMSNorm(BlockDims(d_model=D), eps=1e-6, zero_centred=True)
    torch.testing.assert_close(mine.weight, theirs.weight, rtol=0, atol=0)
    randomized(mine)
    theirs.load_state_dict(mine.state_dict())
    mine, theirs = mine.to(dtype), theirs.to(dtype)
    x = (torch.randn(2, 5, D) * 3).to(dtype)
    torch.testing.assert_close(mine(x), theirs(x), rtol=1e-6, atol=1e-6)


def test_the_qk_norm_and_the_final_norm_beside_a_zero_centred_block_norm_are_zero_centred():
    cfg = {**TINY, "placement": "pre", "norm": {"name": "rmsnorm", "zero_centred": True},
           "attn": {"name": "mha", "qk_norm": "rmsnorm"}, "pos": "rotary", "mlp": "gelu"}  # fmt: skip
    block = build_block(cfg)
    norms = [m for m in block.modules() if isinstance(m, RMSNorm)]
    assert len(norms) == 4 and all(m.zero_centred and not m.weight.any() for m in norms)



# --- GELU's tanh approximation -------------------------------------------------------------------------------------


def mlp(name: str, **options) -> torch.nn.Module:
    cfg = {**TINY, "placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "none"}
    cfg["mlp"] = {"name": name, **options}
    return randomized(build_block(cfg).mlp.double())


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's gelu_new, written out (transformers' NewGELUActivation)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def test_the_gelu_mlps_tanh_approximation_follows_its_formula():
    x = torch.randn(2, 5, D, dtype=torch.float64) * 2
    plain = mlp("gelu", approximate="tanh")
    expected = gelu_new(x @ plain.up.weight.T + plain.up.bias) @ plain.down.weight.T + plain.down.bias
    torch.testing.assert_close(plain(x), expected, rtol=1e-12, atol=1e-12)
    gated = mlp("geglu", approximate="tanh")
    gate, up = split_gate_up(gated.gate_up.weight)
    gate_b, up_b = split_gate_up(gated.gate_up.bias)
    hidden = gelu_new(x @ gate.T + gate_b) * (x @ up.T + up_b)
    torch.testing.assert_close(gated(x), hidden @ gated.down.weight.T + gated.down.bias, rtol=1e-12, atol=1e-12)
    exact = mlp("geglu")  # the default: erf GELU, as before the option
    assert exact.activation is F.gelu and exact.approximate == "none"


def test_geglu_with_the_tanh_approximation_is_gemma3s_mlp():
    module = hf("gemma3")
    config = module.Gemma3TextConfig(hidden_size=D, intermediate_size=24, hidden_activation="gelu_pytorch_tanh")
    theirs = randomized(module.Gemma3MLP(config).double())
    mine = mlp("geglu", approximate="tanh")
    mine.gate_up.bias = mine.down.bias = None  # Gemma's projections have no bias
    with torch.no_grad():
        mine.gate_up.weight.copy_(fuse_gate_up(theirs.gate_proj.weight, theirs.up_proj.weight))
        mine.down.weight.copy_(theirs.down_proj.weight)
    x = torch.randn(2, 5, D, dtype=torch.float64) * 2
    torch.testing.assert_close(mine(x), theirs(x), rtol=1e-12, atol=1e-12)



# --- placement=reordered -------------------------------------------------------------------------------------------


def test_reordered_normalizes_each_branch_output_never_its_input_and_ends_with_a_final_norm():
    dims = BlockDims(d_model=D)
    norms = iter([randomized(RMSNorm(dims)).double() for _ in range(2)])
    placement = ReorderedNorm(dims, lambda: next(norms), 2)
    f, g = (randomized(torch.nn.Linear(D, D)).double() for _ in range(2))
    x = torch.randn(2, 5, D, dtype=torch.float64)
    h = x + placement.norms[0](f(x))
    torch.testing.assert_close(placement(x, [f, g]), h + placement.norms[1](g(h)), rtol=1e-12, atol=1e-12)
    cfg = {"block": {**TINY, "placement": "reordered", "norm": "rmsnorm", "attn": "mha", "pos": "rotary",
                     "mlp": "swiglu"}, "model": {"n_layers": 2}}  # fmt: skip
    assert isinstance(build_model(cfg).final_norm, RMSNorm)



# --- Attention against transformers' modules ----------------------------------------------------------------------


def causal_mask(t: int) -> torch.Tensor:
    """transformers' additive causal mask, (1, 1, t, t): -inf above the diagonal."""
    return torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)[None, None]


def rotary_tables(t: int, rotated: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (1, t, rotated) of transformers' default RoPE at positions 0..t-1, in float64: angle
    i base^(-2j / rotated) for j < rotated / 2, the halves repeated (``rotate_half``'s pairing)."""
    inverse = base ** -(torch.arange(0, rotated, 2, dtype=torch.float64) / rotated)
    angles = torch.arange(t, dtype=torch.float64)[:, None] * inverse
    doubled = torch.cat([angles, angles], dim=-1)[None]
    return doubled.cos(), doubled.sin()


def load_attention(mine: torch.nn.Module, theirs: torch.nn.Module, q_weight: torch.Tensor | None = None) -> None:
    """Copy a transformers attention's q/k/v/o projections (and biases, if any) into zoo's fused ``qkv`` and ``out``."""
    with torch.no_grad():
        q = theirs.q_proj.weight if q_weight is None else q_weight
        mine.qkv.weight.copy_(fuse_qkv(q, theirs.k_proj.weight, theirs.v_proj.weight, mine.n_kv_heads))
        mine.out.weight.copy_(theirs.o_proj.weight)
        if mine.qkv.bias is not None:
            biases = (theirs.q_proj.bias, theirs.k_proj.bias, theirs.v_proj.bias)
            mine.qkv.bias.copy_(fuse_qkv(*biases, mine.n_kv_heads))
            mine.out.bias.copy_(theirs.o_proj.bias)


def olmo_hybrid_layer():
    """transformers' OLMo-Hybrid attention layer (OLMo 3's attention: q_norm and k_norm over all heads jointly;
    norms after each branch), at a tiny config, float64, weights drawn anew."""
    module = hf("olmo_hybrid")
    from transformers.models.olmo_hybrid.configuration_olmo_hybrid import OlmoHybridConfig

    config = OlmoHybridConfig(
        hidden_size=D, num_attention_heads=4, num_key_value_heads=2, intermediate_size=24, num_hidden_layers=2,
        vocab_size=32, layer_types=["linear_attention", "full_attention"],
    )  # fmt: skip
    config._attn_implementation = "eager"
    return config, randomized(module.OlmoHybridAttentionDecoderLayer(config, 1).double())


def test_reordered_placement_and_joint_qk_norm_are_olmo_hybrids_attention_layer():
    config, theirs = olmo_hybrid_layer()
    cfg = {**TINY, "bias": False, "placement": "reordered", "norm": "rmsnorm", "pos": {"name": "rotary",
           "base": config.rope_parameters["rope_theta"]}, "mlp": "swiglu", "attn": {"name": "gqa", "qk_norm": "rmsnorm",
           "qk_norm_scope": "all_heads"}}  # fmt: skip
    mine = build_block(cfg).double().eval()
    assert mine.attn.q_norm.weight.shape == (4 * 4,) and mine.attn.k_norm.weight.shape == (2 * 4,)
    load_attention(mine.attn, theirs.self_attn)
    with torch.no_grad():
        mine.attn.q_norm.weight.copy_(theirs.self_attn.q_norm.weight)
        mine.attn.k_norm.weight.copy_(theirs.self_attn.k_norm.weight)
        mine.mlp.gate_up.weight.copy_(fuse_gate_up(theirs.mlp.gate_proj.weight, theirs.mlp.up_proj.weight))
        mine.mlp.down.weight.copy_(theirs.mlp.down_proj.weight)
        mine.placement.norms[0].weight.copy_(theirs.post_attention_layernorm.weight)
        mine.placement.norms[1].weight.copy_(theirs.post_feedforward_layernorm.weight)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    tables = rotary_tables(7, D // 4, config.rope_parameters["rope_theta"])
    with torch.no_grad():
        expected = theirs(x, attention_mask=causal_mask(7), position_embeddings=tables)
        torch.testing.assert_close(mine(x), expected, rtol=THROUGH_FLOAT32, atol=THROUGH_FLOAT32)


def test_a_joint_qk_norm_needs_a_norm_and_is_refused_under_tensor_parallelism():
    from zoo import ConfigError, resolve_block
    from zoo.parts.attention import Attention

    base = {**TINY, "placement": "pre", "norm": "rmsnorm", "pos": "rotary", "mlp": "swiglu"}
    with pytest.raises(ConfigError, match="block.attn.qk_norm_scope='all_heads': head unless block.attn.qk_norm"):
        resolve_block({**base, "attn": {"name": "gqa", "qk_norm_scope": "all_heads"}})
    spec = resolve_block({**base, "attn": {"name": "gqa", "qk_norm": "rmsnorm", "qk_norm_scope": "all_heads"}})
    with pytest.raises(ConfigError, match="block.attn.qk_norm_scope='all_heads': head under parallel.tp=2"):
        Attention.check_tp(spec.dims, 2, **spec["attn"].options)


# --- Config hashes -------------------------------------------------------------------------------------------------

#: Hashes computed before any of these options existed (zoo at 78acf65).
RECORDED = {(): "0a7575235f9168ae", ("norm=rmsnorm",): "51b702509f18b97f", ("mlp=geglu",): "09586291d75941c2",
            ("attn=gqa",): "0a03979dc78d43b5", ("attn=mqa",): "c9bed9822794ddd5",
            ("placement=post", "norm=rmsnorm", "mlp=geglu"): "793a3845dbacb796"}  # fmt: skip
#: Each new option at its default, spelt out, and away from it.
NEW_OPTIONS = {"block.norm.zero_centred": ("false", "true"), "block.mlp.approximate": ("none", "tanh"),
               "block.attn.qk_norm_scope": ("head", "all_heads")}  # fmt: skip


def test_the_new_options_at_their_defaults_leave_existing_config_hashes_as_they_were():
    from helpers import tiny

    from zoo.lab.records.config import config_hash

    for overrides, digest in RECORDED.items():
        assert config_hash(tiny(*overrides)) == digest, overrides
    base = ("norm=rmsnorm", "mlp=geglu", "attn=gqa", "block.attn.qk_norm=rmsnorm")
    for key, (default, other) in NEW_OPTIONS.items():
        assert config_hash(tiny(*base, f"{key}={default}")) == config_hash(tiny(*base)), key
        assert config_hash(tiny(*base, f"{key}={other}")) != config_hash(tiny(*base)), key
