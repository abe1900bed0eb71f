"""Gated DeltaNet: linear attention whose state is corrected by the delta rule and decayed by a
data-dependent gate, after a short causal convolution on the queries, keys and values (the linear
mixer of the hybrids: Qwen3-Next, Qwen3.5).

Two forms of the same function: the chunked form (``backend: sdpa``: the delta rule's WY form inside
chunks of ``chunk`` tokens, a state carried across them) and the recurrent form (``backend: math``,
the reference, and every decoding step of one token).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from zoo.core import tp
from zoo.core.dims import BlockDims
from zoo.core.errors import ConfigError
from zoo.core.interface import hook
from zoo.core.registry import ATTENTIONS
from zoo.core.reshape import rearrange, repeat
from zoo.core.tp import Plan, gather_sequence, heads_norm, local, prefixed, require_whole_heads, row_output
from zoo.parts.canon import KERNEL, Canon
from zoo.parts.convolution import add_kernel, short_convolution
from zoo.parts.documents import Documents, chunk_cuts
from zoo.parts.linear_attention import RecurrentState, forget, keep
from zoo.parts.norms import build_norm
from zoo.parts.positions import Position
from zoo.parts.state import LayerState, nbytes, query_slots

#: The epsilon of the queries' and keys' L2 norm (fla's l2norm).
L2_EPS = 1e-6

#: The default epsilon of the per-head output RMSNorm (fla's GatedDeltaNet norm_eps; ``block.attn.norm_eps``).
OUTPUT_NORM_EPS = 1e-5

#: Initial per-head rates A (Mamba-2's range, spread over the heads) and step sizes dt (fla's range).
A_RANGE = (1.0, 16.0)
DT_RANGE = (1e-3, 1e-1)

#: Tokens per sub-chunk of a decay per key channel's products (:func:`channel_products`; fla's KDA kernels' 16);
#: the chunk's greatest common divisor with it where it does not divide the chunk.
SUB = 16


class DeltaState(RecurrentState):
    """Gated DeltaNet's decoding state: the (d_key, d_head) matrix per head of :class:`RecurrentState`
    and ``conv`` (batch, conv - 1, channels), the short convolution's last inputs, so a call continues
    the convolution where the previous one stopped. Constant size, whatever the number of tokens."""

    def __init__(self, max_len: int | None = None) -> None:
        super().__init__(max_len)
        self.conv: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return nbytes(self.matrix, self.conv)

    def hold(self, matrix: torch.Tensor, conv: torch.Tensor, time: int) -> None:
        """Hold the matrix and the convolution's last inputs after ``time`` more tokens."""
        self.conv = keep(self.conv, conv, self.static)
        self.update(matrix, time)

    def reset(self) -> None:
        super().reset()
        self.conv = forget(self.conv, self.static)


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(|x|^2 + eps) over the last axis (fla's l2norm)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


def delta_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, log_decay: torch.Tensor,
                    start: torch.Tensor | None,
                    fresh: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The gated delta rule one token at a time, the state H (b, h, d_key, d_head) (S = H^T):
    H_i = g_i H_{i-1} + k_i u_i^T, u_i = beta_i (v_i - g_i H_{i-1}^T k_i), y_i = H_i^T q_i;
    that is S_i = g_i S_{i-1} (I - beta_i k_i k_i^T) + beta_i v_i k_i^T.

    q, k: (b, h, t, d_key); v: (b, h, t, d_head); beta: (b, h, t); log_decay (log g <= 0): (b, h, t), or
    (b, h, t, d_key) for a decay per key channel (KDA: H_i = diag(g_i) H_{i-1} + k_i u_i^T, u_i = beta_i (v_i -
    (diag(g_i) H_{i-1})^T k_i)); start: H_0 or None (zeros); ``fresh`` (b, t) bool
    (zoo.parts.documents.Documents.fresh): g_i read as 0 at a document's first token (the state reset).
    Returns y (b, h, t, d_head) and the last state.
    """
    state = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1]) if start is None else start
    log_decay = per_channel(log_decay)
    ys = []
    for i in range(q.shape[2]):
        k_i = k[:, :, i]
        state = torch.exp(log_decay[:, :, i, :, None]) * state  # (b, h, 1 or d_key, 1): each key row's decay
        if fresh is not None:
            state = state * ~fresh[:, i, None, None, None]
        error = v[:, :, i] - torch.einsum("bhkd,bhk->bhd", state, k_i)  # what the state predicts for k_i, missed
        state = state + torch.einsum("bhk,bhd->bhkd", k_i, beta[:, :, i, None] * error)
        ys.append(torch.einsum("bhk,bhkd->bhd", q[:, :, i], state))
    return torch.stack(ys, dim=2), state


def per_channel(log_decay: torch.Tensor) -> torch.Tensor:
    """log g (b, h, t) -> (b, h, t, 1): one decay for every key channel; (b, h, t, d_key) (KDA) as it is."""
    return log_decay[..., None] if log_decay.ndim == 3 else log_decay


def channel_products(x: torch.Tensor, y: torch.Tensor, total: torch.Tensor, strict: bool) -> torch.Tensor:
    """Each chunk's decayed products M_ij = sum_d x_id y_jd e^{G_id - G_jd} for j <= i (j < i when ``strict``),
    0 above: x, y (b, h, n, c, d), ``total`` G (b, h, n, c, d) the decay's cumulative log in each chunk -> (b, h, n,
    c, c). Never an exponent above 0: within a sub-chunk of :data:`SUB` tokens the (sub, sub, d) weights
    themselves; across sub-chunks through the last token r of key j's sub-chunk, e^{G_i - G_r} x_i . e^{G_r - G_j}
    y_j (fla's KDA kernels' split), a product of matrices."""
    chunk = x.shape[-2]
    sub = math.gcd(chunk, SUB)
    xs, ys, gs = (rearrange(t, "b h n (s c) d -> b h n s c d", c=sub) for t in (x, y, total))
    below = torch.ones(sub, sub, dtype=torch.bool, device=x.device).tril(-1 if strict else 0)
    diff = rearrange(gs, "b h n s i d -> b h n s i 1 d") - rearrange(gs, "b h n s j d -> b h n s 1 j d")
    weights = torch.exp(diff.masked_fill(~below[..., None], float("-inf")))  # -inf first: exp never overflows
    near = torch.einsum("bhnsid,bhnsjd,bhnsijd->bhnsij", xs, ys, weights)  # (b, h, n, s, sub, sub)
    parts = chunk // sub
    eye = torch.eye(parts, dtype=x.dtype, device=x.device)
    near = rearrange(torch.einsum("bhnpij,pq->bhnpiqj", near, eye), "b h n p i q j -> b h n (p i) (q j)")
    last = gs[..., -1, :]  # (b, h, n, s, d): G at each sub-chunk's last token
    after = torch.arange(chunk, device=x.device) // sub > torch.arange(parts, device=x.device)[:, None]  # (s, c)
    lift = rearrange(total, "b h n c d -> b h n 1 c d") - rearrange(last, "b h n s d -> b h n s 1 d")
    x_far = rearrange(x, "b h n c d -> b h n 1 c d") * torch.exp(lift.masked_fill(~after[..., None], float("-inf")))
    y_far = ys * torch.exp(rearrange(last, "b h n s d -> b h n s 1 d") - gs)  # (b, h, n, s, sub, d)
    far = rearrange(x_far @ y_far.transpose(-1, -2), "b h n s i j -> b h n i (s j)")  # key j in sub-chunk s
    return near + far


def delta_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, log_decay: torch.Tensor,
                  start: torch.Tensor | None, chunk: int,
                  segments: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The chunked form, equal to :func:`delta_recurrent` (same arguments, the decay per head or per key channel;
    ``chunk`` tokens per chunk; ``segments`` (zoo.parts.documents.Documents.segments): every decay product across
    a document boundary cut to 0, as :func:`delta_recurrent`'s ``fresh``, zoo.parts.documents.chunk_cuts).

    Inside a chunk entered with state H_0, with G_i the decay's cumulative log up to token i:
    H_i = e^{G_i} H_0 + sum_{j<=i} e^{G_i - G_j} k_j u_j^T, so the corrections U solve the unit
    lower-triangular system (I + A) U = beta V - (beta e^G K) H_0, A_ij = beta_i e^{G_i - G_j} k_i.k_j
    (j < i): U = U_0 - W H_0 with U_0 = T beta V and W = T beta e^G K, T = (I + A)^-1 (the WY form).
    Then Y = (e^G Q) H_0 + (Q K^T o D) U, D_ij = e^{G_i - G_j} (j <= i), and the state leaving the chunk
    is e^{G_c} H_0 + (e^{G_c - G} K)^T U. A decay per key channel (KDA) puts e^G inside the products over
    d_key (:func:`channel_products`) and multiplies H_0's rows. Everything but the last three products runs
    for every chunk at once; the t / chunk state steps run in turn.
    """
    batch, heads, time, d_key = q.shape
    chunk = min(chunk, time)
    channels = log_decay.ndim == 4
    log_decay = per_channel(log_decay)
    pad = -time % chunk
    if pad:  # zero keys, values and rates and no decay: padding changes nothing
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        beta, log_decay = F.pad(beta, (0, pad)), F.pad(log_decay, (0, 0, 0, pad))
    q, k, v = (rearrange(t, "b h (n c) d -> b h n c d", c=chunk) for t in (q, k, v))
    beta = rearrange(beta, "b h (n c) -> b h n c 1", c=chunk)
    total = rearrange(log_decay, "b h (n c) e -> b h n c e", c=chunk).cumsum(-2)  # G within each chunk; e: 1 or d_key
    if channels:
        a, scores = channel_products(k, k, total, strict=True), channel_products(q, k, total, strict=False)
    else:
        diff = rearrange(total, "b h n i 1 -> b h n i 1") - rearrange(total, "b h n j 1 -> b h n 1 j")  # G_i - G_j
        ones = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device)
        within = torch.exp(diff.masked_fill(~ones.tril(), float("-inf")))  # D: -inf first, exp never overflows
        a, scores = (k @ k.transpose(-1, -2)) * within, (q @ k.transpose(-1, -2)) * within  # (b, h, n, c, c)
    entry, to_end, through = torch.exp(total), torch.exp(total[..., -1:, :] - total), torch.exp(total[..., -1, :])
    if segments is not None:  # documents: no product of decays across a boundary
        cuts = chunk_cuts(segments, chunk)
        a, scores, through = a * cuts.within, scores * cuts.within, through * cuts.through[..., None]
        entry, to_end = entry * cuts.entered[..., None], to_end * cuts.kept[..., None]
    a = beta * a  # A below the diagonal (its diagonal read as 1 below)
    rhs = torch.cat([beta * v, beta * entry * k], dim=-1)
    solved = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)  # I + A: the diagonal read as 1
    u0, w = solved.split([v.shape[-1], d_key], dim=-1)
    q_in = q * entry  # how much of H_0 each query reads
    k_out = k * to_end  # how much of each key the chunk's end keeps
    # through (b, h, n, 1 or d_key): how much of each row of H_0 the chunk's end keeps
    state = q.new_zeros(batch, heads, d_key, v.shape[-1]) if start is None else start
    ys = []
    # t / chunk steps; unbind, not indexing: its backward is one stack
    steps = zip(*(t.unbind(2) for t in (u0, w, scores, q_in, k_out, through)), strict=True)
    for u0_n, w_n, scores_n, q_n, k_n, kept in steps:
        u = u0_n - w_n @ state
        ys.append(q_n @ state + scores_n @ u)
        state = kept[..., None] * state + k_n.transpose(-1, -2) @ u
    y = rearrange(torch.stack(ys, dim=2), "b h n c d -> b h (n c) d")
    return y[:, :, :time], state


