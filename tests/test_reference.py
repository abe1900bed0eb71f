"""Independent references: a from-scratch pre-norm decoder block, GQA, and PyTorch's own Transformer layers."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_forms_equal, two_steps_by_hand
from helpers import fla_naive as load_fla_naive

from zoo import build_block, compose
from zoo.parts.attention import fuse_qkv
from zoo.testing.combos import TINY

D, H = TINY["d_model"], TINY["n_heads"]


def reference_block(x: torch.Tensor, w: dict[str, torch.Tensor], n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """A pre-norm decoder block written out step by step, with a materialized triangular -inf mask.

    Query head h reads key/value head h // (n_heads // n_kv_heads).
    """
    batch, time, width = x.shape
    d_head = width // n_heads

    def layer_norm(h: torch.Tensor, i: int) -> torch.Tensor:
        mean = h.mean(-1, keepdim=True)
        var = ((h - mean) ** 2).mean(-1, keepdim=True)
        return (h - mean) / torch.sqrt(var + 1e-5) * w[f"placement.norms.{i}.weight"] + w[f"placement.norms.{i}.bias"]

    h = layer_norm(x, 0)
    # Fused rows per key/value group: its n_heads / n_kv_heads query heads, its key head, its value head.
    group = n_heads // n_kv_heads
    qkv = (h @ w["attn.qkv.weight"].T + w["attn.qkv.bias"]).view(batch, time, n_kv_heads, group + 2, d_head)
    q = qkv[:, :, :, :group].reshape(batch, time, n_heads, d_head).transpose(1, 2)  # (b, h, t, d)
    k = qkv[:, :, :, group].transpose(1, 2).repeat_interleave(group, dim=1)
    v = qkv[:, :, :, group + 1].transpose(1, 2).repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d_head)  # (b, h, t, t)
    scores = scores + torch.triu(torch.full((time, time), float("-inf"), dtype=x.dtype), diagonal=1)
    context = torch.softmax(scores, dim=-1) @ v
    context = context.transpose(1, 2).reshape(batch, time, width)  # merge heads
    x = x + context @ w["attn.out.weight"].T + w["attn.out.bias"]
    hidden = F.gelu(layer_norm(x, 1) @ w["mlp.up.weight"].T + w["mlp.up.bias"])
    return x + hidden @ w["mlp.down.weight"].T + w["mlp.down.bias"]


def gpt_block(attn: str = "mha", **attn_options):
    cfg = {**TINY, "placement": "pre", "norm": "layernorm", "pos": "none", "mlp": "gelu"}
    block = build_block({**cfg, "attn": {"name": attn, **attn_options}}).double().eval()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return block


def test_gpt_preset_equals_reference_block():
    block = gpt_block()
    x = torch.randn(2, 7, D, dtype=torch.float64)
    torch.testing.assert_close(block(x), reference_block(x, block.state_dict(), H, H), rtol=0, atol=1e-10)


def test_gqa_groups_query_heads_like_the_reference():
    for backend in ("sdpa", "math"):
        block = gpt_block("gqa", n_kv_heads=2, backend=backend)
        x = torch.randn(2, 7, D, dtype=torch.float64)
        torch.testing.assert_close(block(x), reference_block(x, block.state_dict(), H, 2), rtol=0, atol=1e-10)


def test_gqa_with_as_many_kv_heads_as_query_heads_is_mha():
    mha = gpt_block("mha")
    gqa = gpt_block("gqa", n_kv_heads=H)
    gqa.load_state_dict(mha.state_dict())
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.testing.assert_close(gqa(x), mha(x), rtol=0, atol=0)


def test_kv_projection_shrinks_by_the_head_ratio():
    d_head = D // H

    def kv_rows(block) -> int:
        return block.attn.qkv.weight.shape[0] - H * d_head

    assert kv_rows(gpt_block("mha")) == 2 * H * d_head
    assert kv_rows(gpt_block("gqa", n_kv_heads=2)) * (H // 2) == kv_rows(gpt_block("mha"))
    assert kv_rows(gpt_block("mqa")) * H == kv_rows(gpt_block("mha"))


# --- PyTorch's own encoder and decoder layers, same weights copied in ------------------------------


def torch_weights(layer: torch.nn.Module, cross: bool) -> dict[str, torch.Tensor]:
    """A torch.nn.Transformer{Encoder,Decoder}Layer's weights under zoo's parameter names."""
    w = layer.state_dict()
    ours = {
        "attn.qkv.weight": fuse_qkv(*w["self_attn.in_proj_weight"].chunk(3), n_kv_heads=H),
        "attn.qkv.bias": fuse_qkv(*w["self_attn.in_proj_bias"].chunk(3), n_kv_heads=H),
        "attn.out.weight": w["self_attn.out_proj.weight"],
        "attn.out.bias": w["self_attn.out_proj.bias"],
        "mlp.up.weight": w["linear1.weight"],
        "mlp.up.bias": w["linear1.bias"],
        "mlp.down.weight": w["linear2.weight"],
        "mlp.down.bias": w["linear2.bias"],
    }
    norms = ["norm1", "norm2", "norm3"] if cross else ["norm1", "norm2"]
    for i, norm in enumerate(norms):
        ours[f"placement.norms.{i}.weight"] = w[f"{norm}.weight"]
        ours[f"placement.norms.{i}.bias"] = w[f"{norm}.bias"]
    if cross:
        q, k, v = w["multihead_attn.in_proj_weight"].chunk(3)
        q_bias, k_bias, v_bias = w["multihead_attn.in_proj_bias"].chunk(3)
        kv, kv_bias = grouped_kv(k, v), grouped_kv(k_bias, v_bias)
        ours |= {"cross_attn.q.weight": q, "cross_attn.q.bias": q_bias, "cross_attn.kv.weight": kv}
        ours |= {"cross_attn.kv.bias": kv_bias, "cross_attn.out.weight": w["multihead_attn.out_proj.weight"]}
        ours["cross_attn.out.bias"] = w["multihead_attn.out_proj.bias"]
    return ours


def grouped_kv(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Cross-attention's fused ``kv`` rows: per head, its key rows then its value rows."""
    heads = [k.view(H, D // H, *k.shape[1:]), v.view(H, D // H, *v.shape[1:])]
    return torch.stack(heads, dim=1).reshape(2 * D, *k.shape[1:])


def scrambled(layer: torch.nn.Module) -> torch.nn.Module:
    """Random weights everywhere (torch zero-initializes attention biases), float64, dropout off."""
    layer = layer.double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.ndim == 1 and p.shape[0] == D else 0.0))
    # train() with dropout 0 keeps torch off its inference fast path (which zeroes padded outputs).
    return layer.train()


