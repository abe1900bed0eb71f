"""How a block's branches join the residual stream (``block.residual``); the placement still chooses where the
norms go (zoo.parts.placements).

- ``add``: the placement's own ``x = x + f(norm(x))``, as before the axis (the default).
- ``scaled``: before the block ``x = lambda_r x + lambda_0 x0``, ``x0`` the stack's embedding output (after
  absolute positions), one learned pair per layer (nanochat's ``resid_lambdas``, ``x0_lambdas``).
- ``hyper``: ``n_streams`` residual streams ``H`` (b, t, n, d); per term ``u`` of the placement (its
  ``updates``): ``h = sum_j read_j H_j``, then ``H <- mix^T H + write (x) u(h)`` (Zhu et al. 2024), with
  ``sinkhorn_iters`` > 0 the manifold-constrained form (DeepSeek 2025, mHC). The stack expands the embedding
  into the streams and sums them before its final norm; a block alone takes (b, t, d) and does the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from zoo.core.dims import BlockDims
from zoo.core.errors import ConfigError
from zoo.core.interface import hook
from zoo.core.registry import RESIDUALS
from zoo.core.tp import Plan, ReplicatedParameters, no_plan, replicated
from zoo.parts.placements import Branch, Placement


class Residual(nn.Module):
    """The residual part: ``forward(x, x0, placement, branches) -> x`` runs a block's branches through its
    placement. ``x0``: the stack's embedding output (None: the block's own input), read when ``uses_x0``.
    ``reset_parameters()`` sets the initial values (the model's init calls it instead of drawing them)."""

    uses_x0 = False
    owns_add = False
    #: The residual streams the block keeps (1: the stream is (b, t, d_model)).
    streams = 1

    def __init__(self, dims: BlockDims, n_updates: int, layer: int) -> None:
        super().__init__()
        self.d_model = dims.d_model

    def value(self, name: str) -> torch.Tensor:
        """Parameter ``name`` as a whole local tensor, also under tensor parallelism (zoo.core.tp.replicated)."""
        return replicated(self, getattr(self, name))

    def reset_parameters(self) -> None:
        """Nothing to set."""

    def matrix_blocks(self) -> dict[str, dict[str, torch.Tensor]]:
        """Nothing fused, and no matrix: its scalars and per-term rows are vectors (AdamW under Muon)."""
        return {}


@RESIDUALS.register(
    "add",
    formula="x = x + f(norm(x)) for each branch f, as the placement adds it",
    reference="He et al. 2016, Deep Residual Learning for Image Recognition, arXiv:1512.03385",
)
class Add(Residual):
    """The placement's own residual addition: the block as before the residual axis."""

    tp_plan = no_plan

    def forward(
        self, x: torch.Tensor, x0: torch.Tensor | None, placement: Placement, branches: Sequence[Branch]
    ) -> torch.Tensor:
        return placement(x, branches)


@RESIDUALS.register(
    "scaled",
    formula="x = lambda_r x + lambda_0 x0 before each layer (x0 the embedding output), lambda_r = 1, lambda_0 = 0 "
    "at init; then the placement",
    reference="Karpathy 2025, nanochat (resid_lambdas, x0_lambdas), github.com/karpathy/nanochat",
)
class Scaled(Residual):
    """Learned scalars on the stream and on the embedding output, re-injected before every layer.

    Parameters: ``resid_lambda`` (1 at init) and ``x0_lambda`` (0 at init), so at init the block is ``add``'s.
    """

    uses_x0 = True

    def __init__(self, dims: BlockDims, n_updates: int, layer: int) -> None:
        super().__init__(dims, n_updates, layer)
        self.resid_lambda = nn.Parameter(torch.ones(1))
        self.x0_lambda = nn.Parameter(torch.zeros(1))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.resid_lambda.fill_(1.0)
            self.x0_lambda.fill_(0.0)

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        return {"": ReplicatedParameters(sequence_parallel)}

    def extra_flops(self, seq_len: int) -> int:
        """Two products and a sum per feature (x 3 for forward and backward)."""
        return 9 * self.d_model

    def forward(
        self, x: torch.Tensor, x0: torch.Tensor | None, placement: Placement, branches: Sequence[Branch]
    ) -> torch.Tensor:
        x0 = x if x0 is None else x0
        return placement(self.value("resid_lambda") * x + self.value("x0_lambda") * x0, branches)


def sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """(..., n, n) logits -> exp(logits) made doubly stochastic by ``iters`` Sinkhorn-Knopp iterations (rows
    normalized, then columns: every column sums to 1 exactly, every row to 1 within the iteration's tolerance)."""
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iters):
        m = m / m.sum(dim=-1, keepdim=True)
        m = m / m.sum(dim=-2, keepdim=True)
    return m