#: How a scanning mixer with a short convolution keeps documents apart (its ``doc_reset``).
SCAN_RESET = (
    "the state reset at each document's first token (in the chunked form every product of decays across a boundary "
    "cut to 0) and the short convolution's taps kept inside the document"
)


def check_scan(name: str, dims: BlockDims, options: dict[str, Any]) -> None:
    """The options a scanning mixer with a short convolution shares (Gated DeltaNet, KDA, Mamba-2): ``head_dim``,
    ``conv``, ``chunk``, ``norm_eps``; and a causal block (the scan reads tokens in order)."""
    if options["head_dim"] is not None and options["head_dim"] < 1:
        raise ConfigError(
            "block.attn.head_dim", options["head_dim"], "must be a positive integer, or null for d_model / n_heads"
        )
    if options["conv"] < 1:
        raise ConfigError(
            "block.attn.conv", options["conv"], "must be a positive integer (taps of the short convolution)"
        )
    if options["chunk"] < 1:
        raise ConfigError("block.attn.chunk", options["chunk"], "must be a positive integer")
    if not options["norm_eps"] > 0:
        raise ConfigError("block.attn.norm_eps", options["norm_eps"], "must be > 0 (the output norm's epsilon)")
    if not dims.causal:
        raise ConfigError(
            "block.attn.name",
            name,
            "is causal only (the scan reads tokens in order); an encoder block needs a mixer that sees both directions "
            "(mha, linear, ...)",
        )


