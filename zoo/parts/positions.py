"""Position schemes. A position part may rotate queries and keys, or bias the attention scores.

Positions are absolute token indices, so cached decoding passes ``offset..offset+T``.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.dims import BlockDims
from zoo.errors import ConfigError
from zoo.registry import POSITIONS


class Position(nn.Module):
    """Base class: no rotation and no score bias (subclasses override one or both)."""

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: (b, h, t, d), k: (b, g, t, d), positions: (t,) -> q, k rotated to those positions."""
        return q, k

    def score_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor | None:
        """An additive (h, t_q, t_k) bias on the scores, or None."""
        return None


@POSITIONS.register("none", formula="no position signal in the block", reference="-")
class NoPosition(Position):
    """No positional information: order comes only from the causal mask."""

    def __init__(self, dims: BlockDims) -> None:
        super().__init__()


@POSITIONS.register(
    "rotary",
    formula="q_i, k_i rotated by angle i * base^(-2j/d) in each pair (j, j + d/2)",
    reference="Su et al. 2021, RoFormer, arXiv:2104.09864",
)
class Rotary(Position):
    """Rotary embedding (RoPE) on queries and keys, never values.

    Pairing convention: split halves, i.e. feature j pairs with feature j + d_head/2 (GPT-NeoX,
    Llama in Hugging Face). cos/sin tables are cached per length, device and dtype.
    """

    @classmethod
    def check(cls, dims: BlockDims, *, base: float = 10000.0) -> None:
        if dims.d_head % 2:
            raise ConfigError(
                "block.d_model", dims.d_model, f"rotary needs an even head size, got d_model/n_heads={dims.d_head}"
            )
        if not base > 1:
            raise ConfigError("block.pos.base", base, "must be > 1")

    def __init__(self, dims: BlockDims, *, base: float = 10000.0) -> None:
        super().__init__()
        self.base = base
        inv_freq = base ** (-torch.arange(0, dims.d_head, 2, dtype=torch.float64) / dims.d_head)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (d/2,)
        self._table: tuple[int, torch.device, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def _cos_sin(self, length: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cached = self._table
        if cached is None or cached[0] < length or cached[1] != device or cached[2] != dtype:
            length = max(length, 2 * cached[0] if cached else 0)
            angles = torch.outer(torch.arange(length, dtype=torch.float64), self.inv_freq.double().cpu())
            angles = torch.cat([angles, angles], dim=-1)  # (t, d): halves share angles
            cached = (length, device, dtype, angles.cos().to(device, dtype), angles.sin().to(device, dtype))
            self._table = cached
        return cached[3], cached[4]

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._cos_sin(int(positions.max()) + 1, q.device, q.dtype)
        cos, sin = cos[positions], sin[positions]  # (t, d), broadcast over batch and heads
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin
