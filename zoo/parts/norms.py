"""Normalization layers over the last (feature) axis, and :func:`build_norm`, the one way zoo builds
a norm by name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zoo.core.dims import BlockDims
from zoo.core.errors import ConfigError
from zoo.core.options import option_types
from zoo.core.registry import NORMS
from zoo.core.tp import norm_plan


def build_norm(
    name: str, dims: BlockDims, *, width: int | None = None, shared: Mapping[str, Any] | None = None
) -> nn.Module:
    """The registered norm ``name`` over ``width`` features (default ``dims.d_model``); Identity for ``none``.

    Its options: its registered defaults, then those of ``shared`` that it takes (an option it does not
    take is left out, so a rmsnorm qk-norm takes a layernorm block norm's ``eps``). Every norm zoo builds
    comes from here: the block's (``shared``: the block norm's own options, so all of them), a model's
    final norm, attention's qk-norm (``shared``: the block norm's options) and latent attention's latent
    norms (no ``shared``: the latent norm's own defaults).
    """
    if name == "none":
        return nn.Identity()
    norm = NORMS.get(name)
    taken = option_types(norm.cls)
    options = {**norm.defaults, **{key: value for key, value in (shared or {}).items() if key in taken}}
    return norm.cls(dims if width is None else replace(dims, d_model=width), **options)


def unfused(self: nn.Module) -> dict[str, dict[str, torch.Tensor]]:
    """A norm's ``matrix_blocks``: nothing fused (its gains and biases are vectors)."""
    return {}


class HasEps:
    """A norm whose ``eps`` option must be positive."""

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        if not options["eps"] > 0:
            raise ConfigError("block.norm.eps", options["eps"], "must be > 0")


@NORMS.register(
    "layernorm",
    formula="(x - mean(x)) / sqrt(var(x) + eps) * g + b",
    reference="Ba et al. 2016, Layer Normalization, arXiv:1607.06450",
)
class LayerNorm(HasEps, nn.LayerNorm):
    """LayerNorm: centre and scale each vector, learned gain (and bias when block.bias)."""

    tp_plan = norm_plan  # sequence parallel under parallel.tp > 1
    matrix_blocks = unfused

    def __init__(self, dims: BlockDims, *, eps: float = 1e-5) -> None:
        super().__init__(dims.d_model, eps=eps, bias=dims.bias)


@NORMS.register(
    "rmsnorm",
    formula="y = x / sqrt(mean(x^2) + eps) * g; zero_centred: * (1 + w), w stored (init 0); gate_rank r > 0 "
    "(GatedNorm; norm=gated_rmsnorm is rmsnorm with r = 16): y * sigmoid(silu(y W_down) W_up), W_down (d, r), W_up "
    "(r, d), 2 d r parameters (6 x those training FLOPs per token) per norm made from block.norm (the placement's, "
    "the final norm, model.embedding_norm), never a qk-norm",
    reference="Zhang & Sennrich 2019, Root Mean Square Layer Normalization, arXiv:1910.07467; zero-centred: "
    "Gemma (Gemma Team 2024, arXiv:2403.08295), Qwen3-Next; gate_rank: GatedNorm, A Unified View of Attention "
    "and Residual Sinks, arXiv:2601.22966 (Marin's grug GatedNorm)",
    variants={"zc": {"zero_centred": True}, "gated": {"gate_rank": 4}},
)
class RMSNorm(HasEps, nn.Module):
    """RMSNorm: scale each vector by its root mean square, learned gain, no centring.

    ``zero_centred``: the gain is stored as w and applied as 1 + w (``weight`` starts at zeros), as Gemma's and
    Qwen3-Next's norms; the product runs in the statistics' precision before the cast back, as theirs does. A
    qk-norm and the final norm built beside a zero-centred block norm are zero-centred too (they share its options).
    ``gate_rank`` r > 0 (``norm=gated_rmsnorm``): GatedNorm, the normalized output times a low-rank sigmoid gate of
    itself, ``gate_in`` (r, d) and ``gate_out`` (d, r) (drawn as the model's matrices); a qk-norm never takes it.
    """

    tp_plan = norm_plan  # sequence parallel under parallel.tp > 1
    matrix_blocks = unfused

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        super().check(dims, **options)
        rank = options["gate_rank"]
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= dims.d_model:
            raise ConfigError("block.norm.gate_rank", rank, f"an integer from 0 (no gate) to d_model={dims.d_model}")

    @classmethod
    def check_tp(cls, dims: BlockDims, tp: int, **options: Any) -> None:
        if options["gate_rank"]:
            raise ConfigError("block.norm.gate_rank", options["gate_rank"], "0 under parallel.tp > 1 (not planned)")

    def __init__(
        self, dims: BlockDims, *, eps: float = 1e-6, zero_centred: bool = False, gate_rank: int = 0
    ) -> None:
        super().__init__()
        self.eps, self.zero_centred = eps, zero_centred
        self.weight = nn.Parameter(torch.zeros(dims.d_model) if zero_centred else torch.ones(dims.d_model))
        self.gate_in = nn.Linear(dims.d_model, gate_rank, bias=False) if gate_rank else None
        self.gate_out = nn.Linear(gate_rank, dims.d_model, bias=False) if gate_rank else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in at least float32, so bfloat16 inputs do not lose the mean of squares.
        # F.rms_norm is x * rsqrt(mean(x^2) + eps) * weight in one call (fewer kernels when decoding).
        dtype = torch.promote_types(x.dtype, torch.float32)
        gain = 1 + self.weight.to(dtype) if self.zero_centred else self.weight.to(dtype)
        y = F.rms_norm(x.to(dtype), self.weight.shape, gain, self.eps).to(x.dtype)
        if self.gate_in is None:
            return y
        return y * torch.sigmoid(self.gate_out(F.silu(self.gate_in(y))))


def ungated(options: Mapping[str, Any]) -> dict[str, Any]:
    """A block norm's options as a qk-norm shares them: all but RMSNorm's ``gate_rank``."""
    return {key: value for key, value in options.items() if key != "gate_rank"}


@NORMS.register(
    "scalenorm",
    formula="g * x / max(||x||_2, eps), one scalar gain g (init sqrt(d))",
    reference="Nguyen & Salazar 2019, Transformers without Tears, arXiv:1910.05895",
)
class ScaleNorm(HasEps, nn.Module):
    """ScaleNorm: project each vector onto a sphere whose radius is one learned scalar.

    Parameter: ``scale`` (shape (1,), initialized to sqrt(d_model)).
    """

    tp_plan = norm_plan  # sequence parallel under parallel.tp > 1
    matrix_blocks = unfused

    def __init__(self, dims: BlockDims, *, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.full((1,), dims.d_model**0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)  # the norm in at least float32
        h = x.to(dtype)
        h = h / torch.linalg.vector_norm(h, dim=-1, keepdim=True).clamp(min=self.eps)
        return (h * self.scale.to(dtype)).to(x.dtype)
