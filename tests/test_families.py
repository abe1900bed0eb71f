"""The parts the released model families use, against those families' transformers modules: each module built at
a tiny config, its weights drawn and copied into zoo's part (zoo's layouts by hand, never through a zoo helper),
both run in float64 and compared to 1e-12.

transformers computes some steps in float32 on purpose (``.float()``, ``torch.float32``: the recurrence, the
router, the norms); the ``float64`` fixture (tests/conftest.py) lifts those casts in the module under test, so
that only a difference in the computation can exceed the tolerance.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from einops import rearrange

from zoo import build_block
from zoo.testing.combos import TINY

pytest.importorskip("transformers")

D = TINY["d_model"]  # 16
TOL = {"rtol": 0, "atol": 1e-12}


def drawn(module: torch.nn.Module, std: float = 0.5) -> torch.nn.Module:
    """``module`` in float64 with every parameter drawn (transformers' empty or constant init shows nothing)."""
    module = module.double()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, std)
    return module.eval()


def block_part(axis: str, node: dict[str, Any], **block: Any) -> torch.nn.Module:
    """The part on ``axis`` of a tiny block without biases (the families' layers have none unless stated)."""
    cfg = {**TINY, "bias": False, "placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "none",
           "mlp": "gelu", axis: node, **block}  # fmt: skip
    return getattr(build_block(cfg), axis).double().eval()


def by_key_head(*weights: torch.Tensor, groups: int) -> torch.Tensor:
    """Rows of each weight (all key heads' in turn) regrouped by key head: group g's rows of each, in turn."""
    parts = [rearrange(w, "(g n) ... -> g n ...", g=groups) for w in weights]
    return rearrange(torch.cat(parts, 1), "g n ... -> (g n) ...")


# --- Gated DeltaNet: Qwen3-Next and OLMo-Hybrid ---------------------------------------------------------------------

KEY_HEADS, VALUE_HEADS, D_KEY, D_VALUE = 2, 4, 3, D // 4  # two value heads read each key head


def gated_deltanet(backend: str, **options: Any) -> torch.nn.Module:
    node = {"name": "gated_deltanet", "d_key": D_KEY, "n_key_heads": KEY_HEADS, "chunk": 4, "backend": backend}
    return block_part("attn", {**node, **options})


def linear_config(cls: type, d_value: int = D_VALUE, **extra: Any) -> Any:
    """A transformers config of one linear-attention layer (and the full-attention layer some families require)."""
    sizes = dict(hidden_size=D, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                 layer_types=["linear_attention", "full_attention"], linear_num_key_heads=KEY_HEADS,
                 linear_num_value_heads=VALUE_HEADS, linear_key_head_dim=D_KEY, linear_value_head_dim=d_value,
                 linear_conv_kernel_dim=4)  # fmt: skip
    return cls(**{**sizes, **extra})


def copy_rates_and_output(ours: torch.nn.Module, conv: torch.Tensor, w: dict[str, torch.Tensor], out: str) -> None:
    """The convolution (transformers' channels: every query, every key, every value; zoo's: by key head, stored
    less the identity kernel), A_log, dt_bias and the output projection."""
    cq, ck, cv = conv.split([KEY_HEADS * D_KEY, KEY_HEADS * D_KEY, VALUE_HEADS * ours.d_head])
    ours.conv.copy_(by_key_head(cq, ck, cv, groups=KEY_HEADS) - ours.present)
    ours.a_log.copy_(w["A_log"])
    ours.dt.copy_(w["dt_bias"])
    ours.out.weight.copy_(w[out])


