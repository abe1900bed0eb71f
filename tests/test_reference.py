"""Independent references: the gpt preset against a from-scratch pre-norm decoder block, and GQA."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from combos import TINY

from zoo import build_block

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
    qkv = h @ w["attn.qkv.weight"].T + w["attn.qkv.bias"]
    q = qkv[..., :width]
    k = qkv[..., width : width + n_kv_heads * d_head]
    v = qkv[..., width + n_kv_heads * d_head :]
    q = q.view(batch, time, n_heads, d_head).transpose(1, 2)  # (b, h, t, d)
    k = k.view(batch, time, n_kv_heads, d_head).transpose(1, 2).repeat_interleave(n_heads // n_kv_heads, dim=1)
    v = v.view(batch, time, n_kv_heads, d_head).transpose(1, 2).repeat_interleave(n_heads // n_kv_heads, dim=1)
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
