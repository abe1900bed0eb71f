"""Attention residuals (``residual=attnres``; block AttnRes with ``block.residual.block_size``): each branch's input a
softmax-weighted sum of the earlier branches' outputs (or blocks of them), a learned query per branch (docs/parts.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zoo.core import tp
from zoo.core.dims import BlockDims
from zoo.core.errors import ConfigError
from zoo.core.registry import RESIDUALS
from zoo.core.reshape import rearrange
from zoo.core.tp import Plan
from zoo.parts.placements import Branch, Placement
from zoo.parts.residuals import Residual


@RESIDUALS.register(
    "attnres",
    formula="sources S = [embedding, blocks...]; per term j of the placement: h = sum_i softmax_i(q_j . rmsnorm_w_j("
    "S_i)) S_i, u = u_j(h); u starts a new source when j % block_size == 0 (j counted over the stack), else is "
    "added to the last; q_j = 0 (the sources' mean) and w_j = 1 at init; the final stream is the sources' sum",
    reference="Kimi Team 2026, Attention Residuals, arXiv:2603.15031 (fla-core's ops/attnres naive_attnres)",
    variants={"block": {"block_size": 4}},
)
class AttentionResidual(Residual):
    """Attention residuals: each term of the placement reads a softmax-weighted sum of the sources before it.

    The stack passes the sources (b, t, n, d), the embedding first; term ``j`` (counted over the stack: layer x
    terms + i) reads ``h = sum_i p_i S_i``, ``p = softmax_i(q_j . rms_norm(S_i) w_j)`` (fla-core's
    ``naive_attnres`` with scale 1), and its output ``u_j(h)`` becomes a new source when ``j % block_size == 0``,
    else is added to the last source: ``block_size`` 1 is full AttnRes (every output its own source), larger is
    block AttnRes (the block's outputs summed into one source). A block alone takes (b, t, d) as the one source and
    returns the sources' sum, as the stack does before its final norm (what ``add``'s stream would be).

    Parameters (flat, one row of d_model per term, so optimizers treat them as vectors): ``query`` (0 at init: the
    sources' mean) and ``key_norm`` (the RMSNorm gain of the sources, 1 at init); none for the stack's first term,
    which reads the embedding alone (a block of one term at layer 0 has none). The weights are computed in at least
    float32."""

    owns_add = True
    #: A growing number of sources, not a fixed number of streams.
    streams = 0

    @classmethod
    def stream_count(cls, **options: Any) -> int:
        return 0

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        if options["block_size"] < 1:
            raise ConfigError("block.residual.block_size", options["block_size"], "must be >= 1 (1: full AttnRes)")
        if not options["eps"] > 0:
            raise ConfigError("block.residual.eps", options["eps"], "must be > 0")

    def __init__(self, dims: BlockDims, n_updates: int, layer: int, *, block_size: int = 1, eps: float = 1e-6) -> None:
        super().__init__(dims, n_updates, layer)
        self.n_updates, self.first, self.block_size, self.eps = n_updates, layer * n_updates, block_size, eps
        self.skip = int(self.first == 0)  # the stack's first term reads the embedding alone: no weights
        self.rows = n_updates - self.skip
        if self.rows:
            self.query = nn.Parameter(torch.empty(self.rows * dims.d_model))
            self.key_norm = nn.Parameter(torch.empty(self.rows * dims.d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.rows:
            with torch.no_grad():
                self.query.zero_()
                self.key_norm.fill_(1.0)

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        return {"": tp.ReplicatedParameters(sequence_parallel)}

    def sources_before(self, j: int) -> int:
        """The sources term ``j`` (over the stack) reads: the embedding, then one per block started before it."""
        return 1 + -(-j // self.block_size)

    def extra_flops(self, seq_len: int) -> int:
        """Per term over n sources, forward: the normalization (4 n d), the logits (2 n d) and the weighted sum
        (2 n d), less the 2 per parameter (4 d) the model counts. x 3 for forward and backward."""
        d = self.d_model
        terms = range(self.first + self.skip, self.first + self.n_updates)
        return 3 * sum((8 * self.sources_before(j) - 4) * d for j in terms)

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        """(b, t, d) -> (b, t, 1, d): the embedding, the first source."""
        return rearrange(x, "b t d -> b t 1 d")

    @staticmethod
    def merge(sources: torch.Tensor) -> torch.Tensor:
        """(b, t, n, d) -> (b, t, d): the sources' sum."""
        return sources.sum(dim=2)

    def read(self, sources: torch.Tensor, i: int) -> torch.Tensor:
        """Term ``i``'s input: the sources (b, t, n, d) weighted by the softmax of its query against their norms
        (the stack's first term: its one source, the embedding)."""
        if self.first + i == 0:
            return sources[:, :, 0]
        d, i = self.d_model, i - self.skip
        work = torch.promote_types(sources.dtype, torch.float32)
        query = rearrange(self.value("query"), "(u d) -> u d", d=d)[i].to(work)
        gain = rearrange(self.value("key_norm"), "(u d) -> u d", d=d)[i].to(work)
        values = sources.to(work)
        keys = F.rms_norm(values, (d,), gain, self.eps)
        weights = torch.einsum("btnd,d->btn", keys, query).softmax(dim=-1)
        return torch.einsum("btn,btnd->btd", weights, values).to(sources.dtype)

    def forward(
        self, x: torch.Tensor, x0: torch.Tensor | None, placement: Placement, branches: Sequence[Branch]
    ) -> torch.Tensor:
        """x: the sources (b, t, n, d), or (b, t, d) for a block alone (its one source, the sum returned)."""
        if x.ndim == 3:
            return self.merge(self.forward(self.expand(x), x0, placement, branches))
        for i, term in enumerate(placement.updates(branches)):
            out = rearrange(term(self.read(x, i)), "b t d -> b t 1 d")
            if (self.first + i) % self.block_size == 0:
                x = torch.cat([x, out], dim=2)
            else:
                x = torch.cat([x[:, :, :-1], x[:, :, -1:] + out], dim=2)
        return x