@pytest.mark.parametrize("d_value", [D_VALUE, 2 * D_VALUE])
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_gated_deltanet_equals_qwen3_next_with_more_value_heads_than_key_heads(backend, d_value, float64):
    """Qwen3NextGatedDeltaNet (its torch fallback): in_proj_qkvz's rows by key head (q, k, the group's values, the
    group's gates z), in_proj_ba's (the group's b, then its a), the convolution over q, k, v, the gated RMSNorm at
    rms_norm_eps = 1e-6; value heads of d_model / n_heads (values d_model wide) and of linear_value_head_dim twice
    that (2 d_model wide, as the released model's), zoo's ``head_dim``."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen

    float64(qwen)
    torch.manual_seed(0)
    theirs = drawn(qwen.Qwen3NextGatedDeltaNet(linear_config(Qwen3NextConfig, d_value, rms_norm_eps=1e-6), 0))
    ours = gated_deltanet(backend, norm_eps=1e-6, head_dim=None if d_value == D_VALUE else d_value)
    assert ours.out.weight.shape == (D, VALUE_HEADS * d_value)
    w, r = dict(theirs.named_parameters()), VALUE_HEADS // KEY_HEADS
    with torch.no_grad():
        q, k, v, z = rearrange(w["in_proj_qkvz.weight"], "(g n) d -> g n d", g=KEY_HEADS).split(
            [D_KEY, D_KEY, r * d_value, r * d_value], 1
        )
        ours.qkv.weight.copy_(rearrange(torch.cat([q, k, v], 1), "g n d -> (g n) d"))
        ours.gate.weight.copy_(rearrange(z, "g n d -> (g n) d"))
        b, a = rearrange(w["in_proj_ba.weight"], "(g n) d -> g n d", g=KEY_HEADS).split([r, r], 1)
        ours.beta.weight.copy_(rearrange(b, "g n d -> (g n) d"))
        ours.decay.weight.copy_(rearrange(a, "g n d -> (g n) d"))
        ours.norm.weight.copy_(w["norm.weight"])
        copy_rates_and_output(ours, w["conv1d.weight"], w, "out_proj.weight")
        x = torch.randn(2, 11, D, dtype=torch.float64)
        torch.testing.assert_close(ours(x), theirs(x), **TOL)


@pytest.mark.parametrize(("allow_neg_eigval", "d_value"), [(False, D_VALUE), (True, D_VALUE), (True, 2 * D_KEY)])
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_gated_deltanet_equals_olmo_hybrid_with_and_without_negative_eigenvalues(
    backend, allow_neg_eigval, d_value, float64
):
    """OlmoHybridGatedDeltaNet: separate q, k, v, a, b and gate projections, beta x 2 under allow_neg_eigval, its
    output norm at fla's 1e-5 (zoo's default); value heads as wide as d_model / n_heads, or wider (head_dim: the
    released model's linear_value_head_dim = 2 linear_key_head_dim)."""
    from transformers import OlmoHybridConfig
    from transformers.models.olmo_hybrid import modeling_olmo_hybrid as olmo

    float64(olmo)
    torch.manual_seed(0)
    config = linear_config(OlmoHybridConfig, linear_allow_neg_eigval=allow_neg_eigval, linear_value_head_dim=d_value)
    theirs = drawn(olmo.OlmoHybridGatedDeltaNet(config, 0))
    width = {} if d_value == D_VALUE else {"head_dim": d_value}
    ours = gated_deltanet(backend, allow_neg_eigval=allow_neg_eigval, **width)
    assert ours.out.weight.shape == (D, VALUE_HEADS * d_value)
    w = dict(theirs.named_parameters())
    with torch.no_grad():
        ours.qkv.weight.copy_(by_key_head(w["q_proj.weight"], w["k_proj.weight"], w["v_proj.weight"], groups=KEY_HEADS))
        ours.gate.weight.copy_(w["g_proj.weight"])
        ours.beta.weight.copy_(w["b_proj.weight"])
        ours.decay.weight.copy_(w["a_proj.weight"])
        ours.norm.weight.copy_(w["o_norm.weight"])
        copy_rates_and_output(ours, w["conv1d.weight"], w, "o_proj.weight")
        x = torch.randn(2, 11, D, dtype=torch.float64)
        torch.testing.assert_close(ours(x), theirs(x), **TOL)


# --- Mixtures of experts: DeepSeek-V3, Qwen3-Next, gpt-oss ----------------------------------------------------------

EXPERTS, WIDTH = 8, 8  # experts, each expert's hidden width


def moe(**options: Any) -> torch.nn.Module:
    return block_part("mlp", {"name": "moe", "n_experts": EXPERTS, **options}, d_ff=WIDTH)


def interleaved(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Separate gate and up rows -> zoo's gate_up rows (gate unit j at row 2j, up unit j at row 2j + 1)."""
    return rearrange(torch.stack([gate, up]), "two f ... -> (f two) ...")


def copy_experts(ours: torch.nn.Module, gate_up: torch.Tensor, down: torch.Tensor) -> None:
    """transformers' stacked experts (gate_up (e, 2f, d): the f gate rows, then the f up rows; down (e, d, f))."""
    for expert, w, w_down in zip(ours.experts, gate_up, down, strict=True):
        expert.gate_up.weight.copy_(interleaved(*w.chunk(2)))
        expert.down.weight.copy_(w_down)


def copy_shared(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    ours.gate_up.weight.copy_(interleaved(theirs.gate_proj.weight, theirs.up_proj.weight))
    ours.down.weight.copy_(theirs.down_proj.weight)


@pytest.mark.parametrize("normalize", [True, False])
def test_moe_equals_deepseek_v3_with_groups_bias_and_scaling(normalize, float64):
    """DeepseekV3MoE: sigmoid scores, e_score_correction_bias on the choice only, the top 2 of 4 groups by their two
    best scores, norm_topk_prob, routed_scaling_factor 2.5, one shared expert."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek

    float64(deepseek)
    torch.manual_seed(0)
    config = DeepseekV3Config(hidden_size=D, moe_intermediate_size=WIDTH, n_routed_experts=EXPERTS,
                              num_experts_per_tok=3, n_shared_experts=1, n_group=4, topk_group=2,
                              routed_scaling_factor=2.5, norm_topk_prob=normalize)  # fmt: skip
    theirs = drawn(deepseek.DeepseekV3MoE(config))
    ours = moe(top_k=3, routing="sigmoid", n_shared=1, n_groups=4, top_groups=2, routed_scaling_factor=2.5,
               balance="bias", normalize=normalize)  # fmt: skip
    with torch.no_grad():
        theirs.gate.e_score_correction_bias.normal_(0, 0.5)
        ours.router.weight.copy_(theirs.gate.weight)
        ours.expert_bias.copy_(theirs.gate.e_score_correction_bias)
        copy_experts(ours, theirs.experts.gate_up_proj, theirs.experts.down_proj)
        copy_shared(ours.shared, theirs.shared_experts)
        x = torch.randn(2, 7, D, dtype=torch.float64)
        torch.testing.assert_close(ours(x), theirs(x), **TOL)


@pytest.mark.parametrize("normalize", [True, False])
def test_moe_equals_qwen3_next_with_its_gated_shared_expert(normalize, float64):
    """Qwen3NextSparseMoeBlock: softmax routing, norm_topk_prob (Qwen3-Next's true, and false), a shared expert gated
    by sigmoid(shared_expert_gate x)."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen

    float64(qwen)
    torch.manual_seed(0)
    config = Qwen3NextConfig(hidden_size=D, moe_intermediate_size=WIDTH, shared_expert_intermediate_size=2 * WIDTH,
                             num_experts=EXPERTS, num_experts_per_tok=2, norm_topk_prob=normalize)  # fmt: skip
    theirs = drawn(qwen.Qwen3NextSparseMoeBlock(config))
    ours = moe(n_shared=2, shared_gate=True, normalize=normalize)
    with torch.no_grad():
        ours.router.weight.copy_(theirs.gate.weight)
        copy_experts(ours, theirs.experts.gate_up_proj, theirs.experts.down_proj)
        copy_shared(ours.shared, theirs.shared_expert)
        ours.shared_gate.weight.copy_(theirs.shared_expert_gate.weight)
        x = torch.randn(2, 7, D, dtype=torch.float64)
        torch.testing.assert_close(ours(x), theirs(x), **TOL)


def test_moe_equals_gpt_oss_with_a_router_bias_and_clamped_swiglu_experts(float64):
    """GptOssMLP: a router with a bias, the top 4 logits then a softmax over them alone (zoo's softmax over every
    expert renormalized over the top 4 gives the same weights), experts with biases whose SwiGLU is clamped at 7
    (reached here: the inputs are large), alpha 1.702 and (up + 1)."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss import modeling_gpt_oss as gpt_oss

    float64(gpt_oss)
    torch.manual_seed(0)
    config = GptOssConfig(hidden_size=D, intermediate_size=WIDTH, num_local_experts=EXPERTS, num_experts_per_tok=4)
    theirs = drawn(gpt_oss.GptOssMLP(config))
    ours = block_part("mlp", {"name": "moe", "n_experts": EXPERTS, "top_k": 4, "expert": "clamped_swiglu",
                              "router_bias": True}, d_ff=WIDTH, bias=True)  # fmt: skip
    experts = theirs.experts
    with torch.no_grad():
        ours.router.weight.copy_(theirs.router.weight)
        ours.router.bias.copy_(theirs.router.bias)
        for e, expert in enumerate(ours.experts):  # gpt-oss multiplies x @ W: zoo's weights are the transposes
            expert.gate_up.weight.copy_(experts.gate_up_proj[e].T)  # its columns interleave gate and up as zoo's rows
            expert.gate_up.bias.copy_(experts.gate_up_proj_bias[e])
            expert.down.weight.copy_(experts.down_proj[e].T)
            expert.down.bias.copy_(experts.down_proj_bias[e])
        x = 4 * torch.randn(2, 7, D, dtype=torch.float64)
        assert (x @ experts.gate_up_proj[0] + experts.gate_up_proj_bias[0]).abs().max() > config.swiglu_limit
        torch.testing.assert_close(ours(x), theirs(x)[0], **TOL)


# --- Multi-head latent attention: DeepSeek-V3 -----------------------------------------------------------------------

NOPE, ROPE, KV_RANK, Q_RANK = D // 4, 2, 6, 5  # a head's content (and value) features, its rotary ones, the latents


def deinterleaved(rows: torch.Tensor, width: int) -> torch.Tensor:
    """Each ``width``-row group (one head's rotary rows, stored in interleaved pairs (0, 1), (2, 3), ...) with its
    even rows first, then its odd ones: zoo's rotate-half pairs (j, j + width / 2)."""
    return rearrange(rows, "(g half two) ... -> (g two half) ...", half=width // 2, two=2)


@pytest.mark.parametrize("interleave", [True, False])
def test_latent_attention_equals_deepseek_v3s_attention(interleave, float64):
    """DeepseekV3Attention: queries through a q_lora_rank latent, keys and values through a kv_lora_rank latent
    (both RMSNorms at 1e-6), qk_nope_head_dim content and qk_rope_head_dim rotary features (fewer than the content's:
    zoo's rope_dim), scores at qk_head_dim^-0.5, default RoPE; rope_interleave's pairs (2i, 2i + 1) are zoo's
    (i, i + r/2) on the rotary rows taken even first, then odd."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek

    float64(deepseek)
    torch.manual_seed(0)
    config = DeepseekV3Config(hidden_size=D, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=Q_RANK,
                              kv_lora_rank=KV_RANK, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=NOPE,
                              rope_interleave=interleave, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                              attn_implementation="eager")  # fmt: skip
    theirs = drawn(deepseek.DeepseekV3Attention(config, 0))
    rotary = deepseek.DeepseekV3RotaryEmbedding(config).double()
    ours = block_part("attn", {"name": "mla", "kv_rank": KV_RANK, "q_rank": Q_RANK, "rope_dim": ROPE},
                      pos={"name": "rotary", "base": 500.0})  # fmt: skip
    w = dict(theirs.named_parameters())
    per_head = NOPE + ROPE
    with torch.no_grad():
        q_up = rearrange(w["q_b_proj.weight"], "(h f) r -> h f r", f=per_head)
        q_rope = q_up[:, NOPE:]
        if interleave:
            q_rope = rearrange(deinterleaved(rearrange(q_rope, "h f r -> (h f) r"), ROPE), "(h f) r -> h f r", f=ROPE)
        ours.q_up.weight.copy_(rearrange(torch.cat([q_up[:, :NOPE], q_rope], 1), "h f r -> (h f) r"))
        ours.q_down.weight.copy_(w["q_a_proj.weight"])
        ours.q_norm.weight.copy_(w["q_a_layernorm.weight"])
        kv_down = w["kv_a_proj_with_mqa.weight"]
        rope_key = deinterleaved(kv_down[KV_RANK:], ROPE) if interleave else kv_down[KV_RANK:]
        ours.kv_down.weight.copy_(torch.cat([kv_down[:KV_RANK], rope_key]))
        ours.kv_norm.weight.copy_(w["kv_a_layernorm.weight"])
        ours.kv_up.weight.copy_(w["kv_b_proj.weight"])  # per head: its key's content rows, then its value's
        ours.out.weight.copy_(w["o_proj.weight"])
        x = torch.randn(2, 7, D, dtype=torch.float64)
        positions = torch.arange(7)[None]
        mask = torch.full((7, 7), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        expected, _ = theirs(x, rotary(x, positions), mask)
        torch.testing.assert_close(ours(x), expected, **TOL)


# --- mHC: DeepSeek-V4's hyper-connection -----------------------------------------------------------------------------


@pytest.mark.parametrize("iters", [1, 20])
def test_mhc_equals_deepseek_v4s_hyper_connection(iters, float64):
    """DeepseekV4HyperConnection: the flattened streams RMS-normalized together, one projection to pre, post and comb,
    three scales and a bias; pre = sigmoid + eps (zoo's read), post = 2 sigmoid (write), comb = Sinkhorn of a row
    softmax (mix); the layer's streams then post (x) f(pre . H) + comb^T H (DeepseekV4DecoderLayer's sum)."""
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as deepseek

    float64(deepseek)
    torch.manual_seed(0)
    config = DeepseekV4Config(hidden_size=D, hc_mult=3, hc_sinkhorn_iters=iters, hc_eps=1e-6, rms_norm_eps=1e-6)
    theirs = drawn(deepseek.DeepseekV4HyperConnection(config))
    cfg = {**TINY, "placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "none", "mlp": "gelu",
           "residual": {"name": "mhc", "n_streams": 3, "sinkhorn_iters": iters}}  # fmt: skip
    ours = build_block(cfg).residual.double()
    with torch.no_grad():
        ours.projection[0].copy_(theirs.fn)
        ours.base[: theirs.base.numel()].copy_(theirs.base)
        ours.scale[:3].copy_(theirs.scale)
        streams = torch.randn(2, 5, 3, D, dtype=torch.float64)
        branch = torch.randn(D, D, dtype=torch.float64)
        post, comb, collapsed = theirs(streams)
        read, mix, write = ours.weights(streams, 0)
        torch.testing.assert_close(mix, comb, **TOL)
        torch.testing.assert_close(write, post, **TOL)
        torch.testing.assert_close(torch.einsum("btj,btjd->btd", read, streams), collapsed, **TOL)
        layer = post.unsqueeze(-1) * torch.tanh(collapsed @ branch).unsqueeze(-2) + comb.transpose(-1, -2) @ streams
        torch.testing.assert_close(ours.update(streams, 0, lambda h: torch.tanh(h @ branch)), layer, **TOL)