def padding(batch: int, time: int, pad: int) -> torch.Tensor:
    """(batch, time) bool, True at real tokens: the last sample's last ``pad`` tokens are padding."""
    mask = torch.ones(batch, time, dtype=torch.bool)
    mask[-1, time - pad :] = False
    return mask


@pytest.mark.parametrize(("norm_first", "placement", "preset"), [(False, "post", "vaswani"), (True, "pre", None)])
def test_decoder_block_equals_torch_transformer_decoder_layer(norm_first, placement, preset):
    torch_layer = torch.nn.TransformerDecoderLayer(
        D, H, 3 * D, dropout=0.0, activation="relu", batch_first=True, norm_first=norm_first
    )
    torch_layer = scrambled(torch_layer)
    overrides = [f"block.d_model={D}", f"block.n_heads={H}", f"block.d_ff={3 * D}", "block.cross_attention=true"]
    overrides += [f"preset={preset}"] if preset else [f"placement={placement}", "norm=layernorm", "mlp=relu"]
    cfg = compose(overrides)
    # The original Transformer's sinusoidal positions are added at the model's embedding, outside the block.
    pos = "sinusoidal" if preset else "none"
    assert cfg.block.placement.name == placement and cfg.block.attn.name == "mha" and cfg.block.pos.name == pos
    block = build_block(cfg.block, context="model").double().train()
    block.load_state_dict(torch_weights(torch_layer, cross=True))

    batch, time, source = 3, 6, 5
    tgt = torch.randn(batch, time, D, dtype=torch.float64)
    memory = torch.randn(batch, source, D, dtype=torch.float64)
    tgt_mask, memory_mask = padding(batch, time, 2), padding(batch, source, 3)
    causal_blocked = torch.triu(torch.ones(time, time, dtype=torch.bool), diagonal=1)  # torch: True = blocked
    expected = torch_layer(
        tgt,
        memory,
        tgt_mask=causal_blocked,
        tgt_key_padding_mask=~tgt_mask,
        memory_key_padding_mask=~memory_mask,
    )
    ours = block(tgt, memory=memory, key_mask=tgt_mask, memory_mask=memory_mask)  # zoo: True = allowed
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-10)
    # Without padding, and with the mask as torch's float -inf triangle.
    float_mask = torch.nn.Transformer.generate_square_subsequent_mask(time, dtype=torch.float64)
    expected = torch_layer(tgt, memory, tgt_mask=float_mask)
    torch.testing.assert_close(block(tgt, memory=memory), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize(("norm_first", "placement"), [(False, "post"), (True, "pre")])
def test_encoder_block_equals_torch_transformer_encoder_layer(norm_first, placement):
    torch_layer = scrambled(
        torch.nn.TransformerEncoderLayer(
            D, H, 3 * D, dropout=0.0, activation="relu", batch_first=True, norm_first=norm_first
        )
    )
    cfg = {**TINY, "d_ff": 3 * D, "causal": False, "placement": placement, "norm": "layernorm"}
    block = build_block({**cfg, "attn": "mha", "pos": "none", "mlp": "relu"}).double().train()
    block.load_state_dict(torch_weights(torch_layer, cross=False))
    src = torch.randn(3, 7, D, dtype=torch.float64)
    src_mask = padding(3, 7, 3)
    expected = torch_layer(src, src_key_padding_mask=~src_mask)
    torch.testing.assert_close(block(src, key_mask=src_mask), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("attn", ["mha", "gqa"])
def test_cross_attention_backends_agree(attn):
    """Cross-attention borrows self-attention's backends: sdpa and math give the same output."""
    blocks = []
    for backend in ("sdpa", "math"):
        torch.manual_seed(0)
        cfg = {**TINY, "placement": "pre", "norm": "layernorm", "pos": "none", "mlp": "gelu", "cross_attention": True}
        blocks.append(build_block({**cfg, "attn": {"name": attn, "backend": backend}}).double().eval())
    x, memory = torch.randn(2, 4, D, dtype=torch.float64), torch.randn(2, 6, D, dtype=torch.float64)
    memory_mask = padding(2, 6, 2)
    sdpa, math_ = (b(x, memory=memory, memory_mask=memory_mask) for b in blocks)
    torch.testing.assert_close(sdpa, math_, rtol=0, atol=1e-12)
    assert blocks[1].cross_attn.n_kv_heads == (2 if attn == "gqa" else H)


# --- Latent attention and linear attention, written out from their weights -------------------------


def mixer(attn: dict, pos: str = "none") -> torch.nn.Module:
    """The attention part of a tiny block, float64, random weights (norm gains away from 1)."""
    cfg = {**TINY, "placement": "pre", "norm": "layernorm", "pos": pos, "mlp": "gelu", "attn": attn}
    block = build_block(cfg).double().eval()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
    return block.attn


def rotate_half_pairs(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE on the last dim of x (..., t, d): feature j pairs with j + d/2, angle position * base^(-2j/d)."""
    half = x.shape[-1] // 2
    angle = positions[:, None].double() * base ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * angle.cos() - second * angle.sin(), second * angle.cos() + first * angle.sin()], -1)


def rms(x: torch.Tensor, gain: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    out = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return out if gain is None else out * gain


#: The output options, alone and together (zoo.parts.head_outputs), as a softmax attention's config takes them.
OUTPUT_OPTIONS = [
    {"gate": "headwise"},
    {"gate": "elementwise"},
    {"sink": "learned"},
    {"xsa": True},
    {"gate": "elementwise", "sink": "learned", "xsa": True},
]


def options_id(options: dict) -> str:
    return "+".join(f"{k}={v}" for k, v in options.items()) or "none"


def head_by_hand(scores: torch.Tensor, v: torch.Tensor, x: torch.Tensor, w: dict, h: int, options: dict):
    """Head ``h``'s output before the output projection, written out: the scores (b, t, t) with an explicit -inf
    triangle; softmax over [scores, the sink's logit] with the sink's column dropped after (sink); less the
    component along the head's own value v_i / ||v_i|| (xsa); times sigmoid(x W_g + b_g) of its gate row (headwise)
    or of its d rows (elementwise). v: (b, t, d), the head's values."""
    t, d = scores.shape[-1], v.shape[-1]
    scores = scores + torch.triu(torch.full((t, t), float("-inf"), dtype=x.dtype), diagonal=1)
    if options.get("sink") == "learned":
        column = w["sink"][h].expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, column], -1), -1)[..., :t]
    else:
        weights = torch.softmax(scores, -1)
    y = weights @ v
    if options.get("xsa"):
        unit = v / v.norm(dim=-1, keepdim=True)
        y = y - (y * unit).sum(-1, keepdim=True) * unit
    rows = {"headwise": slice(h, h + 1), "elementwise": slice(h * d, (h + 1) * d)}.get(options.get("gate", "none"))
    if rows is not None:
        y = y * torch.sigmoid(x @ w["gate.weight"][rows].T + w["gate.bias"][rows])
    return y


@pytest.mark.parametrize("backend", ["sdpa", "math"])
@pytest.mark.parametrize("options", OUTPUT_OPTIONS, ids=options_id)
def test_gqa_output_options_equal_their_formulas_head_by_hand(options, backend):
    """Grouped queries (2 per key/value head): a head's XSA removes its key/value head's value; the gate multiplies
    the heads before the output projection; the sink is one more term in each head's softmax denominator."""
    attn = mixer({"name": "gqa", "n_kv_heads": 2, "backend": backend, **options})
    w = dict(attn.named_parameters())
    x = torch.randn(2, 7, D, dtype=torch.float64)
    d, r = D // H, H // 2
    rows = (x @ w["qkv.weight"].T + w["qkv.bias"]).view(2, 7, 2, r + 2, d)  # per kv group: r queries, a key, a value
    heads = []
    for h in range(H):
        q, k, v = rows[:, :, h // r, h % r], rows[:, :, h // r, r], rows[:, :, h // r, r + 1]
        heads.append(head_by_hand(q @ k.transpose(-1, -2) / math.sqrt(d), v, x, w, h, options))
    expected = torch.cat(heads, -1) @ w["out.weight"].T + w["out.bias"]
    torch.testing.assert_close(attn(x), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("options", [{}, *OUTPUT_OPTIONS], ids=options_id)
@pytest.mark.parametrize(("q_rank", "rope_dim"), [(None, None), (6, None), (6, 2)])
def test_latent_attention_equals_its_definition_per_head(q_rank, rope_dim, options):
    """DeepSeek-V2's equations, head by head, with an explicit -inf triangle and the rotary key shared by heads
    (DeepSeek-V3's: rope_dim rotary features, fewer than d_head, the scores at (d_head + rope_dim)^-0.5); with the
    output options, each head as :func:`head_by_hand` writes it."""
    attn = mixer({"name": "mla", "kv_rank": 5, "q_rank": q_rank, "rope_dim": rope_dim, **options}, pos="rotary")
    w = dict(attn.named_parameters())
    x = torch.randn(2, 7, D, dtype=torch.float64)
    d, t = D // H, x.shape[1]
    r = d if rope_dim is None else rope_dim
    down = x @ w["kv_down.weight"].T + w["kv_down.bias"]
    latent = rms(down[..., :5], w["kv_norm.weight"], eps=attn.kv_norm.eps)
    rope_key = rotate_half_pairs(down[..., 5:], torch.arange(t))  # (b, t, d): one key for every head
    up = latent @ w["kv_up.weight"].T + w["kv_up.bias"]  # per head: d key features, d value features
    if q_rank is None:
        queries = x @ w["q.weight"].T + w["q.bias"]
    else:
        c_q = rms(x @ w["q_down.weight"].T + w["q_down.bias"], w["q_norm.weight"], eps=attn.q_norm.eps)
        queries = c_q @ w["q_up.weight"].T + w["q_up.bias"]
    heads = []
    for h in range(H):
        q_h = queries[..., h * (d + r) : (h + 1) * (d + r)]
        q_h = torch.cat([q_h[..., :d], rotate_half_pairs(q_h[..., d:], torch.arange(t))], -1)
        k_h = torch.cat([up[..., h * 2 * d : h * 2 * d + d], rope_key], -1)
        v_h = up[..., h * 2 * d + d : (h + 1) * 2 * d]
        heads.append(head_by_hand(q_h @ k_h.transpose(-1, -2) / math.sqrt(d + r), v_h, x, w, h, options))
    expected = torch.cat(heads, -1) @ w["out.weight"].T + w["out.bias"]
    torch.testing.assert_close(attn(x), expected, rtol=0, atol=1e-10)


def naive_linear(attn: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Linear attention as a double loop over (query, key) pairs: y_i = sum_{j <= i} (prod_{j < r <= i} g_r)
    (phi(q_i) . phi(k_j)) v_j per head, each head RMS-normalized, then the output projection."""
    w = dict(attn.named_parameters())
    batch, t, _ = x.shape
    d = D // H
    phi = {"elu": lambda z: F.elu(z) + 1, "relu": F.relu, "identity": lambda z: z}[attn.feature_map]
    qkv = (x @ w["qkv.weight"].T + w["qkv.bias"]).view(batch, t, H, 3 * d)  # d_key = d_head here
    q, k, v = phi(qkv[..., :d]), phi(qkv[..., d : 2 * d]), qkv[..., 2 * d :]
    if attn.decay == "gated":
        g = torch.sigmoid(x @ w["gate.weight"].T + w["gate.bias"]) ** (1 / 16)  # (b, t, h)
    elif attn.decay == "fixed":
        g = (1 - 2.0 ** (-5.0 - torch.arange(H, dtype=x.dtype))).expand(batch, t, H)
    else:
        g = torch.ones(batch, t, H, dtype=x.dtype)
    y = torch.zeros(batch, t, H, d, dtype=x.dtype)
    for i in range(t):
        for j in range(i + 1):
            weight = torch.prod(g[:, j + 1 : i + 1], dim=1)  # (b, h): the decay between j and i
            y[:, i] += (weight * (q[:, i] * k[:, j]).sum(-1))[..., None] * v[:, j]
    return rms(y).reshape(batch, t, D) @ w["out.weight"].T + w["out.bias"]


@pytest.mark.parametrize(
    ("feature_map", "decay"), [("elu", "none"), ("relu", "fixed"), ("identity", "gated"), ("elu", "gated")]
)
def test_linear_attention_chunked_recurrent_and_quadratic_forms_equal_the_naive_sum(feature_map, decay):
    from zoo import LayerState

    x = torch.randn(2, 11, D, dtype=torch.float64)
    options = {"name": "linear", "feature_map": feature_map, "decay": decay, "chunk": 4}
    reference = mixer({**options, "backend": "math"})  # the full quadratic form
    chunked = mixer({**options, "backend": "sdpa"})  # chunks of 4 over 11 tokens: a partial last chunk
    chunked.load_state_dict(reference.state_dict())
    forms = {"math": reference(x), "sdpa": chunked(x)}
    state = LayerState()
    forms["recurrent"] = torch.cat([reference(x[:, i : i + 1], cache=state) for i in range(11)], dim=1)
    assert state.length == 11 and state.mixer.matrix.shape == (2, H, D // H, D // H)
    expected = naive_linear(reference, x)
    for name, y in forms.items():
        torch.testing.assert_close(y, expected, rtol=0, atol=1e-10, msg=lambda m, name=name: f"{name}: {m}")


def naive_moe(layer, x: torch.Tensor) -> torch.Tensor:
    """A mixture of experts one token at a time: its router scores, its top_k experts, their weighted
    outputs (and the shared expert's) summed. No sorting, no grouping, no batching across tokens."""
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            token = x[b, t]
            logits = layer.router.weight @ token
            if layer.routing == "softmax":
                scores = torch.softmax(logits, -1)
            else:
                scores = torch.sigmoid(logits)
            top = torch.topk(scores, layer.top_k).indices
            weights = scores[top] / scores[top].sum()
            for weight, e in zip(weights, top.tolist(), strict=True):
                out[b, t] += weight * layer.experts[e](token[None])[0]
            if layer.shared is not None:
                out[b, t] += layer.shared(token[None])[0]
    return out


@pytest.mark.parametrize(
    "options",
    [{}, {"routing": "sigmoid", "n_shared": 2, "expert": "gelu", "top_k": 3}, {"n_experts": 1, "top_k": 1}],
)
def test_moe_grouped_path_equals_a_per_token_loop(options):
    cfg = {**TINY, "placement": "pre", "norm": "layernorm", "attn": "mha", "pos": "none"}
    layer = build_block({**cfg, "mlp": {"name": "moe", **options}}).mlp.double().eval()
    x = torch.randn(3, 7, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), naive_moe(layer, x), rtol=0, atol=1e-12)
        layer.router.weight[-1] += 5.0  # skew the router toward the last expert
        torch.testing.assert_close(layer(x), naive_moe(layer, x), rtol=0, atol=1e-12)


# --- Gated DeltaNet ---------------------------------------------------------------------------------


def fla_naive():
    """fla-core's pure-PyTorch Gated DeltaNet references (fla/ops/gated_delta_rule/naive.py)."""
    return load_fla_naive("gated_delta_rule")


def delta_inputs(b: int = 2, h: int = 3, t: int = 11, d_key: int = 5, d_head: int = 4, dtype=torch.float64):
    """Random q, k (unit length), v, beta in (0, 1), log g <= 0 and a start state H_0, (b, h, t, ...)."""
    q = F.normalize(torch.randn(b, h, t, d_key, dtype=dtype), dim=-1) / math.sqrt(d_key)
    k = F.normalize(torch.randn(b, h, t, d_key, dtype=dtype), dim=-1)
    v = torch.randn(b, h, t, d_head, dtype=dtype)
    beta, log_decay = torch.rand(b, h, t, dtype=dtype), -torch.rand(b, h, t, dtype=dtype)
    return q, k, v, beta, log_decay, torch.randn(b, h, d_key, d_head, dtype=dtype)


def test_gated_delta_rule_by_hand():
    """Two steps, one head, written out: H_i = g_i H_{i-1} + k_i u_i^T, u_i = beta_i (v_i - g_i H_{i-1}^T k_i),
    y_i = H_i^T q_i. With beta = 1 the state returns v exactly for its key (the delta rule overwrites)."""
    log_decay = torch.tensor([math.log(0.5), math.log(0.5)], dtype=torch.float64).reshape(1, 1, -1)
    forms, k, v = two_steps_by_hand(log_decay, [1.0, 0.0])
    # Step 1: H_1 = k_1 (0.5 (2, 3))^T = [[1, 1.5], [0, 0]], y_1 = H_1^T (1, 1) = (1, 1.5).
    # Step 2: 0.5 H_1 = [[0.5, 0.75], [0, 0]] reads (0.3, 0.45) at k_2; u_2 = (1, -1) - (0.3, 0.45) = (0.7, -1.45);
    #         H_2 = [[0.5 + 0.42, 0.75 - 0.87], [0.56, -1.16]], y_2 = H_2^T (1, 0) = (0.92, -0.12).
    assert_forms_equal(forms, k, v, y=[[1.0, 1.5], [0.92, -0.12]], state=[[0.92, -0.12], [0.56, -1.16]])


def test_short_convolution_is_the_causal_sum_and_continues_from_its_tail():
    """y_i = sum_j w_j x_{i - 3 + j} over 4 taps (zeros before the first token); two calls, the second
    given the first's tail, equal one call."""
    from zoo.parts.gated_deltanet import short_convolution

    x, kernel = torch.randn(2, 7, 3, dtype=torch.float64), torch.randn(3, 1, 4, dtype=torch.float64)
    padded = F.pad(x, (0, 0, 3, 0))
    expected = sum(kernel[:, 0, j] * padded[:, j : j + 7] for j in range(4))
    y, tail = short_convolution(x, kernel, None)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(tail, x[:, -3:], rtol=0, atol=0)
    first, tail = short_convolution(x[:, :2], kernel, None)
    rest, _ = short_convolution(x[:, 2:], kernel, tail)
    torch.testing.assert_close(torch.cat([first, rest], 1), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 3, 4, 11, 64])
def test_gated_delta_rule_chunked_form_equals_the_recurrent_form(chunk):
    """Chunks of 1 to 64 over 11 tokens (partial last chunks, one chunk longer than the sequence), from
    a start state: the same outputs and final state as one token at a time, to float64 rounding."""
    from zoo.parts.gated_deltanet import delta_chunked, delta_recurrent

    q, k, v, beta, log_decay, start = delta_inputs()
    y, state = delta_recurrent(q, k, v, beta, log_decay, start)
    y_chunked, state_chunked = delta_chunked(q, k, v, beta, log_decay, start, chunk)
    torch.testing.assert_close(y_chunked, y, rtol=0, atol=1e-12)
    torch.testing.assert_close(state_chunked, state, rtol=0, atol=1e-12)


def test_gated_delta_rule_equals_fla_cores_naive_references():
    """zoo's recurrent form against fla's naive_recurrent_gated_delta_rule and its chunked form against
    naive_chunk_gated_delta_rule (fla's layout: (b, t, h, d); it computes in float32), to 1e-5."""
    from zoo.parts.gated_deltanet import delta_chunked, delta_recurrent

    fla = fla_naive()
    q, k, v, beta, log_decay, start = delta_inputs(dtype=torch.float32)
    d_key = q.shape[-1]
    heads_second = [t.transpose(1, 2) for t in (q * math.sqrt(d_key), k, v, beta, log_decay)]  # fla scales q itself
    fq, fk, fv, fbeta, fg = heads_second
    y_fla, state_fla = fla.naive_recurrent_gated_delta_rule(
        fq, fk, fv, fbeta, fg, initial_state=start, output_final_state=True
    )
    y, state = delta_recurrent(q, k, v, beta, log_decay, start)
    torch.testing.assert_close(y.transpose(1, 2), y_fla, rtol=0, atol=1e-5)
    torch.testing.assert_close(state, state_fla, rtol=0, atol=1e-5)
    y_fla, state_fla = fla.naive_chunk_gated_delta_rule(
        fq, fk, fv, fg, fbeta, chunk_size=4, initial_state=start, output_final_state=True
    )
    y, state = delta_chunked(q, k, v, beta, log_decay, start, 4)
    torch.testing.assert_close(y.transpose(1, 2), y_fla, rtol=0, atol=1e-5)
    torch.testing.assert_close(state, state_fla, rtol=0, atol=1e-5)


def fla_layer(attn: torch.nn.Module, x: torch.Tensor, fla) -> torch.Tensor:
    """fla's GatedDeltaNet layer written out from zoo's weights around fla's naive recurrence: the short
    convolution as a sum over shifted inputs, SiLU, q and k L2-normalized per head, beta = sigmoid(W_b x),
    g = -exp(A_log) softplus(W_a x + dt_bias), then rmsnorm(o) * w * silu(W_g x) and the output projection."""
    w = dict(attn.named_parameters())
    batch, t, _ = x.shape
    d_key, d_head, taps = attn.d_key, attn.d_head, attn.conv.shape[-1]
    mixed = x @ w["qkv.weight"].T + w["qkv.bias"]
    kernel = w["conv"][:, 0] + F.one_hot(torch.tensor(taps - 1), taps).to(x.dtype)  # stored less the identity
    padded = F.pad(mixed, (0, 0, taps - 1, 0))
    qkv = F.silu(sum(kernel[:, j] * padded[:, j : j + t] for j in range(taps))).view(batch, t, H, -1)
    q, k, v = qkv.split([d_key, d_key, d_head], -1)
    q, k = (z / torch.sqrt(z.pow(2).sum(-1, keepdim=True) + 1e-6) for z in (q, k))
    beta = torch.sigmoid(x @ w["beta.weight"].T + w["beta.bias"])
    g = -torch.exp(w["a_log"]) * F.softplus(x @ w["decay.weight"].T + w["dt"])
    o, _ = fla.naive_recurrent_gated_delta_rule(q, k, v, beta, g)  # (b, t, h, d_head), scale d_key^-1/2
    o = o.to(x.dtype)
    o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * w["norm.weight"]
    o = o * F.silu((x @ w["gate.weight"].T + w["gate.bias"]).view(batch, t, H, d_head))
    return o.reshape(batch, t, H * d_head) @ w["out.weight"].T + w["out.bias"]


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_gated_deltanet_layer_equals_fla_layer_around_its_naive_recurrence(backend):
    fla = fla_naive()
    attn = mixer({"name": "gated_deltanet", "d_key": 3, "chunk": 4, "backend": backend})
    x = torch.randn(2, 11, D, dtype=torch.float64)
    torch.testing.assert_close(attn(x), fla_layer(attn, x, fla), rtol=0, atol=1e-5)
