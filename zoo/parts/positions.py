"""Position schemes. A position part may rotate queries and keys, bias the attention scores, or
(absolute positions) give the model an embedding to add to its token embeddings.

Positions are absolute token indices, so cached decoding passes ``offset..offset+T``; a left-padded
batch passes them per sample, (batch, T), so each sequence starts at position 0.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from zoo.core import tp
from zoo.core.dims import BlockDims
from zoo.core.errors import ConfigError
from zoo.core.registry import POSITIONS
from zoo.core.reshape import rearrange
from zoo.core.tp import Plan, no_plan


class Position(nn.Module):
    """Base class: no rotation, no score bias, no embedding (subclasses override what they use).

    ``needs`` maps what a part requires from its surroundings to why; ``"embedding"`` is provided
    by a model (token embeddings to add positions to), not by a lone block (see zoo.assembly.compat).
    ``provides`` follows from what a subclass overrides: ``"rotation"`` (``rotate``) and
    ``"score bias"`` (``score_bias``), so a mixer that cannot honour one can declare the conflict.
    """

    needs: ClassVar[dict[str, str]] = {}
    provides: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        found = set(cls.provides)
        if cls.rotate is not Position.rotate:
            found.add("rotation")
        if cls.score_bias is not Position.score_bias:
            found.add("score bias")
        cls.provides = frozenset(found)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: (b, h, t, d), k: (b, g, t, d), positions: (t,) or per sample (b, t) -> q, k at those positions."""
        return q, k

    def score_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor | None:
        """An additive bias on the scores, or None.

        Positions (t_q,), (t_k,) give an (h, t_q, t_k) bias; per-sample (b, t_q), (b, t_k) give (b, h, t_q, t_k).
        """
        return None

    def matrix_blocks(self) -> dict[str, dict[str, torch.Tensor]]:
        """Nothing fused (a learned table is the model's, through :meth:`embedding`, not a block matrix)."""
        return {}

    def embedding(self) -> nn.Module | None:
        """The module a model applies to its token embeddings, ``(x, positions) -> x + pe``, or None.

        A module that scales ``x`` first says with which init std the model should draw the token
        embedding, as its ``token_init_std`` attribute (:class:`SinusoidalEmbedding`)."""
        return None


@POSITIONS.register("none", formula="no position signal in the block", reference="-")
class NoPosition(Position):
    """No positional information: order comes only from the causal mask."""

    tp_plan = no_plan

    def __init__(self, dims: BlockDims) -> None:
        super().__init__()


