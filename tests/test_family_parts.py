"""The parts 2026's open model families need (Gemma 3, Qwen3-Next, OLMo 2/3 and OLMo-Hybrid, gpt-oss, nanochat),
each against its transformers module at a tiny config (float64 where the module keeps the input's precision; where
it computes in float32 whatever the input, at float32's tolerance) and against its formula written out by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

import zoo
import zoo.models.stack
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



def attention_block(attn: dict, *, norm: dict | str = "rmsnorm", pos: dict | str = "rotary", **sizes):
    """A float64 block (eval) with this attention node; its attention is what the tests call."""
    cfg = {**TINY, "bias": False, "placement": "pre", "norm": norm, "pos": pos, "mlp": "swiglu", "attn": attn, **sizes}
    return randomized(build_block(cfg).double()).eval()


def test_gemma3s_attention_is_head_dim_scale_dim_and_a_zero_centred_qk_norm():
    """Heads wider than d_model / n_heads, scores scaled by query_pre_attn_scalar^-0.5, the qk-norm Gemma's (1 + w)."""
    module = hf("gemma3")
    config = module.Gemma3TextConfig(
        hidden_size=D, num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=6,
        num_hidden_layers=1, layer_types=["full_attention"], intermediate_size=24, vocab_size=32, rms_norm_eps=1e-6,
    )  # fmt: skip
    config._attn_implementation = "eager"
    theirs = randomized(module.Gemma3Attention(config, 0).double())
    mine = attention_block({"name": "gqa", "head_dim": 8, "scale_dim": 6, "qk_norm": "rmsnorm"},
                           norm={"name": "rmsnorm", "zero_centred": True}).attn  # fmt: skip
    assert mine.qkv.weight.shape == ((4 + 2 * 2) * 8, D) and mine.out.weight.shape == (D, 4 * 8)
    load_attention(mine, theirs)
    with torch.no_grad():
        mine.q_norm.weight.copy_(theirs.q_norm.weight)
        mine.k_norm.weight.copy_(theirs.k_norm.weight)
        x = torch.randn(2, 7, D, dtype=torch.float64)
        tables = rotary_tables(7, 8, 10000.0)
        expected, _ = theirs(x, position_embeddings=tables, attention_mask=causal_mask(7))
        torch.testing.assert_close(mine(x), expected, rtol=THROUGH_FLOAT32, atol=THROUGH_FLOAT32)


def test_gpt_osss_attention_is_head_dim_with_biases_and_a_learned_sink():
    """gpt-oss: heads narrower than d_model / n_heads would give (6 here, against 4), q/k/v/o biases, a sink per
    head; transformers' module keeps float64, so to 1e-12."""
    module = hf("gpt_oss")
    config = module.GptOssConfig(hidden_size=D, num_attention_heads=4, num_key_value_heads=2, head_dim=6,
                                 num_hidden_layers=1, layer_types=["full_attention"], num_local_experts=2)  # fmt: skip
    config._attn_implementation = "eager"
    theirs = randomized(module.GptOssAttention(config, 0).double())
    mine = attention_block({"name": "gqa", "head_dim": 6, "sink": "learned"}, pos={"name": "rotary", "base": 150000.0},
                           bias=True).attn  # fmt: skip
    load_attention(mine, theirs)
    with torch.no_grad():
        mine.sink.copy_(theirs.sinks)
        x = torch.randn(2, 7, D, dtype=torch.float64)
        cos, sin = (table[..., :3] for table in rotary_tables(7, 6, 150000.0))  # gpt-oss takes one half
        expected, _ = theirs(x, position_embeddings=(cos, sin), attention_mask=causal_mask(7))
        torch.testing.assert_close(mine(x), expected, rtol=1e-12, atol=1e-12)