def initial_rates(n_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(log A, softplus^-1(dt)) per head, A spread evenly over :data:`A_RANGE` and dt geometrically over
    :data:`DT_RANGE` (fla draws both at random in these ranges): head 0 keeps 1 - 0.001 of its state per
    token at a zero input, the last head exp(-1.6) = 0.2, a spread of memories like RetNet's decays."""
    spread = torch.linspace(0, 1, n_heads, dtype=torch.float64) if n_heads > 1 else torch.zeros(1, dtype=torch.float64)
    rate = A_RANGE[0] + (A_RANGE[1] - A_RANGE[0]) * spread
    dt = DT_RANGE[0] * (DT_RANGE[1] / DT_RANGE[0]) ** spread
    return torch.log(rate).float(), (dt + torch.log(-torch.expm1(-dt))).float()  # softplus^-1(dt)


@ATTENTIONS.register(
    "gated_deltanet",
    summary="Gated DeltaNet: a (d_key, d_head) state per head, decayed by a data-dependent gate and "
    "corrected by the delta rule, after a short causal convolution on q, k, v; chunked for training, "
    "recurrent for decoding.",
    formula="S_i = g_i S_{i-1} (I - beta_i k_i k_i^T) + beta_i v_i k_i^T, y_i = rmsnorm(S_i q_i) * silu(W_g x_i); "
    "q, k, v = silu(conv(W_qkv x)), q and k L2-normalized per head, beta = sigmoid(W_b x) (2 sigmoid(W_b x) under "
    "allow_neg_eigval: beta in [0, 2]), g = exp(-exp(A_log) softplus(W_a x + dt)); value head h reads key head "
    "h // (n_heads / n_key_heads); rmsnorm's epsilon norm_eps; mixing cost per token 6 n_heads (chunk (3 d_key + "
    "2 d_head) + 3 d_key d_head) training FLOPs; the values n_heads x head_dim wide (d_model by default)",
    reference="Yang et al. 2024, Gated Delta Networks, arXiv:2412.06464; Yang et al. 2024, Parallelizing "
    "Linear Transformers with the Delta Rule over Sequence Length, arXiv:2406.06484; fla-core's "
    "GatedDeltaNet layer; Grazzi et al. 2024, Unlocking State-Tracking in Linear RNNs Through Negative "
    "Eigenvalues, arXiv:2411.12537 (allow_neg_eigval); Qwen3-Next (n_key_heads < n_heads)",
    variants={"grouped": {"n_key_heads": 2}, "negeig": {"allow_neg_eigval": True}, "wide": {"head_dim": 6}},
)
class GatedDeltaNet(nn.Module):
    """Gated DeltaNet: linear attention whose (d_key, d_head) state per head forgets by a data-dependent
    gate g_i and overwrites the value stored under the key k_i (the delta rule: a step of size beta_i
    toward v_i), rather than adding to it.

    Each value head is ``head_dim`` features wide (d_model / n_heads by default; OLMo-Hybrid's and Qwen3-Next's
    value heads are wider), each key head ``d_key`` (default: the value heads' width).

    Per token: q, k, v from one projection ``qkv``, its rows grouped by key head: for each of the ``n_key_heads``
    (default n_heads), its query and key (d_key rows each), then the values of the n_heads / n_key_heads value heads
    that read it (d_head rows each; Qwen3-Next's layout, 16 key heads for 32 value heads); value head h reads key
    head h // (n_heads / n_key_heads). Then a short causal depthwise convolution of ``conv`` taps over them (its
    decoding state keeps the last conv - 1 inputs), SiLU; q and k L2-normalized per head, q scaled by d_key^-1/2;
    the rate beta = sigmoid(``beta`` x) and the decay g = exp(-exp(``a_log``) softplus(``decay`` x + ``dt``)) per
    value head. ``allow_neg_eigval``: beta = 2 sigmoid(``beta`` x), in [0, 2], so I - beta k k^T may have a negative
    eigenvalue (OLMo-Hybrid's option). Each head's output is RMS-normalized (gain ``norm``, epsilon ``norm_eps``:
    fla's 1e-5, Qwen3-Next's rms_norm_eps 1e-6) and gated by silu(``gate`` x), then ``out`` mixes the heads, as in
    fla's GatedDeltaNet layer.

    Initialization: the convolution's kernel is stored as its difference from the identity (a kernel
    that passes the present token through), so the model's std-0.02 draw starts it near the identity;
    ``a_log`` and ``dt`` (fla's dt_bias; not named ``*bias``, which the model's init zeroes) spread the
    heads' memories from about a thousand tokens to a few (:func:`initial_rates`).

    ``backend``: ``sdpa`` computes the chunked form (chunks of ``chunk`` tokens), ``math`` the recurrent
    one (the reference). The ``pos`` axis rotates q and k (after their norm); a score bias (ALiBi) has no
    score matrix to act on, so it is refused. Causal only: the delta rule reads tokens in order, so an
    encoder (non-causal) block is refused, and it declares no cross-attention.
    """

    #: The name it is registered under, for its refusals.
    part_name: ClassVar[str] = "gated_deltanet"
    #: Canon site b: a canon layer on q, k and v after the short convolution and SiLU (the reference's place).
    canon_sites: ClassVar[frozenset[str]] = frozenset({"b"})
    doc_reset: ClassVar[str | None] = SCAN_RESET
    conflicts: ClassVar[dict[str, str]] = {
        "score bias": "Gated DeltaNet never forms the score matrix a score bias is added to; use pos=rotary "
        "or pos=none (its convolution and decay carry order)"
    }

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        if options["d_key"] is not None and options["d_key"] < 1:
            raise ConfigError("block.attn.d_key", options["d_key"], "must be a positive integer, or null for d_head")
        key_heads = options["n_key_heads"]
        if key_heads is not None and (key_heads < 1 or dims.n_heads % key_heads):
            raise ConfigError(
                "block.attn.n_key_heads", key_heads, f"must divide block.n_heads={dims.n_heads}, or null for n_heads"
            )
        check_scan(cls.part_name, dims, options)

    @classmethod
    def check_tp(cls, dims: BlockDims, tp: int, **options: Any) -> None:
        require_whole_heads(dims.n_heads, tp)
        if options.get("n_key_heads") is not None and options["n_key_heads"] % tp:
            raise ConfigError(
                "parallel.tp", tp, f"must divide block.attn.n_key_heads={options['n_key_heads']}: each rank holds "
                "whole key heads with the value heads that read them"
            )

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        """Each rank whole key heads with the value heads that read them: column-wise ``qkv`` (key heads in turn),
        ``beta``, ``decay`` and ``gate`` (their rows in value-head order), row-wise ``out``; the convolution's
        kernel (one filter per ``qkv`` row, in the same order), ``a_log`` and ``dt`` split on their first axis
        alike; the output norm on each rank's heads; the position part's own plan. Under sequence parallelism the
        input is gathered whole first (the convolution and the state run along time) and the output reduce-scattered
        back."""
        plan: Plan = {name: tp.ColwiseParallel() for name in ("qkv", "beta", "decay", "gate")}
        plan["out"] = row_output(sequence_parallel)
        plan["norm"] = heads_norm()
        plan.update(prefixed("position", self.position.tp_plan(sequence_parallel)))  # type: ignore[attr-defined]
        whole = [gather_sequence()] if sequence_parallel else []
        plan[""] = tp.Chain(*whole, tp.HeadParameters("conv", "a_log", "dt"))
        return plan

    def __init__(
        self,
        dims: BlockDims,
        position: Position,
        *,
        d_key: int | None = None,
        n_key_heads: int | None = None,
        head_dim: int | None = None,
        conv: int = 4,
        chunk: int = 64,
        allow_neg_eigval: bool = False,
        norm_eps: float = OUTPUT_NORM_EPS,
        backend: Literal["sdpa", "math"] = "sdpa",
    ) -> None:
        super().__init__()
        if head_dim is not None:  # the assembly has set it already; a direct build gets it here
            dims = replace(dims, head_dim=head_dim)
        self.n_heads, self.d_head = dims.n_heads, dims.d_head
        self.d_key = self.d_head if d_key is None else d_key
        self.n_key_heads = self.n_heads if n_key_heads is None else n_key_heads
        #: Value heads per key head.
        self.group = self.n_heads // self.n_key_heads
        self.beta_max = 2.0 if allow_neg_eigval else 1.0
        self.causal, self.backend, self.chunk = dims.causal, backend, chunk
        rotated = hook(position, "rotated")  # rotary's rotated features per head
        if rotated is not None and rotated > self.d_key:
            raise ConfigError(
                "block.attn.d_key", d_key, f"must be at least the {rotated} features per head the position rotates"
            )
        self.position = position
        #: Each key head's rows of ``qkv``: its query, its key, its value heads' values.
        self.group_width = 2 * self.d_key + self.group * self.d_head
        self.channels = self.n_key_heads * self.group_width
        self.qkv = nn.Linear(dims.d_model, self.channels, bias=dims.bias)
        self.conv: nn.Parameter  # (channels, 1, conv): the kernel less the identity
        self.present: torch.Tensor  # (conv,): the identity kernel, one at the present token
        add_kernel(self, self.channels, conv)
        self.beta = nn.Linear(dims.d_model, self.n_heads, bias=dims.bias)
        self.build_decay(dims)
        self.norm = build_norm("rmsnorm", dims, width=self.d_head, shared={"eps": norm_eps})
        self.gate = self.build_gate(dims)
        self.out = nn.Linear(self.n_heads * self.d_head, dims.d_model, bias=dims.bias)
        self.canon = Canon(self.channels, "b") if "b" in dims.canon_sites else None

    def build_decay(self, dims: BlockDims) -> None:
        """The decay's projection ``decay`` (one logit per value head; ``dt`` is its bias) and rates."""
        self.decay = nn.Linear(dims.d_model, self.n_heads, bias=False)
        a_log, dt = initial_rates(self.n_heads)
        self.a_log, self.dt = nn.Parameter(a_log), nn.Parameter(dt)

    def build_gate(self, dims: BlockDims) -> nn.Module:
        """The output gate's projection: d_model -> n_heads x d_head."""
        return nn.Linear(dims.d_model, self.n_heads * self.d_head, bias=dims.bias)

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        """x: (b, t, d_model) -> silu(``gate`` x) (b, h, t, d_head), this rank's heads."""
        return F.silu(rearrange(self.gate(x), "b t (h d) -> b h t d", d=self.d_head))

    def matrix_blocks(self) -> dict[str, dict[str, torch.Tensor]]:
        """``qkv``'s rows as the query, key and value matrices (each key head's d_key, d_key and
        n_heads / n_key_heads x d_head rows in turn); ``beta``, ``decay``, ``gate`` and ``out`` are one matrix
        each; the convolution's kernel (channels, 1, conv) is none (one short filter per channel)."""
        rows = rearrange(torch.arange(self.channels), "(g n) -> g n", g=self.n_key_heads)
        sizes = [self.d_key, self.d_key, self.group * self.d_head]
        q, k, v = (rearrange(part, "g n -> (g n)") for part in rows.split(sizes, 1))
        return {"qkv.weight": {"q": q, "k": k, "v": v}}

    def state_size(self, length: int) -> int:
        """Numbers one sample's decoding state holds after any number of tokens: a (d_key, d_head) matrix
        per head and the convolution's last conv - 1 inputs."""
        return self.n_heads * self.d_key * self.d_head + (self.conv.shape[-1] - 1) * self.channels

    def mixing_flops(self, seq_len: int) -> int:
        """Training FLOPs per token of the chunked form's products (its matrices count as parameters):
        per head and token, chunk x d_key multiply-adds for each of K K^T and Q K^T, chunk x d_head for
        (Q K^T o D) U, chunk x (d_key + d_head) for the triangular solve, and d_key x d_head for each of
        W H_0, Q H_0 and the state update, with ``chunk`` the sequence when shorter; causal products are
        not halved (as for softmax attention). x 2 FLOPs, x 3 for forward and backward."""
        chunk = min(self.chunk, seq_len)
        per_head = chunk * (3 * self.d_key + 2 * self.d_head) + 3 * self.d_key * self.d_head
        return 6 * self.n_heads * per_head

    def attention_logits(self, x: torch.Tensor) -> torch.Tensor | None:
        """None: no softmax, so no attention logits (probes skip this mixer by name)."""
        return None

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """x: (b, t, d_model) -> log g (b, h, t) = -exp(a_log) softplus(decay x + dt), <= 0, in at least float32.

        The projection is put in (b, h, t) order, contiguous, before the softplus: a softplus whose gradient
        arrives transposed returns it transposed in eager mode but contiguous in torch.compile's traced
        strides, and the compiled backward's view of it then fails."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        logits = rearrange(self.decay(x).to(dtype), "b t h -> b h t").contiguous()
        step = F.softplus(logits + rearrange(local(self.dt).to(dtype), "h -> h 1"))
        return -rearrange(torch.exp(local(self.a_log).to(dtype)), "h -> h 1") * step

    def forward(self, x: torch.Tensor, *, key_mask: torch.Tensor | None = None, cache: LayerState | None = None,
                positions: torch.Tensor | None = None, documents: Documents | None = None) -> torch.Tensor:  # fmt: skip
        """x: (b, t, d_model) -> (b, t, d_model).

        key_mask: (b, t_k) bool, True at real tokens (t_k counts earlier tokens too): a padding token
            enters the convolution as zeros, adds nothing to the state and does not decay it.
            cache: this layer's state; its :class:`DeltaState` carries the matrix and the convolution's
            last inputs across calls. positions: (b, t) per-sample position ids for the ``pos`` axis
            (left-padded batches); default: token index. documents: every token's document
            (zoo.parts.documents): the convolution and the state start anew at each one.
        """
        time = x.shape[1]
        state = None if cache is None else cache.mixer_state(DeltaState)
        slots = query_slots(state, time, x.device)  # (t,)
        real = None if key_mask is None else key_mask.index_select(1, slots).bool()  # (b, t): the new tokens
        mixed = self.qkv(x)
        if real is not None:
            mixed = mixed * real[..., None]
        width = self.conv.shape[-1]
        taps = None if documents is None else documents.taps(slots, width)
        mixed, tail = short_convolution(mixed, local(self.conv) + self.present, None if state is None else state.conv,
                                        taps)  # fmt: skip
        mixed = F.silu(mixed)
        if self.canon is not None:
            mixed = self.canon(mixed, real, cache, None if documents is None else documents.taps(slots, KERNEL))
        work = torch.promote_types(x.dtype, torch.float32)  # the recurrence in at least float32
        q, k, v = rearrange(mixed.to(work), "b t (g n) -> b g t n", n=self.group_width).split(
            [self.d_key, self.d_key, self.group * self.d_head], dim=-1
        )
        q, k = self.position.rotate(l2_normalize(q), l2_normalize(k), slots if positions is None else positions)
        if self.group > 1:  # value head h reads key head h // group
            q, k = (repeat(t, "b g t n -> b (g r) t n", r=self.group) for t in (q, k))
            v = rearrange(v, "b g t (r d) -> b (g r) t d", r=self.group)
        q = q / math.sqrt(self.d_key)
        beta = rearrange(torch.sigmoid(self.beta(x).to(work)), "b t h -> b h t")
        if self.beta_max != 1.0:  # allow_neg_eigval: beta in [0, 2]
            beta = self.beta_max * beta
        log_decay = self.log_decay(x)
        if real is not None:  # padding: no key, no decay
            k = k * rearrange(real, "b t -> b 1 t 1")
            kept = rearrange(real, "b t -> b 1 t")
            log_decay = log_decay * (kept if log_decay.ndim == 3 else kept[..., None])  # KDA's: (b, h, t, d_key)
        start = None if state is None else state.matrix
        if self.backend == "math" or (time == 1 and start is not None):
            fresh = None if documents is None else documents.fresh(slots)
            y, end = delta_recurrent(q, k, v, beta, log_decay, start, fresh)
        else:
            segments = None if documents is None else documents.segments(slots)
            y, end = delta_chunked(q, k, v, beta, log_decay, start, self.chunk, segments)
        if state is not None:
            state.hold(end, tail, time)
        y = self.norm(y.to(x.dtype)) * self.output_gate(x)
        return self.out(rearrange(y, "b h t d -> b t (h d)"))