@POSITIONS.register(
    "rotary",
    formula="q_i, k_i rotated by angle i * base^(-2j/r) in each pair (j, j + r/2), r = fraction * d_head",
    reference="Su et al. 2021, RoFormer, arXiv:2104.09864; partial: Black et al. 2022, GPT-NeoX-20B, arXiv:2204.06745",
    variants={"partial": {"rotary_fraction": 0.5}},
)
class Rotary(Position):
    """Rotary embedding (RoPE) on queries and keys, never values.

    Pairing convention: split halves, i.e. feature j pairs with feature j + r/2 (GPT-NeoX,
    Llama in Hugging Face). ``rotary_fraction`` < 1 rotates only the first r = int(d_head * fraction)
    features of each head and passes the rest through (GPT-NeoX's ``rotary_pct``).
    cos and sin are computed from the positions in each call (float64 angles, then the model's dtype).
    """

    tp_plan = no_plan  # no parameters; every rank rotates its own heads the same way

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        base, rotary_fraction = options["base"], options["rotary_fraction"]
        if not 0 < rotary_fraction <= 1:
            raise ConfigError("block.pos.rotary_fraction", rotary_fraction, "must be in (0, 1]")
        rotated = int(dims.d_head * rotary_fraction)
        if rotary_fraction == 1 and dims.d_head % 2:
            raise ConfigError(
                "block.d_model", dims.d_model, f"rotary needs an even head size, got d_model/n_heads={dims.d_head}"
            )
        if rotated < 2 or rotated % 2:
            raise ConfigError(
                "block.pos.rotary_fraction",
                rotary_fraction,
                f"rotates int(d_head * fraction) = {rotated} features of d_head={dims.d_head}; "
                "that must be a positive even number",
            )
        if not base > 1:
            raise ConfigError("block.pos.base", base, "must be > 1")

    def __init__(self, dims: BlockDims, *, base: float = 10000.0, rotary_fraction: float = 1.0) -> None:
        super().__init__()
        self.base = base
        self.rotated = int(dims.d_head * rotary_fraction)

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos of each angle, and sin with the first half negated (see _rotate): (..., r) each, for
        positions (...,). Angles in float64 from the positions themselves: no table to grow, so no
        host sync (``int(positions.max())``) and nothing that breaks a compiled graph."""
        exponents = torch.arange(0, self.rotated, 2, dtype=torch.float64, device=positions.device) / self.rotated
        angles = positions.to(torch.float64)[..., None] * self.base**-exponents  # (..., r/2)
        cos, sin = angles.cos(), angles.sin()
        return torch.cat([cos, cos], dim=-1).to(dtype), torch.cat([-sin, sin], dim=-1).to(dtype)  # halves share angles

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, signed_sin = self._cos_sin(positions, q.dtype)  # (t, r) broadcasts over batch and heads, or (b, t, r)
        if positions.ndim == 2:
            cos, signed_sin = rearrange(cos, "b t d -> b 1 t d"), rearrange(signed_sin, "b t d -> b 1 t d")
        return _rotate(q, cos, signed_sin), _rotate(k, cos, signed_sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (j, j + r/2) of the first r = cos.shape[-1] features; pass the rest through.

    x * cos + [-second, first] * sin, with [second, first] as a roll and the minus folded into
    ``signed_sin`` (= [-sin, sin]); two fewer ops per call than chunk + cat.
    """
    rotated = cos.shape[-1]
    if rotated < x.shape[-1]:  # partial rotary
        return torch.cat([_rotate(x[..., :rotated], cos, signed_sin), x[..., rotated:]], dim=-1)
    return x * cos + x.roll(rotated // 2, dims=-1) * signed_sin


def alibi_slopes(n_heads: int) -> list[float]:
    """Per-head slopes: the geometric sequence 2^(-8/n), 2^(-16/n), ... for n a power of two; otherwise
    those of the nearest lower power of two, then every other slope of the next one (Press et al.)."""

    def geometric(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return geometric(n_heads)
    lower = 2 ** math.floor(math.log2(n_heads))
    return geometric(lower) + geometric(2 * lower)[0::2][: n_heads - lower]


@POSITIONS.register(
    "alibi",
    formula="scores_h(i, j) -= m_h * |i - j|, m_h = 2^(-8h/n_heads)",
    reference="Press et al. 2021, Train Short, Test Long (ALiBi), arXiv:2108.12409",
)
class ALiBi(Position):
    """ALiBi: a per-head linear penalty on query-key distance added to the scores; no embedding.

    Passed to SDPA as a float mask, so attention stays on the fused kernels. Buffer: ``slopes`` (h,).
    """

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        """Each rank keeps the slopes of its own query heads."""
        return {"": tp.LocalHeads("slopes")}

    def __init__(self, dims: BlockDims) -> None:
        super().__init__()
        self.register_buffer("slopes", torch.tensor(alibi_slopes(dims.n_heads)), persistent=False)

    def score_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        # Positions (t,) give (h, t_q, t_k); per-sample positions (b, t) give (b, h, t_q, t_k).
        distance = (rearrange(q_positions, "... q -> ... q 1") - rearrange(k_positions, "... k -> ... 1 k")).abs()
        return -rearrange(self.slopes, "h -> h 1 1") * rearrange(distance, "... q k -> ... 1 q k")


EMBEDDING_NEED = (
    "adds positions to the token embeddings, which a lone block does not have: use it in a model, "
    "build the block with context='model' (the model adds the positions) or choose pos=none"
)


class LearnedEmbedding(nn.Module):
    """x + weight[positions]; ``weight`` is (max_len, d_model)."""

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        """The table, replicated: every rank adds it to the whole sequence before the blocks."""
        return {"": tp.Replicated()}

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (b, t, d), positions: (t,) or (b, t) -> (b, t, d). Positions must be below the table's
        length; the model checks its sequence length against it (:meth:`check_length`) on the host,
        so no per-call read of the positions."""
        return x + F.embedding(positions, self.weight).to(x.dtype)

    def check_length(self, end: int) -> None:
        """Raise when positions up to ``end`` (exclusive; a Python int) run past the table."""
        if end > self.weight.shape[0]:
            raise ValueError(f"position {end - 1} is past the learned table (block.max_len={self.weight.shape[0]})")


@POSITIONS.register(
    "learned",
    formula="x_i = embed(token_i) + P[i], P a learned (max_len, d_model) table",
    reference="Gehring et al. 2017, ConvS2S, arXiv:1705.03122; GPT-2 (Radford et al. 2019)",
)
class LearnedPosition(Position):
    """Learned absolute positions added at the embedding; the model owns the table, pos_embed.weight."""

    tp_plan = no_plan  # nothing in the block; the model's embedding has its plan

    needs = {"embedding": EMBEDDING_NEED}

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        if dims.max_len is None:
            raise ConfigError("block.max_len", None, "learned positions need a table size: the longest sequence")

    def __init__(self, dims: BlockDims) -> None:
        super().__init__()
        self.max_len, self.d_model = dims.max_len, dims.d_model

    def embedding(self) -> nn.Module:
        assert self.max_len is not None, "check() requires block.max_len"
        return LearnedEmbedding(self.max_len, self.d_model)


class SinusoidalEmbedding(nn.Module):
    """sqrt(d_model) x + PE[positions], PE(i, 2j) = sin(i / base^(2j/d)), PE(i, 2j+1) = cos(i / base^(2j/d)).

    No parameters. As in the original Transformer (Vaswani et al. 2017, section 3.4; fairseq), the token
    embeddings are multiplied by sqrt(d_model) before the table is added, and a model draws them with
    std ``token_init_std`` = d_model^-0.5: each token's vector then has norm about sqrt(d_model), the
    table's rows sqrt(d_model / 2). Without the scale, tokens drawn with std 0.02 (norm 0.02 sqrt(d_model))
    drown under the positions and the model barely learns.
    """

    tp_plan = no_plan

    def __init__(self, d_model: int, base: float) -> None:
        super().__init__()
        self.d_model, self.base = d_model, base
        self.scale = math.sqrt(d_model)
        self.token_init_std = d_model**-0.5

    def encode(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """PE at ``positions`` (...,) -> (..., d_model): float64 angles from the positions themselves,
        so no table to grow (no host sync, nothing that breaks a compiled graph)."""
        exponents = torch.arange(0, self.d_model, 2, dtype=torch.float64, device=positions.device) / self.d_model
        angles = positions.to(torch.float64)[..., None] * self.base**-exponents  # (..., d/2)
        return rearrange([angles.sin(), angles.cos()], "two ... half -> ... (half two)").to(dtype)  # interleaved

    def table(self, length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """PE for positions 0..length-1, (length, d_model)."""
        return self.encode(torch.arange(length, device=device), dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (b, t, d) token embeddings, positions: (t,) or (b, t) -> (b, t, d): sqrt(d) x + PE."""
        return x * self.scale + self.encode(positions, x.dtype)


@POSITIONS.register(
    "sinusoidal",
    formula="x_i = sqrt(d) embed(token_i) + [sin(i / base^(2j/d)), cos(i / base^(2j/d))]_j",
    reference="Vaswani et al. 2017, Attention Is All You Need, arXiv:1706.03762",
)
class SinusoidalPosition(Position):
    """Fixed sinusoidal absolute positions added at the embedding, to token embeddings scaled by sqrt(d).

    As in the original Transformer; :class:`SinusoidalEmbedding` computes them."""

    tp_plan = no_plan  # nothing in the block; the model's embedding has its plan

    needs = {"embedding": EMBEDDING_NEED}

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        base = options["base"]
        if dims.d_model % 2:
            raise ConfigError("block.d_model", dims.d_model, "sinusoidal positions need an even d_model")
        if not base > 1:
            raise ConfigError("block.pos.base", base, "must be > 1")

    def __init__(self, dims: BlockDims, *, base: float = 10000.0) -> None:
        super().__init__()
        self.d_model, self.base = dims.d_model, base

    def embedding(self) -> nn.Module:
        return SinusoidalEmbedding(self.d_model, self.base)
