"""Where the norms sit relative to the residual stream. A placement wires the block's branches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

import torch
from torch import nn

from zoo.core.dims import BlockDims, dropout
from zoo.core.registry import PLACEMENTS
from zoo.core.tp import Plan, prefixed

Branch = Callable[[torch.Tensor], torch.Tensor]


class Placement(nn.Module):
    """Owns the norms (``norms.i``, one per branch unless :meth:`norm_count` says otherwise) and the
    residual dropout.

    ``final_norm`` says whether a model stacking this placement needs a norm after the last block;
    ``uses_norm`` False (with ``final_norm`` False and no norms made) declares a norm-free placement,
    whose ``norm`` choice a run does not record (it changes nothing).
    """

    final_norm: ClassVar[bool]
    uses_norm: ClassVar[bool] = True

    def __init__(self, dims: BlockDims, make_norm: Callable[[], nn.Module], n_branches: int) -> None:
        super().__init__()
        self.norms = nn.ModuleList(make_norm() for _ in range(self.norm_count(n_branches)))
        self.drop = dropout(dims.dropout)

    @classmethod
    def norm_count(cls, n_branches: int) -> int:
        """How many ``norms`` this placement owns for ``n_branches`` branches."""
        return n_branches

    @classmethod
    def update_count(cls, n_branches: int) -> int:
        """How many terms :meth:`updates` adds to the stream for ``n_branches`` branches (a placement that
        has ``updates``: zoo.core.interface.PlacementHooks)."""
        return n_branches

    def matrix_blocks(self) -> dict[str, dict[str, torch.Tensor]]:
        """Nothing fused: a placement's own parameters are its norms' (parts of their own)."""
        return {}

    # Subclasses define forward(x, branches: Sequence[Branch]) -> x; those that are a sum of terms on the
    # stream also define updates(branches) -> [u_i], x = x + u_i(x) in turn (a residual other than add owns it).


def norms_plan(self: Placement, sequence_parallel: bool) -> Plan:
    """A placement's tensor-parallel plan: its norms, each by its own plan (the residual additions and
    dropout run on whatever shard of the stream a rank holds)."""
    plan: Plan = {}
    for group in ("norms", "out_norms"):
        for i, norm in enumerate(getattr(self, group, ())):
            plan.update(prefixed(f"{group}.{i}", norm.tp_plan(sequence_parallel)))
    return plan


class SumOfUpdates(Placement):
    """A placement whose block is a sum of terms on the stream, one per branch: ``x = x + u_i(x)`` in turn."""

    def forward(self, x: torch.Tensor, branches: Sequence[Branch]) -> torch.Tensor:
        for update in self.updates(branches):  # type: ignore[attr-defined]
            x = x + update(x)
        return x


@PLACEMENTS.register(
    "pre",
    formula="x = x + f(norm(x)) for each branch f",
    reference="Xiong et al. 2020, On Layer Normalization in the Transformer Architecture, arXiv:2002.04745",
    # A block setting, so this placement's alone: the contract runs every other part beside canon layers at
    # every site the combination takes (zoo.assembly.combinations.block_settings).
    variants={"canon": {"canon": "abcd"}, "out_conv": {"out_conv": "attn,mlp"}},
)
class PreNorm(SumOfUpdates):
    """Pre-norm: normalize the branch input; the residual stream itself is never normalized."""

    tp_plan = norms_plan

    final_norm = True

    def updates(self, branches: Sequence[Branch]) -> list[Branch]:
        """``drop(f(norm(x)))`` for each branch f."""
        return [
            lambda x, norm=norm, branch=branch: self.drop(branch(norm(x)))
            for norm, branch in zip(self.norms, branches, strict=True)
        ]


@PLACEMENTS.register(
    "post",
    formula="x = norm(x + f(x)) for each branch f",
    reference="Vaswani et al. 2017, Attention Is All You Need, arXiv:1706.03762",
)
class PostNorm(Placement):
    """Post-norm: add the branch to the residual, then normalize the sum (the original Transformer)."""

    tp_plan = norms_plan

    final_norm = False

    def forward(self, x: torch.Tensor, branches: Sequence[Branch]) -> torch.Tensor:
        for norm, branch in zip(self.norms, branches, strict=True):
            x = norm(x + self.drop(branch(x)))
        return x


@PLACEMENTS.register(
    "sandwich",
    formula="x = x + norm_b(f(norm_a(x))) for each branch f",
    reference="Ding et al. 2021, CogView (sandwich-LN), arXiv:2105.13290; Gemma 2 (pre- and post-norm)",
)
class SandwichNorm(SumOfUpdates):
    """Sandwich norm: normalize the branch input and the branch output; the stream is never normalized.

    Parameters: ``norms.i`` (inputs, as in ``pre``) and ``out_norms.i`` (outputs).
    """

    tp_plan = norms_plan

    final_norm = True

    def __init__(self, dims: BlockDims, make_norm: Callable[[], nn.Module], n_branches: int) -> None:
        super().__init__(dims, make_norm, n_branches)
        self.out_norms = nn.ModuleList(make_norm() for _ in range(n_branches))

    def updates(self, branches: Sequence[Branch]) -> list[Branch]:
        """``drop(norm_b(f(norm_a(x))))`` for each branch f."""
        return [
            lambda x, norm=norm, out_norm=out_norm, branch=branch: self.drop(out_norm(branch(norm(x))))
            for norm, out_norm, branch in zip(self.norms, self.out_norms, branches, strict=True)
        ]


@PLACEMENTS.register(
    "reordered",
    formula="x = x + norm(f(x)) for each branch f",
    reference="OLMo et al. 2024, 2 OLMo 2 Furious, arXiv:2501.00656 (OLMo 2 and 3, OLMo-Hybrid)",
)
class ReorderedNorm(SumOfUpdates):
    """Reordered norm (OLMo 2): normalize each branch's output, not its input; the stream is never normalized.

    Parameters: ``norms.i``, branch i's output norm. A final norm follows the last block, as in OLMo 2.
    """

    tp_plan = norms_plan

    final_norm = True

    #: Its norm brings a branch's output, however small, to the stream's scale: the branch's own rounding error then
    #: reaches the block's output whole instead of diluted in the stream.
    contract_exceptions = {
        "bfloat16 close to float32": {
            "why": "the branch's output is normalized to the stream's scale, so the mixer's own bfloat16 error reaches "
            "the output undiluted; Gated DeltaNet's (4-feature heads at the contract's sizes) passes 5% at some draws "
            "where softmax attention's stays near 0.4% (every other mixer beside reordered is held to 5%)",
            "only_with": {"attn": ["gated_deltanet"]},
        }
    }

    def updates(self, branches: Sequence[Branch]) -> list[Branch]:
        """``drop(norm(f(x)))`` for each branch f."""
        return [
            lambda x, norm=norm, branch=branch: self.drop(norm(branch(x)))
            for norm, branch in zip(self.norms, branches, strict=True)
        ]


@PLACEMENTS.register(
    "parallel",
    formula="x = x + attn(norm(x)) + mlp(norm(x)), one shared norm",
    reference="Wang & Komatsuzaki 2021, GPT-J-6B; Chowdhery et al. 2022, PaLM, arXiv:2204.02311",
)
class Parallel(Placement):
    """Parallel branches (GPT-J, PaLM): every branch reads the same normalized input; outputs are summed.

    Parameter: ``norms.0`` (the one shared norm).
    """

    tp_plan = norms_plan

    final_norm = True

    @classmethod
    def norm_count(cls, n_branches: int) -> int:
        return 1

    @classmethod
    def update_count(cls, n_branches: int) -> int:
        return 1  # every branch reads the same input: one term, their sum

    def updates(self, branches: Sequence[Branch]) -> list[Branch]:
        """One term: ``sum_i drop(f_i(norm(x)))``."""

        def summed(x: torch.Tensor) -> torch.Tensor:
            h = self.norms[0](x)
            out = self.drop(branches[0](h))
            for branch in branches[1:]:
                out = out + self.drop(branch(h))
            return out

        return [summed]

    def forward(self, x: torch.Tensor, branches: Sequence[Branch]) -> torch.Tensor:
        # (x + a) + b, not x + (a + b) as updates() sums: the same rounding as before the residual axis.
        h = self.norms[0](x)
        out = x
        for branch in branches:
            out = out + self.drop(branch(h))
        return out
