"""What softmax attention may add to its values from the side channel (zoo.core.channel): value residual
(``block.attn.value_residual``, ResFormer) and value embeddings (``model.value_embeddings``, nanochat).

Order, per layer, on the new tokens' values v (b, g, t, d) after the projection (and canon site b): the value
embedding first, ``v + gate * ve``; then layer 0 writes v as ``first_values``, and every later layer with value
residual mixes it in. The attention then caches and attends the result. Both act only inside a stack: a block
alone has neither (its attention runs as without them).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from zoo.core.dims import BlockDims
from zoo.core.reshape import rearrange

#: Value residual: none, two learned scalars per layer, or a learned weight per token and key/value head.
ValueResidual = Literal["none", "learned", "per_token"]

#: Input features a value embedding's gate reads (nanochat's ``ve_gate_channels``), at most d_model.
GATE_CHANNELS = 32


class LearnedMix(nn.Module):
    """ResFormer's learnable value residual: v_n <- λ1 v_n + λ2 v_1, parameter ``lambdas`` = (λ1, λ2),
    initialized at (0.5, 0.5) (Zhou et al. 2024, the learnable form's initialization)."""

    def __init__(self) -> None:
        super().__init__()
        self.lambdas = nn.Parameter(torch.full((2,), 0.5))

    def forward(self, v: torch.Tensor, first: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """v, first: (b, g, t, d) this layer's and layer 0's values; x (the attention's input) unused."""
        return self.lambdas[0] * v + self.lambdas[1] * first

    def flops(self, kv_width: int) -> int:
        """Training FLOPs per token: two products and a sum per value feature, 3 x the forward's."""
        return 3 * 3 * kv_width


class TokenMix(nn.Module):
    """A per-token value residual: v_n <- (1 - w) v_n + w v_1, w = sigmoid(x W + b) per token and key/value
    head, x the attention's input; parameter ``proj`` (d_model -> n_kv_heads). At init (W small, b = 0)
    w is about 0.5, as the learnable form's λ."""

    def __init__(self, dims: BlockDims, n_kv_heads: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dims.d_model, n_kv_heads, bias=dims.bias)

    def forward(self, v: torch.Tensor, first: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        w = torch.sigmoid(rearrange(self.proj(x), "b t g -> b g t 1"))
        return v + w * (first - v)

    def flops(self, kv_width: int) -> int:
        """Training FLOPs per token beyond ``proj``'s matmul: a sigmoid per head (n_kv_heads of them, at most
        kv_width) and a difference, product and sum per value feature, 3 x the forward's."""
        return 3 * (3 * kv_width + self.proj.out_features)


def build_mix(value_residual: ValueResidual, dims: BlockDims, n_kv_heads: int) -> nn.Module | None:
    """The mixing of a layer after the first; None for ``none``."""
    if value_residual == "none":
        return None
    return LearnedMix() if value_residual == "learned" else TokenMix(dims, n_kv_heads)


class ValueGate(nn.Module):
    """Adds a layer's value embedding to its values through a gate per key/value head (nanochat):
    v <- v + 2 sigmoid(x[..., :c] W) ve, c = min(32, d_model) of the attention's input x; parameter ``proj``
    (W: c -> n_kv_heads, no bias; the gate is about 1 at init)."""

    def __init__(self, dims: BlockDims, n_kv_heads: int) -> None:
        super().__init__()
        self.channels = min(GATE_CHANNELS, dims.d_model)
        self.proj = nn.Linear(self.channels, n_kv_heads, bias=False)

    def forward(self, v: torch.Tensor, ve: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """v: (b, g, t, d); ve: (b, t, g d), the layer's table rows for the new tokens; x: (b, t, d_model)."""
        gate = 2 * torch.sigmoid(rearrange(self.proj(x[..., : self.channels]), "b t g -> b g t 1"))
        return v + gate * rearrange(ve, "b t (g d) -> b g t d", g=v.shape[1])

    def flops(self, kv_width: int) -> int:
        """Training FLOPs per token beyond ``proj``'s matmul: a sigmoid and a doubling per head, a product
        and a sum per value feature, 3 x the forward's (the table lookup is no arithmetic)."""
        return 3 * (2 * kv_width + 2 * self.proj.out_features)
