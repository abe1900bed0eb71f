"""Softmax attention's fused ``qkv`` rows: separate query, key and value weights (or biases) to the fused layout,
grouped by key/value head, and back; and a linear layer's output rows scaled in place (QK-clip's rescaling)."""

from __future__ import annotations

import torch
from torch import nn

from zoo.core.reshape import rearrange


@torch.no_grad()
def scale_rows(linear: nn.Linear, factor: torch.Tensor) -> None:
    """Each output row of ``linear`` (its weight's row and its bias) times ``factor`` (out_features,), in place."""
    linear.weight.mul_(rearrange(factor.to(linear.weight.dtype), "o -> o 1"))
    if linear.bias is not None:
        linear.bias.mul_(factor.to(linear.bias.dtype))


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """Separate query (n_heads*d_head rows), key and value (n_kv_heads*d_head rows) weights or biases
    -> :class:`Attention`'s fused ``qkv`` rows, grouped by key/value head."""
    q = rearrange(q, "(g r d) ... -> g r d ...", g=n_kv_heads, d=k.shape[0] // n_kv_heads)
    k, v = (rearrange(w, "(g d) ... -> g 1 d ...", g=n_kv_heads) for w in (k, v))
    return rearrange(torch.cat([q, k, v], dim=1), "g n d ... -> (g n d) ...")


def split_qkv(qkv: torch.Tensor, n_heads: int, n_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of :func:`fuse_qkv`: fused ``qkv`` rows -> query, key and value rows."""
    groups = rearrange(qkv, "(g n d) ... -> g n d ...", g=n_kv_heads, n=n_heads // n_kv_heads + 2)
    q = rearrange(groups[:, :-2], "g r d ... -> (g r d) ...")
    k, v = (rearrange(groups[:, i], "g d ... -> (g d) ...") for i in (-2, -1))
    return q, k, v
