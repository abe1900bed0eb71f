"""How a block's branches join the residual stream (``block.residual``); the placement still chooses where the
norms go (zoo.parts.placements).

- ``add``: the placement's own ``x = x + f(norm(x))``, as before the axis (the default).
- ``scaled``: before the block ``x = lambda_r x + lambda_0 x0``, ``x0`` the stack's embedding output (after
  absolute positions), one learned pair per layer (nanochat's ``resid_lambdas``, ``x0_lambdas``).
- ``hyper``: ``n_streams`` residual streams ``H`` (b, t, n, d); per term ``u`` of the placement (its
  ``updates``): ``h = sum_j read_j H_j``, then ``H <- mix^T H + write (x) u(h)`` (Zhu et al. 2024), each stream
  normalized and projected apart when dynamic; ``sinkhorn_iters`` > 0 puts mHC's constraints on that form.
- ``mhc``: the same streams, with read, write and mix from one projection of all the streams together, normalized
  as one vector (the mHC paper's and DeepSeek-V4's form).
- ``attnres``: attention residuals; each term reads a softmax-weighted sum of the sources before it (the
  embedding, then every earlier term's output, or with ``block_size`` > 1 each block's summed outputs), weighted
  by a learned query per term against the RMS-normalized sources (Kimi's Attention Residuals).

The stack expands the embedding into the streams and sums them before its final norm; a block alone takes
(b, t, d) and does the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zoo.core import tp
from zoo.core.dims import BlockDims
from zoo.core.errors import ConfigError
from zoo.core.interface import hook
from zoo.core.registry import RESIDUALS
from zoo.core.reshape import rearrange, repeat
from zoo.core.tp import Plan, no_plan, replicated
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
        return {"": tp.ReplicatedParameters(sequence_parallel)}

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


class Streams(Residual):
    """A residual of ``n_streams`` residual streams H (b, t, n, d), read, mixed and written per term of the placement.

    Per term ``u`` (``placement.updates``; pre: one per branch) with weights ``read`` (n), ``mix`` (n, n) and
    ``write`` (n) from :meth:`weights`: ``h = sum_j read_j H_j``, ``H <- mix^T H + write (x) u(h)``, i.e. new stream
    ``k = sum_j mix[j, k] H_j + write_k u(h)``. The stack expands the embedding into the streams and sums them before
    its final norm; a block alone takes (b, t, d) and does the same."""

    owns_add = True

    def __init__(self, dims: BlockDims, n_updates: int, layer: int, n_streams: int) -> None:
        super().__init__(dims, n_updates, layer)
        self.n_streams, self.n_updates, self.first = n_streams, n_updates, layer * n_updates

    @classmethod
    def stream_count(cls, *, n_streams: int = 4, **options: Any) -> int:
        return n_streams

    @property
    def streams(self) -> int:
        return self.n_streams

    def weights(self, streams: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Term ``i``'s read (..., n), mix (..., n, n) and write (..., n) for ``streams`` (b, t, n, d)."""
        raise NotImplementedError

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        """(b, t, d) -> (b, t, n, d): the stream copied into every residual stream."""
        return repeat(x, "b t d -> b t n d", n=self.n_streams)

    @staticmethod
    def merge(streams: torch.Tensor) -> torch.Tensor:
        """(b, t, n, d) -> (b, t, d): the streams' sum."""
        return streams.sum(dim=2)

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


def check_streams(options: dict[str, Any], least_iters: int, why: str) -> None:
    """The options both multi-stream residuals take: at least one stream, and ``least_iters`` Sinkhorn iterations."""
    if options["n_streams"] < 1:
        raise ConfigError("block.residual.n_streams", options["n_streams"], "must be >= 1")
    if options["sinkhorn_iters"] < least_iters:
        iters = options["sinkhorn_iters"]
        raise ConfigError("block.residual.sinkhorn_iters", iters, f"must be >= {least_iters} ({why})")


