"""Position-wise feed-forward networks: d_model -> hidden -> d_model.

An MLP builds at hidden width ``dims.d_ff`` (or its own default). Under ``block.mlp.match: params``
the assembly picks that width so the block has as many parameters as a reference block
(:mod:`zoo.assembly.match`); the MLP itself never sees the matching options.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from zoo.core.dims import BlockDims, dropout
from zoo.core.errors import ConfigError
from zoo.core.registry import MLPS
from zoo.core.reshape import rearrange
from zoo.core.tp import Plan, column_branch, is_dtensor
from zoo.parts.canon import Canon
from zoo.parts.state import LayerState


def glu_width(d_model: int, multiple_of: int = 8) -> int:
    """Default GLU hidden width: 2/3 of 4 * d_model (same parameters as a 4x MLP), rounded up."""
    hidden = int(8 * d_model / 3)
    return multiple_of * -(-hidden // multiple_of)


class MLP(nn.Module):
    """Base class: hidden width ``dims.d_ff``, or :meth:`default_width` when that is None."""

    @staticmethod
    def default_width(d_model: int) -> int:
        return 4 * d_model

    @classmethod
    def check_tp(cls, dims: BlockDims, tp: int, **options: object) -> None:
        """Under tensor parallelism the hidden width must split evenly between the ``tp`` ranks."""
        hidden = dims.d_ff or cls.default_width(dims.d_model)
        if hidden % tp:
            raise ConfigError("parallel.tp", tp, f"must divide the MLP's hidden width {hidden} (block.d_ff)")

    def __init__(self, dims: BlockDims) -> None:
        super().__init__()
        self.hidden = dims.d_ff or self.default_width(dims.d_model)
        self.drop = dropout(dims.dropout)

    def extra_repr(self) -> str:
        return f"hidden={self.hidden}"


class PlainMLP(MLP):
    """down(act(up(x))) with hidden width d_ff (default 4 * d_model). Parameters: ``up``, ``down``; with canon
    site d (``block.canon``) ``canon``, a canon layer on up(x) before the activation."""

    activation: Callable[[torch.Tensor], torch.Tensor]  # set by each subclass
    canon_sites: ClassVar[frozenset[str]] = frozenset({"d"})

    def __init__(self, dims: BlockDims) -> None:
        super().__init__(dims)
        self.up = nn.Linear(dims.d_model, self.hidden, bias=dims.bias)
        self.down = nn.Linear(self.hidden, dims.d_model, bias=dims.bias)
        self.canon = Canon(self.hidden, "d") if "d" in dims.canon_sites else None

    def matrix_blocks(self) -> dict[str, dict[str, torch.Tensor]]:
        """Nothing fused: ``up`` and ``down`` are one matrix each."""
        return {}

    def forward(
        self,
        x: torch.Tensor,
        *,
        real: torch.Tensor | None = None,
        cache: LayerState | None = None,
        taps: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (b, t, d_model) -> (b, t, d_model); ``real`` (the new tokens' padding mask), ``cache`` (the
        layer's decoding state) and ``taps`` (its document mask, zoo.parts.documents): the canon layer's, at site d."""
        hidden = self.up(x)
        if self.canon is not None:
            hidden = self.canon(hidden, real, cache, taps)
        return self.down(self.drop(self.activation(hidden)))

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        """``up`` column-wise (each rank a slice of the hidden units), ``down`` row-wise."""
        return column_branch(sequence_parallel, ("up",), "down")


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Separate gate and up weights (or biases), f rows each -> :class:`GatedMLP`'s interleaved ``gate_up``."""
    return rearrange([gate, up], "two f ... -> (f two) ...")


def split_gate_up(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of :func:`fuse_gate_up`: ``gate_up`` rows -> gate rows, up rows."""
    gate, up = rearrange(gate_up, "(f two) ... -> two f ...", two=2)
    return gate, up


class GatedMLP(MLP):
    """down(act(gate(x)) * up(x)), gate and up in one matmul; width d_ff (default 8/3 * d_model, to 8).

    Parameters: ``gate_up`` and ``down``. ``gate_up``'s rows interleave the two: row 2j is gate unit
    j, row 2j + 1 up unit j, so any contiguous slice of an even number of rows holds matching gate
    and up units (a tensor-parallel shard); :func:`fuse_gate_up` and :func:`split_gate_up` convert.
    With canon site d (``block.canon``): ``canon``, a canon layer on gate(x) and up(x) before the
    activation, its channels the gate units then the up units (the reference's concatenation).
    """

    activation: Callable[[torch.Tensor], torch.Tensor]  # the gate's, set by each subclass
    canon_sites: ClassVar[frozenset[str]] = frozenset({"d"})

    @staticmethod
    def default_width(d_model: int) -> int:
        return glu_width(d_model)

    def __init__(self, dims: BlockDims) -> None:
        super().__init__(dims)
        self.gate_up = nn.Linear(dims.d_model, 2 * self.hidden, bias=dims.bias)
        self.down = nn.Linear(self.hidden, dims.d_model, bias=dims.bias)
        self.canon = Canon(2 * self.hidden, "d") if "d" in dims.canon_sites else None

    def matrix_blocks(self) -> dict[str, dict[str, torch.Tensor]]:
        """``gate_up``'s interleaved rows as the gate and the up matrices (:func:`split_gate_up`); ``down``
        is one matrix."""
        gate, up = split_gate_up(torch.arange(self.gate_up.out_features))
        return {"gate_up.weight": {"gate": gate, "up": up}}

    def forward(
        self,
        x: torch.Tensor,
        *,
        real: torch.Tensor | None = None,
        cache: LayerState | None = None,
        taps: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (b, t, d_model) -> (b, t, d_model); ``real`` (the new tokens' padding mask), ``cache`` (the
        layer's decoding state) and ``taps`` (its document mask, zoo.parts.documents): the canon layer's, at site d."""
        gate, up = self.gate_and_up(x)
        if self.canon is not None:
            gate, up = self.canon(torch.cat([gate, up], dim=-1), real, cache, taps).chunk(2, dim=-1)
        return self.down(self.drop(self.glu(gate, up)))

    def glu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """The hidden units from the gate's and the up projection's: act(gate) * up."""
        return self.activation(gate) * up

    def gate_and_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """gate(x) and up(x), (b, t, f) each: one matmul per matrix of ``gate_up`` (its rows as strided views,
        no copy), so each comes out contiguous. Halves of the one fused output would be strided views: the
        activation and the product run slower on them, and their backward copies both back into one.
        Under tensor parallelism (a tp.DTensor weight) ``gate_up``'s own call, whose hooks gather the input
        and sum its gradient over the ranks."""
        if is_dtensor(self.gate_up.weight):
            gate, up = rearrange(self.gate_up(x), "... (f two) -> two ... f", two=2)  # (b, t, 2f) -> 2 x (b, t, f)
            return gate, up
        weights = split_gate_up(self.gate_up.weight)
        biases = (None, None) if self.gate_up.bias is None else split_gate_up(self.gate_up.bias)
        gate, up = (F.linear(x, w, b) for w, b in zip(weights, biases, strict=True))
        return gate, up

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        """``gate_up`` column-wise (interleaved rows: each rank matching gate and up units), ``down`` row-wise."""
        return column_branch(sequence_parallel, ("gate_up",), "down")


#: GELU's form: exact (erf), or the tanh approximation (GPT-2's ``gelu_new``, Gemma's ``gelu_pytorch_tanh``).
Approximate = Literal["none", "tanh"]


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))): GELU's tanh approximation."""
    return F.gelu(x, approximate="tanh")


class Gelu:
    """The ``approximate`` option of a GELU MLP: exact GELU (the class's ``activation``), or its tanh approximation."""

    activation: Callable[[torch.Tensor], torch.Tensor] = staticmethod(F.gelu)

    def __init__(self, dims: BlockDims, *, approximate: Approximate = "none") -> None:
        super().__init__(dims)  # type: ignore[call-arg]
        self.approximate = approximate
        if approximate == "tanh":
            self.activation = gelu_tanh

    def extra_repr(self) -> str:
        more = ", approximate=tanh" if self.approximate == "tanh" else ""
        return super().extra_repr() + more  # type: ignore[misc]


@MLPS.register(
    "gelu",
    formula="down(gelu(up(x))); approximate=tanh: gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))",
    reference="Hendrycks & Gimpel 2016, GELUs, arXiv:1606.08415",
    variants={"tanh": {"approximate": "tanh"}},  # geglu takes it too
)
class GeluMLP(Gelu, PlainMLP):
    """Two-layer MLP with exact (erf) GELU, as in BERT, or its tanh approximation (``approximate``), as in GPT-2."""

    tp_plan = PlainMLP.tp_plan  # the option adds no parameter: the plain MLP's plan