@RESIDUALS.register(
    "hyper",
    formula="H (n streams): h = sum_j read_j H_j; H = mix^T H + write (x) u(h) for each term u of the placement; "
    "static (learned) weights, plus s tanh(norm(H_j) W) per stream when dynamic; sinkhorn_iters > 0: read = "
    "sigmoid, write = 2 sigmoid, mix = Sinkhorn(exp) (doubly stochastic); the stack expands the embedding into "
    "the streams and sums them before the final norm",
    reference="Zhu et al. 2024, Hyper-Connections, arXiv:2409.19606; DeepSeek-AI 2025, mHC: "
    "Manifold-Constrained Hyper-Connections, arXiv:2512.24880",
    variants={"mhc": {"sinkhorn_iters": 20}, "dynamic": {"dynamic": True}},
)
class Hyper(Residual):
    """Hyper-connections: ``n_streams`` residual streams, read, mixed and written with learned weights.

    Per term ``u`` of the placement (``updates``; pre: one per branch): ``h = sum_j read_j H_j``,
    ``H <- mix^T H + write (x) u(h)``, i.e. new stream ``k = sum_j mix[j, k] H_j + write_k u(h)``.
    Initial values (the paper's): read = e_(i mod n) for the block's i-th term over the stack, mix = I,
    write = 1, so streams that start equal stay equal and each equals ``add``'s stream. ``dynamic``: each
    weight also gets ``s tanh(rms_norm(H_j) W)`` from stream j (``W`` 0 at init, ``s`` 0.01: read and mix
    share ``alpha_scale``, write has ``beta_scale``). ``sinkhorn_iters`` > 0 (mHC): the weights are logits,
    read = sigmoid, write = 2 sigmoid, mix = Sinkhorn(exp), with no tanh on the dynamic part; initial logits
    read e_(i mod n), mix I, write 0 (write = 1; mix doubly stochastic, so equal streams stay equal).

    Parameters (one row per term, flat so that optimizers and init treat them as scalars, not matrices):
    ``read`` (terms x n), ``mix`` (terms x n x n), ``write`` (terms x n); with ``dynamic`` also
    ``alpha_scale``, ``beta_scale`` (terms) and ``dynamic_weight`` (terms, n + 2, d_model: read, write, then
    the mix row of each stream).
    """

    owns_add = True

    @classmethod
    def stream_count(cls, *, n_streams: int = 4, **options: Any) -> int:
        return n_streams

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        if options["n_streams"] < 1:
            raise ConfigError("block.residual.n_streams", options["n_streams"], "must be >= 1")
        if options["sinkhorn_iters"] < 0:
            raise ConfigError(
                "block.residual.sinkhorn_iters", options["sinkhorn_iters"], "must be >= 0 (0: plain hyper-connections)"
            )

    def __init__(
        self,
        dims: BlockDims,
        n_updates: int,
        layer: int,
        *,
        n_streams: int = 4,
        dynamic: bool = False,
        sinkhorn_iters: int = 0,
    ) -> None:
        super().__init__(dims, n_updates, layer)
        self.n_streams, self.n_updates, self.first = n_streams, n_updates, layer * n_updates
        self.dynamic, self.sinkhorn_iters = dynamic, sinkhorn_iters
        n = n_streams
        self.read = nn.Parameter(torch.empty(n_updates * n))
        self.mix = nn.Parameter(torch.empty(n_updates * n * n))
        self.write = nn.Parameter(torch.empty(n_updates * n))
        if dynamic:
            self.alpha_scale = nn.Parameter(torch.empty(n_updates))
            self.beta_scale = nn.Parameter(torch.empty(n_updates))
            self.dynamic_weight = nn.Parameter(torch.empty(n_updates, n + 2, dims.d_model))
        self.reset_parameters()

    @property
    def streams(self) -> int:
        return self.n_streams

    def reset_parameters(self) -> None:
        n, terms = self.n_streams, self.n_updates
        with torch.no_grad():
            read = torch.zeros(terms, n)
            read[torch.arange(terms), (self.first + torch.arange(terms)) % n] = 1.0
            self.read.copy_(rearrange(read, "u n -> (u n)"))
            self.mix.copy_(rearrange(repeat(torch.eye(n), "j k -> u j k", u=terms), "u j k -> (u j k)"))
            self.write.fill_(0.0 if self.sinkhorn_iters else 1.0)  # mHC: 2 sigmoid(0) = 1
            if self.dynamic:
                self.alpha_scale.fill_(0.01)
                self.beta_scale.fill_(0.01)
                self.dynamic_weight.zero_()

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        return {"": ReplicatedParameters(sequence_parallel)}

    def extra_flops(self, seq_len: int) -> int:
        """Per term, forward: the read (2 n d), the mix (2 n^2 d) and the write (2 n d); with ``dynamic`` the
        projection of every stream (2 n (n + 2) d, of which the model counts 2 (n + 2) d as parameters) and
        the Sinkhorn iterations (4 n^2 each). x 3 for forward and backward."""
        n, d = self.n_streams, self.d_model
        forward = 2 * n * n * d + 4 * n * d
        if self.dynamic:
            forward += 2 * (n - 1) * (n + 2) * d + 4 * n * n * self.sinkhorn_iters
        return 3 * self.n_updates * forward

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        """(b, t, d) -> (b, t, n, d): the stream copied into every residual stream."""
        return repeat(x, "b t d -> b t n d", n=self.n_streams)

    @staticmethod
    def merge(streams: torch.Tensor) -> torch.Tensor:
        """(b, t, n, d) -> (b, t, d): the streams' sum."""
        return streams.sum(dim=2)

    def weights(self, streams: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Term ``i``'s read (..., n), mix (..., n, n) and write (..., n) for ``streams`` (b, t, n, d): ``...``
        is () for static weights, (b, t) for dynamic ones."""
        n = self.n_streams
        read = rearrange(self.value("read"), "(u n) -> u n", n=n)[i]
        mix = rearrange(self.value("mix"), "(u j k) -> u j k", j=n, k=n)[i]
        write = rearrange(self.value("write"), "(u n) -> u n", n=n)[i]
        if self.dynamic:
            normed = F.rms_norm(streams, (streams.shape[-1],))
            raw = torch.einsum("btjd,ed->btje", normed, self.value("dynamic_weight")[i])  # (b, t, n, n + 2)
            raw = raw if self.sinkhorn_iters else torch.tanh(raw)
            alpha, beta = self.value("alpha_scale")[i], self.value("beta_scale")[i]
            read = read + alpha * raw[..., 0]
            write = write + beta * raw[..., 1]
            mix = mix + alpha * raw[..., 2:]  # row j from stream j
        if self.sinkhorn_iters:
            read, write, mix = torch.sigmoid(read), 2 * torch.sigmoid(write), sinkhorn(mix, self.sinkhorn_iters)
        return read, mix, write

    def update(self, streams: torch.Tensor, i: int, term: Branch) -> torch.Tensor:
        """One term: ``h = sum_j read_j H_j``; ``H_k <- sum_j mix[j, k] H_j + write_k term(h)``."""
        read, mix, write = self.weights(streams, i)
        h = torch.einsum("...j,...jd->...d", read, streams)
        out = term(h)
        mixed = torch.einsum("...jk,...jd->...kd", mix, streams)
        return mixed + torch.einsum("...k,...d->...kd", write, out)

    def forward(
        self, x: torch.Tensor, x0: torch.Tensor | None, placement: Placement, branches: Sequence[Branch]
    ) -> torch.Tensor:
        """x: the streams (b, t, n, d), or (b, t, d) for a block alone (expanded, and summed on the way out)."""
        if x.ndim == 3:
            return self.merge(self.forward(self.expand(x), x0, placement, branches))
        for i, term in enumerate(placement.updates(branches)):
            x = self.update(x, i, term)
        return x


def stream_count(residual: Any) -> int:
    """The residual streams a block of this residual choice (a ``PartChoice``) keeps."""
    return hook(residual.part.cls, "stream_count")(**residual.options)


__all__ = ["Add", "Hyper", "Residual", "Scaled", "sinkhorn", "stream_count"]