def test_qwen3_nexts_attention_is_head_dim_the_elementwise_gate_and_partial_rotary():
    """Qwen3-Next's q_proj holds, per head, its d_head query rows then its d_head gate rows; the gate multiplies
    the heads' outputs by sigmoid elementwise before o_proj: zoo's gate=elementwise, its rows those gate rows in
    head order. Its partial rotary turns the first int(head_dim x partial_rotary_factor) features of each head,
    paired (j, j + r/2) as rotary_fraction does."""
    module = hf("qwen3_next")
    config = module.Qwen3NextConfig(
        hidden_size=D, num_attention_heads=4, num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.25,
        num_hidden_layers=1, layer_types=["full_attention"], intermediate_size=24, vocab_size=32, rms_norm_eps=1e-6,
    )  # fmt: skip
    config._attn_implementation = "eager"
    theirs = randomized(module.Qwen3NextAttention(config, 0).double())
    mine = attention_block({"name": "gqa", "head_dim": 16, "gate": "elementwise", "qk_norm": "rmsnorm"},
                           norm={"name": "rmsnorm", "zero_centred": True},
                           pos={"name": "rotary", "rotary_fraction": 0.25}).attn  # fmt: skip
    query, gate = rearrange(theirs.q_proj.weight, "(h two d) i -> two (h d) i", two=2, d=16)
    load_attention(mine, theirs, q_weight=query)
    with torch.no_grad():
        mine.gate.weight.copy_(gate)
        mine.q_norm.weight.copy_(theirs.q_norm.weight)
        mine.k_norm.weight.copy_(theirs.k_norm.weight)
        x = torch.randn(2, 7, D, dtype=torch.float64)
        tables = rotary_tables(7, 4, 10000.0)
        their_cos, their_sin = module.Qwen3NextRotaryEmbedding(config)(x.float(), torch.arange(7)[None])
        torch.testing.assert_close(their_cos.double(), tables[0], rtol=0, atol=1e-6)  # 4 features rotated, as ours
        torch.testing.assert_close(their_sin.double(), tables[1], rtol=0, atol=1e-6)
        expected, _ = theirs(x, position_embeddings=tables, attention_mask=causal_mask(7))
        torch.testing.assert_close(mine(x), expected, rtol=THROUGH_FLOAT32, atol=THROUGH_FLOAT32)



# --- head_dim and scale_dim around the attention -------------------------------------------------------------------

HEAD_DIM = {"d_model": D, "n_heads": 4, "d_ff": 24, "bias": True, "placement": "pre", "norm": "layernorm",
            "pos": "rotary", "mlp": "gelu"}  # fmt: skip


