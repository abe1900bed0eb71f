"""Position schemes. A position part may rotate queries and keys, or bias the attention scores.

Positions are absolute token indices, so cached decoding passes ``offset..offset+T``; a left-padded
batch passes them per sample, (batch, T), so each sequence starts at position 0.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from zoo.dims import BlockDims
from zoo.errors import ConfigError
from zoo.registry import POSITIONS


class Position(nn.Module):
    """Base class: no rotation and no score bias (subclasses override one or both)."""

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: (b, h, t, d), k: (b, g, t, d), positions: (t,) or per sample (b, t) -> q, k at those positions."""
        return q, k

    def score_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor | None:
        """An additive bias on the scores, or None.

        Positions (t_q,), (t_k,) give an (h, t_q, t_k) bias; per-sample (b, t_q), (b, t_k) give (b, h, t_q, t_k).
        """
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
        self._table: tuple[int, torch.device, torch.dtype, torch.Tensor] | None = None

    def _cos_sin(self, length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """(length, 2, d_head): cos of each angle, and sin with the first half negated (see _rotate)."""
        cached = self._table
        if cached is None or cached[0] < length or cached[1] != device or cached[2] != dtype:
            length = max(length, 2 * cached[0] if cached else 0)
            angles = torch.outer(torch.arange(length, dtype=torch.float64), self.inv_freq.double().cpu())
            signed = torch.cat([-angles.sin(), angles.sin()], dim=-1)  # (t, d): halves share angles
            table = torch.stack([torch.cat([angles.cos(), angles.cos()], dim=-1), signed], dim=1)
            cached = (length, device, dtype, table.to(device, dtype))
            self._table = cached
        return cached[3]

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        table = self._cos_sin(int(positions.max()) + 1, q.device, q.dtype)[positions]  # (t, 2, d) or (b, t, 2, d)
        cos, signed_sin = table.unbind(-2)  # (t, d) broadcasts over batch and heads
        if positions.ndim == 2:
            cos, signed_sin = rearrange(cos, "b t d -> b 1 t d"), rearrange(signed_sin, "b t d -> b 1 t d")
        return _rotate(q, cos, signed_sin), _rotate(k, cos, signed_sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (j, j + d/2): x * cos + [-second, first] * sin, with [second, first] as a roll
    and the minus folded into ``signed_sin`` (= [-sin, sin]); two fewer ops per call than chunk + cat."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin
