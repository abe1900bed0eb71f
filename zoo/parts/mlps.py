"""Position-wise feed-forward networks: d_model -> hidden -> d_model."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from zoo.dims import BlockDims, dropout
from zoo.registry import MLPS


def glu_width(d_model: int, multiple_of: int = 8) -> int:
    """Default GLU hidden width: 2/3 of 4 * d_model (same parameters as a 4x MLP), rounded up."""
    hidden = int(8 * d_model / 3)
    return multiple_of * -(-hidden // multiple_of)


class PlainMLP(nn.Module):
    """down(act(up(x))) with hidden width d_ff (default 4 * d_model)."""

    def __init__(self, dims: BlockDims) -> None:
        super().__init__()
        hidden = dims.d_ff or 4 * dims.d_model
        self.up = nn.Linear(dims.d_model, hidden, bias=dims.bias)
        self.down = nn.Linear(hidden, dims.d_model, bias=dims.bias)
        self.drop = dropout(dims.dropout)

    activation: Callable[[torch.Tensor], torch.Tensor]  # set by each subclass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.drop(self.activation(self.up(x))))


@MLPS.register(
    "gelu",
    formula="down(gelu(up(x)))",
    reference="Hendrycks & Gimpel 2016, GELUs, arXiv:1606.08415",
)
class GeluMLP(PlainMLP):
    """Two-layer MLP with exact (erf) GELU, as in GPT-2 and BERT."""

    activation = staticmethod(F.gelu)


@MLPS.register(
    "relu",
    formula="down(relu(up(x)))",
    reference="Vaswani et al. 2017, Attention Is All You Need, arXiv:1706.03762",
)
class ReluMLP(PlainMLP):
    """Two-layer MLP with ReLU, as in the original Transformer."""

    activation = staticmethod(F.relu)


@MLPS.register(
    "swiglu",
    formula="down(silu(gate(x)) * up(x)), gate and up in one matmul",
    reference="Shazeer 2020, GLU Variants Improve Transformer, arXiv:2002.05202",
)
class SwiGLU(nn.Module):
    """Gated MLP with SiLU gate; hidden width d_ff (default 8/3 * d_model, rounded up to 8).

    ``gate_up.weight`` holds the gate rows first, then the up rows.
    """

    def __init__(self, dims: BlockDims) -> None:
        super().__init__()
        hidden = dims.d_ff or glu_width(dims.d_model)
        self.gate_up = nn.Linear(dims.d_model, 2 * hidden, bias=dims.bias)
        self.down = nn.Linear(hidden, dims.d_model, bias=dims.bias)
        self.drop = dropout(dims.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # (b, t, 2f) -> 2 x (b, t, f)
        return self.down(self.drop(F.silu(gate) * up))