@RESIDUALS.register(
    "hyper",
    formula="H (n streams): h = sum_j read_j H_j; H = mix^T H + write (x) u(h) for each term u of the placement; "
    "static (learned) weights, plus s tanh(norm(H_j) W) per stream when dynamic, each stream normalized and "
    "projected apart; sinkhorn_iters > 0: read = sigmoid, write = 2 sigmoid, mix = Sinkhorn(exp) (doubly "
    "stochastic, mHC's constraints on this form; mhc is the mHC paper's own); the stack expands the embedding into "
    "the streams and sums them before the final norm",
    reference="Zhu et al. 2024, Hyper-Connections, arXiv:2409.19606; the constraints of Xie et al. 2025, mHC: "
    "Manifold-Constrained Hyper-Connections, arXiv:2512.24880",
    # "sinkhorn" names dynamic (at its default) so that it stays hyper's: mhc takes sinkhorn_iters too, at 20 already
    variants={"sinkhorn": {"sinkhorn_iters": 20, "dynamic": False}, "dynamic": {"dynamic": True}},
)
class Hyper(Streams):
    """Hyper-connections: ``n_streams`` residual streams, read, mixed and written with learned weights.

    Per term ``u`` of the placement (:class:`Streams`): ``h = sum_j read_j H_j``, ``H <- mix^T H + write (x) u(h)``.
    Initial values (the paper's): read = e_(i mod n) for the block's i-th term over the stack, mix = I,
    write = 1, so streams that start equal stay equal and each equals ``add``'s stream. ``dynamic``: each
    weight also gets ``s tanh(rms_norm(H_j) W)`` from stream j (``W`` 0 at init, ``s`` 0.01: read and mix
    share ``alpha_scale``, write has ``beta_scale``): the Hyper-Connections paper's form, each stream normalized and
    projected apart. ``sinkhorn_iters`` > 0 puts mHC's constraints on this form: the weights are logits, read =
    sigmoid, write = 2 sigmoid, mix = Sinkhorn(exp), with no tanh on the dynamic part; initial logits read
    e_(i mod n), mix I, write 0 (write = 1; mix doubly stochastic, so equal streams stay equal). The mHC paper's own
    form (the streams normalized and projected together) is ``residual=mhc`` (:class:`ManifoldHyper`).

    Parameters (one row per term, flat so that optimizers and init treat them as scalars, not matrices):
    ``read`` (terms x n), ``mix`` (terms x n x n), ``write`` (terms x n); with ``dynamic`` also
    ``alpha_scale``, ``beta_scale`` (terms) and ``dynamic_weight`` (terms, n + 2, d_model: read, write, then
    the mix row of each stream).
    """

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        check_streams(options, least_iters=0, why="0: plain hyper-connections")

    @classmethod
    def contract_exceptions(cls, *, sinkhorn_iters: int = 0, **options: Any) -> dict[str, str]:
        """Under mHC's constraints a lone block's mix changes nothing its output shows: no gradient reaches it."""
        if not sinkhorn_iters:
            return {}
        why = (
            "in a lone block the doubly stochastic mix changes nothing the output shows: its first term mixes the "
            "equal streams the block expands its input into (mix^T H = H, as every column sums to 1) and its last "
            "is read only through the streams' sum (kept, as every row sums to 1), so the mix's gradient is rounding "
            "(tests/test_residual.py: the mix learns from streams that differ, as in a model)"
        )
        gradients = ("gradients reach the input and every parameter",
                     "cross attention gradients reach memory and every parameter")  # fmt: skip
        return dict.fromkeys(gradients, why)

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
        super().__init__(dims, n_updates, layer, n_streams)
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
        return {"": tp.ReplicatedParameters(sequence_parallel)}

    def extra_flops(self, seq_len: int) -> int:
        """Per term, forward: the read (2 n d), the mix (2 n^2 d) and the write (2 n d); with ``dynamic`` the
        projection of every stream (2 n (n + 2) d, of which the model counts 2 (n + 2) d as parameters) and
        the Sinkhorn iterations (4 n^2 each). x 3 for forward and backward."""
        n, d = self.n_streams, self.d_model
        forward = 2 * n * n * d + 4 * n * d
        if self.dynamic:
            forward += 2 * (n - 1) * (n + 2) * d + 4 * n * n * self.sinkhorn_iters
        return 3 * self.n_updates * forward

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