def test_heads_of_head_dim_features_size_every_projection_the_cache_and_the_value_tables():
    """d 16, 4 heads of 8 (not 4), 2 key/value heads: qkv (4 + 2 x 2) x 8 rows, out from 32 features, the cache 2 x 2
    x 8 numbers a token, a value embedding 2 x 8 wide, the elementwise gate 32 wide; rotary turns all 8 features."""
    cfg = {"block": {**HEAD_DIM, "attn": {"name": "gqa", "head_dim": 8, "gate": "elementwise"}},
           "model": {"n_layers": 2, "vocab_size": 32, "value_embeddings": True}}  # fmt: skip
    model = build_model(cfg).eval()
    attn = model.blocks[0].attn
    assert attn.qkv.weight.shape == (64, D) and attn.out.weight.shape == (D, 32) and attn.gate.weight.shape == (32, D)
    assert model.value_embeds[0].weight.shape == (32, 16) and attn.state_size(5) == 2 * 2 * 8 * 5
    assert attn.position.rotated == 8
    ids = torch.randint(0, 32, (2, 6))
    caches = model.new_caches()
    with torch.no_grad():
        full = model(ids)
        steps = [model(ids[:, :4], caches=caches)] + [model(ids[:, i : i + 1], caches=caches) for i in (4, 5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_flops_per_token_count_n_heads_x_head_dim_in_place_of_d_model():
    """By hand: d 16, 4 heads of 8, seq 64: 6 x 64 x 32 = 12288 per layer for scores and weighted values, not
    6 x 64 x 16; a decoder's cross-attention alike; at head_dim = d_model / n_heads, the count as before."""
    layers, seq = 2, 64
    model = build_model({"block": {**HEAD_DIM, "attn": {"name": "gqa", "head_dim": 8}}, "model": {"n_layers": layers}})
    assert model.flops_per_token(seq) == 6 * model.num_parameters() + layers * 6 * seq * 4 * 8
    same = build_model({"block": {**HEAD_DIM, "attn": {"name": "gqa", "head_dim": 4}}, "model": {"n_layers": layers}})
    plain = build_model({"block": {**HEAD_DIM, "attn": "gqa"}, "model": {"n_layers": layers}})
    assert same.flops_per_token(seq) == plain.flops_per_token(seq) == 6 * plain.num_parameters() + layers * 6 * seq * D
    s2s = zoo.build_seq2seq({"block": {**HEAD_DIM, "attn": {"name": "gqa", "head_dim": 8}}, "model": {"n_layers": 1}})
    assert s2s.decoder.blocks[0].cross_attn.q.weight.shape == (32, D)
    assert s2s.flops_per_token(seq) == 6 * s2s.num_parameters() + 3 * 6 * seq * 32  # encoder, self and cross


def test_mup_keeps_set_heads_fixed_and_scale_dim_beside_its_score_scale():
    """With head_dim set, a head's width does not grow: the scores keep their scale at every width. With scale_dim
    and heads that grow, the kernel multiplies μP's sqrt(D_base) / D by sqrt(D / scale_dim): scale_dim^-0.5 at the
    base width, sqrt(D_base / D) / sqrt(scale_dim) beyond it."""
    from zoo import LanguageModel, resolve_block
    from zoo.assembly import mup

    def builder(**attn):
        return lambda width: LanguageModel(resolve_block({**HEAD_DIM, "d_model": width, "d_ff": None,
                                                          "attn": {"name": "gqa", **attn}}), 32, 2)  # fmt: skip

    fixed = mup.infer(builder(head_dim=8), 64, 16)
    assert set(fixed.score_scales.values()) == {None}
    assert fixed.scalings["blocks.0.attn.qkv.weight"].role == "output"
    assert fixed.scalings["blocks.0.attn.out.weight"].role == "input"
    for width, d_head in ((16, 4), (64, 16)):
        found = mup.infer(builder(scale_dim=6), width, 16)
        with torch.device("meta"):
            model = builder(scale_dim=6)(width)
        mup.apply(model, found)
        attn = model.blocks[0].attn
        assert attn.d_head == d_head
        assert attn.kernel_scale() == pytest.approx(math.sqrt(4 / d_head) / math.sqrt(6), rel=1e-12)


def test_matching_builds_a_reference_attention_at_its_own_head_width():
    """block.mlp.match against mla: the reference counts mla at d_model / n_heads, not at this block's head_dim;
    against gqa of the same class, with this block's head_dim (inherited as every other option)."""
    from zoo import resolve_block
    from zoo.assembly.match import attn_params

    block = {**HEAD_DIM, "attn": {"name": "mha", "head_dim": 8}, "mlp": {"name": "gelu", "match": "params"}}
    spec = resolve_block(block)
    plain = resolve_block({**HEAD_DIM, "attn": "mla"})
    assert attn_params(spec, "mla") == attn_params(plain)
    assert attn_params(spec, "gqa") == attn_params(resolve_block({**block, "attn": {"name": "gqa", "head_dim": 8}}))


def test_n_heads_need_not_divide_d_model_once_head_dim_is_set():
    from zoo import ConfigError, resolve_block

    with pytest.raises(ConfigError, match="block.n_heads=3: must divide d_model=16 .* or set block.attn.head_dim"):
        resolve_block({**HEAD_DIM, "n_heads": 3, "attn": "mha"})
    block = build_block({**HEAD_DIM, "n_heads": 3, "attn": {"name": "mha", "head_dim": 6}})
    assert block(torch.randn(1, 4, D)).shape == (1, 4, D)
    for key in ("head_dim", "scale_dim"):
        with pytest.raises(ConfigError, match=f"block.attn.{key}=0: must be a positive integer"):
            resolve_block({**HEAD_DIM, "attn": {"name": "mha", key: 0}})
    with pytest.raises(ConfigError, match="block.attn.head_dim=8: not an option of attn 'mla'"):
        resolve_block({**HEAD_DIM, "attn": {"name": "mla", "head_dim": 8}})



# --- Model options: the embedding's scale and norm, the logits' cap --------------------------------------------------

#: d_model 24: sqrt(24) is no bfloat16 number, so a scale left unrounded shows.
W = 24
MODEL_BLOCK = {**TINY, "d_model": W, "placement": "pre", "norm": "rmsnorm", "attn": "gqa", "pos": "rotary",
               "mlp": "swiglu"}  # fmt: skip


def language_model(**options) -> torch.nn.Module:
    """A 2-layer float64 model over 32 tokens with these ``model`` options, weights seeded by name (so two models
    built with different options share every weight they have in common)."""
    torch.manual_seed(0)
    model = build_model({"block": MODEL_BLOCK, "model": {"n_layers": 2, "vocab_size": 32, **options}}).double()
    return model.eval()


def stack_logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's logits from token embeddings ``x`` given by hand, past its own embedding step."""
    return model.logits(zoo.models.stack.Stack.forward(model, x))


IDS = torch.randint(0, 32, (2, 7), generator=torch.Generator().manual_seed(2))


def test_scale_embedding_multiplies_the_rows_by_sqrt_d_model_as_gemma3s_scaled_embedding():
    scaled, plain = language_model(scale_embedding=True), language_model()
    with torch.no_grad():
        expected = stack_logits(plain, plain.embed(IDS) * math.sqrt(W))
        torch.testing.assert_close(scaled(IDS), expected, rtol=1e-12, atol=1e-12)
        module = hf("gemma3")
        theirs = module.Gemma3TextScaledWordEmbedding(32, W, padding_idx=0, embed_scale=W**0.5)
        for dtype in (torch.float32, torch.bfloat16):  # the factor rounded to the rows' dtype, as theirs
            theirs.weight.copy_(scaled.embed.weight)
            mine = scaled.to(dtype)
            theirs.to(dtype)
            torch.testing.assert_close(mine.embed_tokens(IDS), theirs(IDS), rtol=0, atol=0)


def test_embedding_norm_normalizes_the_token_embeddings_with_the_block_norm():
    normed, plain = language_model(embedding_norm=True), language_model()
    assert isinstance(normed.embedding_norm, RMSNorm)
    assert normed.parameter_counts()["norms"] == plain.parameter_counts()["norms"] + W
    assert normed.flops_per_token(8) - plain.flops_per_token(8) == 6 * W  # its gain, as every norm's
    with torch.no_grad():
        randomized(normed.embedding_norm)
        x = normed.embed(IDS)
        by_hand = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * normed.embedding_norm.weight
        torch.testing.assert_close(normed(IDS), stack_logits(plain, by_hand), rtol=1e-12, atol=1e-12)


def test_logit_softcap_bounds_the_logits_after_the_mup_multiplier():
    capped, plain = language_model(logit_softcap=2.0), language_model()
    with torch.no_grad():
        raw = plain(IDS)
        torch.testing.assert_close(capped(IDS), 2.0 * torch.tanh(raw / 2.0), rtol=1e-12, atol=1e-12)
        assert capped(IDS).abs().max() < 2.0 < raw.abs().max() * 10
        capped.logit_scale = plain.logit_scale = 0.5
        torch.testing.assert_close(capped(IDS), 2.0 * torch.tanh(plain(IDS) / 2.0), rtol=1e-12, atol=1e-12)


def test_the_model_options_are_checked_recorded_and_refused_where_they_mean_nothing():
    from zoo import ConfigError

    bad = [("logit_softcap", 0, "a number > 0"), ("logit_softcap", "30", "a number > 0"),
           ("embedding_norm", 1, "true or false"), ("scale_embedding", "yes", "true or false")]  # fmt: skip
    for key, value, allowed in bad:
        with pytest.raises(ConfigError, match=f"model.{key}=.*{allowed}"):
            language_model(**{key: value})
    model = language_model(logit_softcap=30, embedding_norm=True, scale_embedding=True)
    assert {"model.logit_softcap": 30.0, "model.embedding_norm": True, "model.scale_embedding": True}.items() <= (
        model.settings.items()
    )
    for key, value in (("logit_softcap", 30), ("embedding_norm", True), ("scale_embedding", True)):
        with pytest.raises(ConfigError, match=f"model.{key}=.*in an encoder-decoder: a decoder-only model's option"):
            zoo.build_seq2seq({"block": MODEL_BLOCK, "model": {"n_layers": 1, key: value}})


def test_multi_token_predictions_extra_heads_embed_their_tokens_as_the_trunk_does():
    torch.manual_seed(0)
    cfg = {"block": MODEL_BLOCK, "model": {"n_layers": 2, "vocab_size": 32, "scale_embedding": True,
           "embedding_norm": True}, "objective": {"name": "mtp", "k": 1}}  # fmt: skip
    model = build_model(cfg).train()
    seen = []
    model.embedding_norm.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))
    model(IDS)
    assert seen == [7, 6] and len(model.take_future_logits()) == 1  # the trunk's 7 tokens, then the head's 6