@MLPS.register(
    "relu",
    formula="down(relu(up(x)))",
    reference="Vaswani et al. 2017, Attention Is All You Need, arXiv:1706.03762",
)
class ReluMLP(PlainMLP):
    """Two-layer MLP with ReLU, as in the original Transformer."""

    activation = staticmethod(F.relu)


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


@MLPS.register(
    "relu2",
    formula="down(relu(up(x))^2)",
    reference="So et al. 2021, Primer, arXiv:2109.08668",
)
class ReluSquaredMLP(PlainMLP):
    """Two-layer MLP with squared ReLU (Primer)."""

    activation = staticmethod(relu_squared)


@MLPS.register(
    "swiglu",
    formula="down(silu(gate(x)) * up(x)), gate and up in one matmul",
    reference="Shazeer 2020, GLU Variants Improve Transformer, arXiv:2002.05202",
)
class SwiGLU(GatedMLP):
    """Gated MLP with SiLU gate; hidden width d_ff (default 8/3 * d_model, rounded up to 8)."""

    activation = staticmethod(F.silu)


@MLPS.register(
    "geglu",
    formula="down(gelu(gate(x)) * up(x)), gate and up in one matmul; approximate=tanh: gelu as in mlp=gelu",
    reference="Shazeer 2020, GLU Variants Improve Transformer, arXiv:2002.05202",
)
class GeGLU(Gelu, GatedMLP):
    """Gated MLP with a GELU gate, exact or its tanh approximation (``approximate``, Gemma's
    ``gelu_pytorch_tanh``); hidden width d_ff (default 8/3 * d_model, rounded up to 8)."""

    tp_plan = GatedMLP.tp_plan  # the option adds no parameter: the gated MLP's plan


@MLPS.register(
    "reglu",
    formula="down(relu(gate(x)) * up(x)), gate and up in one matmul",
    reference="Shazeer 2020, GLU Variants Improve Transformer, arXiv:2002.05202",
)
class ReGLU(GatedMLP):
    """Gated MLP with ReLU gate; hidden width d_ff (default 8/3 * d_model, rounded up to 8)."""

    activation = staticmethod(F.relu)


@MLPS.register(
    "clamped_swiglu",
    formula="down((clamp(up(x), -limit, limit) + 1) * g sigmoid(alpha g)), g = min(gate(x), limit); gate and up "
    "in one matmul",
    reference="OpenAI 2025, gpt-oss-120b & gpt-oss-20b Model Card, arXiv:2508.10925 (its experts' SwiGLU)",
    paired=True,  # SwiGLU with clamps: it meets every other part, as a variant does, not in the product
)
class ClampedSwiGLU(GatedMLP):
    """The SwiGLU of gpt-oss's experts: gate and up clamped at ``limit``, SiLU steepened by ``alpha``, up plus one.

    The gate is clamped from above and the up projection on both sides, the gate's activation is g sigmoid(alpha g);
    hidden width d_ff (default 8/3 * d_model, rounded up to 8). As a mixture of experts' ``expert`` it is built at its
    defaults, gpt-oss's limit 7 and alpha 1.702."""

    @classmethod
    def check(cls, dims: BlockDims, *, limit: float, alpha: float) -> None:
        if not limit > 0:
            raise ConfigError("block.mlp.limit", limit, "must be > 0 (the clamp on the gate and up projections)")
        if not alpha > 0:
            raise ConfigError("block.mlp.alpha", alpha, "must be > 0 (the slope in g sigmoid(alpha g))")

    def __init__(self, dims: BlockDims, *, limit: float = 7.0, alpha: float = 1.702) -> None:
        super().__init__(dims)
        self.limit, self.alpha = limit, alpha

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        """:class:`GatedMLP`'s: the clamps and the activation act on each hidden unit alone."""
        return super().tp_plan(sequence_parallel)

    def glu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate = gate.clamp(max=self.limit)
        return (up.clamp(-self.limit, self.limit) + 1) * gate * torch.sigmoid(self.alpha * gate)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, limit={self.limit:g}, alpha={self.alpha:g}"