def mhc_sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """(..., n, n) logits -> mHC's doubly stochastic mixing matrix: softmax over each row, plus ``eps``; columns
    normalized; then ``iters`` - 1 times rows, then columns, each divided by its sum plus ``eps`` (DeepSeek-V4's
    hc_sinkhorn_iters, hc_eps). Every column sums to 1 within eps, every row within the iteration's tolerance."""
    m = logits.softmax(dim=-1) + eps
    m = m / (m.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        m = m / (m.sum(dim=-1, keepdim=True) + eps)
        m = m / (m.sum(dim=-2, keepdim=True) + eps)
    return m


@RESIDUALS.register(
    "mhc",
    formula="H (n streams): per term u of the placement, z = rmsnorm(flatten(H)) W_u (one projection of the n d "
    "features to 2 n + n^2); read = sigmoid(s_1 z_read + b_read) + eps, write = 2 sigmoid(s_2 z_write + b_write), "
    "mix = Sinkhorn(softmax(s_3 z_mix + b_mix) + eps) (doubly stochastic); h = sum_j read_j H_j, H = mix^T H + "
    "write (x) u(h); the stack expands the embedding into the streams and sums them before the final norm",
    reference="Xie et al. 2025, mHC: Manifold-Constrained Hyper-Connections, arXiv:2512.24880; DeepSeek-AI 2026, "
    "DeepSeek-V4 (transformers' DeepseekV4HyperConnection)",
)
class ManifoldHyper(Streams):
    """Manifold-constrained hyper-connections (mHC) as the paper and DeepSeek-V4 define them: ``n_streams`` residual
    streams whose read, write and mixing weights come from all the streams at once.

    Per term ``u`` of the placement (:class:`Streams`): the streams flattened to one vector of n d features,
    RMS-normalized without a gain (epsilon ``norm_eps``) and projected by ``projection`` to n read, n write and n^2
    mixing logits, each group multiplied by its own learned scale (``scale``) and offset by a learned bias
    (``base``); read = sigmoid + ``eps``, write = 2 sigmoid, mix = Sinkhorn of a row softmax (:func:`mhc_sinkhorn`,
    ``sinkhorn_iters`` iterations). :class:`Hyper` with ``dynamic`` and ``sinkhorn_iters`` is the Hyper-Connections
    paper's form under the same constraints: each stream normalized and projected apart, with per-stream terms.

    Initial values: ``projection`` 0, ``scale`` 1, and ``base`` such that read = 1/n (the streams' mean, so equal
    streams are read as the one stream), write = 1 and mix uniform (doubly stochastic): equal streams stay equal,
    each ``add``'s stream up to the eps terms (a relative 1e-6 at eps = 1e-6). DeepSeek-V4's own init draws the
    projection at random around zero bases. Parameters (flat where they are scalars, as optimizers and init treat
    them): ``projection`` (terms, 2 n + n^2, n d_model), ``base`` (terms x (2 n + n^2)), ``scale`` (terms x 3).
    """

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        check_streams(options, least_iters=1, why="the softmax is the first")
        for key in ("eps", "norm_eps"):
            if not options[key] > 0:
                raise ConfigError(f"block.residual.{key}", options[key], "must be > 0")

    def __init__(
        self,
        dims: BlockDims,
        n_updates: int,
        layer: int,
        *,
        n_streams: int = 4,
        sinkhorn_iters: int = 20,
        eps: float = 1e-6,
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__(dims, n_updates, layer, n_streams)
        self.sinkhorn_iters, self.eps, self.norm_eps = sinkhorn_iters, eps, norm_eps
        self.n_logits = 2 * n_streams + n_streams * n_streams
        self.projection = nn.Parameter(torch.empty(n_updates, self.n_logits, n_streams * dims.d_model))
        self.base = nn.Parameter(torch.empty(n_updates * self.n_logits))
        self.scale = nn.Parameter(torch.empty(n_updates * 3))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        n = self.n_streams
        read = 1 / n - self.eps  # sigmoid(base) + eps = 1 / n
        base = torch.zeros(self.n_updates, self.n_logits, dtype=torch.float64)
        base[:, :n] = math.log(read / (1 - read))
        with torch.no_grad():
            self.projection.zero_()
            self.base.copy_(rearrange(base, "u l -> (u l)"))
            self.scale.fill_(1.0)

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        return {"": tp.ReplicatedParameters(sequence_parallel)}

    def extra_flops(self, seq_len: int) -> int:
        """Per term, forward: the norm (3 n d), the read (2 n d), the mix (2 n^2 d), the write (2 n d) and the
        Sinkhorn iterations (4 n^2 each; the projection counts as parameters). x 3 for forward and backward."""
        n, d = self.n_streams, self.d_model
        forward = 2 * n * n * d + 7 * n * d + 4 * n * n * self.sinkhorn_iters
        return 3 * self.n_updates * forward

    def weights(self, streams: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Term ``i``'s read (b, t, n), mix (b, t, n, n) and write (b, t, n) from ``streams`` (b, t, n, d), computed
        in at least float32."""
        n = self.n_streams
        work = torch.promote_types(streams.dtype, torch.float32)
        flat = rearrange(streams.to(work), "b t n d -> b t (n d)")
        normed = F.rms_norm(flat, (flat.shape[-1],), eps=self.norm_eps)
        logits = normed @ self.value("projection")[i].to(work).T  # (b, t, 2 n + n^2)
        base = rearrange(self.value("base"), "(u l) -> u l", l=self.n_logits)[i].to(work)
        scale = rearrange(self.value("scale"), "(u s) -> u s", s=3)[i].to(work)
        sizes = [n, n, n * n]
        (read, write, mix), (b_read, b_write, b_mix) = logits.split(sizes, dim=-1), base.split(sizes)
        read = torch.sigmoid(scale[0] * read + b_read) + self.eps
        write = 2 * torch.sigmoid(scale[1] * write + b_write)
        mix = rearrange(scale[2] * mix + b_mix, "... (j k) -> ... j k", j=n)
        mix = mhc_sinkhorn(mix, self.sinkhorn_iters, self.eps)
        return read.to(streams.dtype), mix.to(streams.dtype), write.to(streams.dtype)


def stream_count(residual: Any) -> int:
    """The residual streams a block of this residual choice (a ``PartChoice``) keeps."""
    return hook(residual.part.cls, "stream_count")(**residual.options)


__all__ = [
    "Add", "Hyper", "ManifoldHyper", "Residual", "Scaled", "Streams", "mhc_sinkhorn", "sinkhorn",
    "stream_count",
]  # fmt: skip
