"""The transformer block: receives built parts and wires them through its placement."""

from __future__ import annotations

import torch
from torch import nn

from zoo.parts.attention import Attention, KVCache
from zoo.parts.placements import Placement


class Block(nn.Module):
    """Self-attention then MLP, each a branch wired into the residual stream by ``placement``.

    Never reads configs: build one with :func:`zoo.build_block`, or pass parts directly.
    Parameter names: ``attn.qkv``, ``attn.out``, ``mlp.*``, ``placement.norms.{0,1}``.
    """

    def __init__(self, placement: Placement, attn: Attention, mlp: nn.Module, d_model: int) -> None:
        super().__init__()
        self.placement = placement
        self.attn = attn
        self.mlp = mlp
        self.d_model = d_model

    def forward(
        self,
        x: torch.Tensor,
        *,
        key_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """x: (batch, time, d_model) -> (batch, time, d_model).

        key_mask: (batch, keys) bool, True at real tokens, False at padding.
        cache: this layer's KV cache for incremental decoding (appended to in place).
        """
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"block input must be (batch, time, d_model={self.d_model}), got shape {tuple(x.shape)}")

        def attend(h: torch.Tensor) -> torch.Tensor:
            return self.attn(h, key_mask=key_mask, cache=cache)

        return self.placement(x, [attend, self.mlp])