# --- Config hashes -------------------------------------------------------------------------------------------------

#: Hashes computed before any of these options existed (zoo at 78acf65).
RECORDED = {(): "0a7575235f9168ae", ("norm=rmsnorm",): "51b702509f18b97f", ("mlp=geglu",): "09586291d75941c2",
            ("attn=gqa",): "0a03979dc78d43b5", ("attn=mqa",): "c9bed9822794ddd5",
            ("placement=post", "norm=rmsnorm", "mlp=geglu"): "793a3845dbacb796"}  # fmt: skip
#: Each new option at its default, spelt out, and away from it.
NEW_OPTIONS = {"block.norm.zero_centred": ("false", "true"), "block.mlp.approximate": ("none", "tanh"),
               "block.attn.qk_norm_scope": ("head", "all_heads"), "block.attn.head_dim": ("null", "8"),
               "block.attn.scale_dim": ("null", "6"), "model.logit_softcap": ("null", "30"),
               "model.embedding_norm": ("false", "true"), "model.scale_embedding": ("false", "true")}  # fmt: skip


def test_the_new_options_at_their_defaults_leave_existing_config_hashes_as_they_were():
    from helpers import tiny

    from zoo.lab.records.config import config_hash

    for overrides, digest in RECORDED.items():
        assert config_hash(tiny(*overrides)) == digest, overrides
    base = ("norm=rmsnorm", "mlp=geglu", "attn=gqa", "block.attn.qk_norm=rmsnorm")
    for key, (default, other) in NEW_OPTIONS.items():
        assert config_hash(tiny(*base, f"{key}={default}")) == config_hash(tiny(*base)), key
        assert config_hash(tiny(*base, f"{key}={other}")) != config_hash(tiny(*base)), key
