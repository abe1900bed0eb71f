"""Where the norms sit relative to the residual stream. A placement wires the block's branches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

import torch
from torch import nn

from zoo.dims import BlockDims, dropout
from zoo.registry import PLACEMENTS

Branch = Callable[[torch.Tensor], torch.Tensor]


class Placement(nn.Module):
    """Owns one norm per branch (``norms.i``) and the residual dropout.

    ``final_norm`` says whether a model stacking this placement needs a norm after the last block.
    """

    final_norm: ClassVar[bool]

    def __init__(self, dims: BlockDims, make_norm: Callable[[], nn.Module], n_branches: int) -> None:
        super().__init__()
        self.norms = nn.ModuleList(make_norm() for _ in range(n_branches))
        self.drop = dropout(dims.dropout)

    # Subclasses define forward(x, branches: Sequence[Branch]) -> x.


@PLACEMENTS.register(
    "pre",
    formula="x = x + f(norm(x)) for each branch f",
    reference="Xiong et al. 2020, On Layer Normalization in the Transformer Architecture, arXiv:2002.04745",
)
class PreNorm(Placement):
    """Pre-norm: normalize the branch input; the residual stream itself is never normalized."""

    final_norm = True

    def forward(self, x: torch.Tensor, branches: Sequence[Branch]) -> torch.Tensor:
        for norm, branch in zip(self.norms, branches, strict=True):
            x = x + self.drop(branch(norm(x)))
        return x


@PLACEMENTS.register(
    "post",
    formula="x = norm(x + f(x)) for each branch f",
    reference="Vaswani et al. 2017, Attention Is All You Need, arXiv:1706.03762",
)
class PostNorm(Placement):
    """Post-norm: add the branch to the residual, then normalize the sum (the original Transformer)."""

    final_norm = False

    def forward(self, x: torch.Tensor, branches: Sequence[Branch]) -> torch.Tensor:
        for norm, branch in zip(self.norms, branches, strict=True):
            x = norm(x + self.drop(branch(x)))
        return x
