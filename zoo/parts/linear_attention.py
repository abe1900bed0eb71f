"""Linear attention with an optional per-head decay (RetNet) or data-dependent gate (GLA, Mamba-2's
scalar decay): a sequence mixer whose decoding state is one constant-size matrix per head.

Three forms of the same function: the full quadratic form (``backend: math``, the reference), the
chunked form (``backend: sdpa``: quadratic inside chunks of ``chunk`` tokens, a state carried across
them, linear in the sequence length) and the recurrent form (one token at a time, for decoding).
"""

from __future__ import annotations

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
from zoo.core.tp import Plan, gather_sequence, prefixed, require_whole_heads, row_output
from zoo.parts.canon import KERNEL, Canon
from zoo.parts.documents import Documents, chunk_cuts
from zoo.parts.kernels import Backend
from zoo.parts.positions import Position
from zoo.parts.state import LayerState, MixerState, forget, keep, nbytes, query_slots

FeatureMap = Literal["elu", "relu", "identity"]
Decay = Literal["none", "fixed", "gated"]

#: The per-head output norm's epsilon.
NORM_EPS = 1e-6

#: GLA's temperature: log gates are divided by it, so a fresh gate forgets slowly (Yang et al. 2023).
GATE_TEMPERATURE = 16.0


class RecurrentState(MixerState):
    """A linear mixer's decoding state: one (d_key, d_head) matrix per head and sample,
    ``matrix`` (batch, n_heads, d_key, d_head), whatever the number of tokens read. It keeps no
    per-token history, so it cannot rewind (``truncate`` only to the present)."""

    supports_static = True

    def __init__(self, max_len: int | None = None) -> None:
        super().__init__(max_len)
        self.matrix: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return nbytes(self.matrix)

    def update(self, matrix: torch.Tensor, time: int) -> None:
        """Hold ``matrix`` as the state after ``time`` more tokens (static: copied into the held one)."""
        self.matrix = keep(self.matrix, matrix, self.static)
        self.advance(time)

    def reset(self) -> None:
        super().reset()
        self.matrix = forget(self.matrix, self.static)

    def truncate(self, length: int) -> None:
        if length != self.length:
            raise ConfigError(
                "length",
                length,
                f"must be {self.length}: a recurrent state keeps no per-token history, so it cannot rewind",
            )


def feature(x: torch.Tensor, kind: FeatureMap) -> torch.Tensor:
    """The feature map phi applied to queries and keys."""
    if kind == "elu":
        return F.elu(x) + 1
    if kind == "relu":
        return F.relu(x)
    return x


def decay_weights(log_decay: torch.Tensor, causal: bool) -> torch.Tensor:
    """log_decay a (b, h, t) <= 0 -> D (b, h, t, t): D[i, j] = prod_{j < r <= i} exp(a_r) for j <= i, else 0;
    non-causal: the same product over the tokens between i and j, in either direction."""
    total = log_decay.cumsum(-1)  # L_i = a_1 + ... + a_i
    diff = rearrange(total, "b h i -> b h i 1") - rearrange(total, "b h j -> b h 1 j")  # L_i - L_j
    if not causal:
        return torch.exp(-diff.abs())
    allowed = torch.ones(diff.shape[-2:], dtype=torch.bool, device=diff.device).tril()
    return torch.exp(diff.masked_fill(~allowed, float("-inf")))  # -inf first: exp never overflows


def quadratic(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, start: torch.Tensor | None,
    causal: bool, segments: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The full form: y_i = sum_j D[i, j] (q_i . k_j) v_j + exp(L_i) q_i S_0, and the final state.

    q, k: (b, h, t, d_key); v: (b, h, t, d_head); log_decay (b, h, t); start: S_0 (b, h, d_key, d_head) or None.
    ``segments`` (b, 1 + t) (zoo.parts.documents.Documents.segments): every product of decays that spans a
    document boundary is cut to 0 (the state reset at each document's first token).
    """
    cut = None if segments is None else chunk_cuts(segments, q.shape[2])  # one chunk: the whole call
    weights = decay_weights(log_decay, causal).to(q.dtype) * torch.einsum("bhik,bhjk->bhij", q, k)
    y = torch.einsum("bhij,bhjd->bhid", weights if cut is None else weights * cut.within[:, :, 0], v)
    total = log_decay.cumsum(-1)
    to_end = torch.exp(total[..., -1:] - total).to(q.dtype)  # (b, h, t)
    to_end = to_end if cut is None else to_end * cut.kept[:, :, 0]
    end = torch.einsum("bhjk,bhjd->bhkd", k * to_end[..., None], v)
    if start is not None:
        entry, through = torch.exp(total).to(q.dtype), torch.exp(total[..., -1, None, None]).to(q.dtype)
        if cut is not None:
            entry, through = entry * cut.entered[:, :, 0], through * cut.through[:, :, 0, None, None]
        y = y + entry[..., None] * torch.einsum("bhik,bhkd->bhid", q, start)
        end = end + through * start
    return y, end


def chunked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, start: torch.Tensor | None,
    chunk: int, segments: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The chunked (causal) form, equal to :func:`quadratic`: within each chunk of ``chunk`` tokens the
    quadratic form, across chunks a (d_key, d_head) state per head, so the cost is linear in t. ``segments``:
    as for :func:`quadratic`, the cuts made per chunk (zoo.parts.documents.chunk_cuts)."""
    batch, heads, time, d_key = q.shape
    pad = -time % chunk
    if pad:  # zero keys and values and no decay: padding changes nothing
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        log_decay = F.pad(log_decay, (0, pad))
    q, k, v = (rearrange(t, "b h (n c) d -> b h n c d", c=chunk) for t in (q, k, v))
    a = rearrange(log_decay, "b h (n c) -> b h n c", c=chunk)
    total = a.cumsum(-1)  # (b, h, n, c): L within each chunk
    diff = rearrange(total, "b h n i -> b h n i 1") - rearrange(total, "b h n j -> b h n 1 j")
    allowed = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    within = torch.exp(diff.masked_fill(~allowed, float("-inf"))).to(q.dtype)
    # Each chunk's own contribution to the state at its end, and how much it decays what came before.
    to_end = torch.exp(total[..., -1:] - total).to(q.dtype)  # (b, h, n, c)
    through = torch.exp(total[..., -1]).to(q.dtype)  # (b, h, n)
    entry = torch.exp(total).to(q.dtype)  # (b, h, n, c): how much of the entering state each query reads
    if segments is not None:  # documents: no product of decays across a boundary
        within, to_end, through, entry = chunk_cuts(segments, chunk).cut(within, to_end, through, entry)
    y = ((q @ k.transpose(-1, -2)) * within) @ v  # (b, h, n, c, d_head): within each chunk
    own = (k * to_end[..., None]).transpose(-1, -2) @ v  # (b, h, n, d_key, d_head)
    state = q.new_zeros(batch, heads, d_key, v.shape[-1]) if start is None else start
    starts = []
    # t / chunk steps, each a (d_key, d_head) update; unbind, not indexing: its backward is one stack
    for kept, added in zip(through.unbind(2), own.unbind(2), strict=True):
        starts.append(state)
        state = kept[..., None, None] * state + added
    before = torch.stack(starts, dim=2)  # (b, h, n, d_key, d_head): the state entering each chunk
    y = y + (q * entry[..., None]) @ before  # what entered each chunk, decayed
    return rearrange(y, "b h n c d -> b h (n c) d")[:, :, :time], state


def recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, start: torch.Tensor | None,
    fresh: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The recurrent form, one token at a time: S_i = exp(a_i) S_{i-1} + k_i v_i^T, y_i = q_i S_i; ``fresh``
    (b, t) bool (zoo.parts.documents.Documents.fresh): S_{i-1} is forgotten (times 0) at a document's first token."""
    state = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1]) if start is None else start
    ys = []
    for i in range(q.shape[2]):
        kept = torch.exp(log_decay[:, :, i, None, None]).to(q.dtype)
        if fresh is not None:
            kept = kept * ~fresh[:, i, None, None, None]
        state = kept * state + torch.einsum("bhk,bhd->bhkd", k[:, :, i], v[:, :, i])
        ys.append(torch.einsum("bhk,bhkd->bhd", q[:, :, i], state))
    return torch.stack(ys, dim=2), state


def retnet_decay(heads: int | torch.Tensor) -> torch.Tensor:
    """RetNet's fixed per-head log decay, log(1 - 2^(-5 - h)) (float64) for each head index h in
    ``heads`` (an int n: heads 0..n-1)."""
    h = torch.arange(heads) if isinstance(heads, int) else heads
    return torch.log1p(-(2.0 ** (-5.0 - h.double())))


@ATTENTIONS.register(
    "linear",
    summary="Linear attention: phi(q) S per head, S a (d_key, d_head) state updated per token, with an "
    "optional decay or gate.",
    formula="S_i = g_i S_{i-1} + phi(k_i) v_i^T, y_i = norm_h(phi(q_i) S_i); g = 1, RetNet's fixed "
    "per-head decay, or a gate sigmoid(w_h x_i)^(1/16)",
    reference="Katharopoulos et al. 2020, Transformers are RNNs, arXiv:2006.16236; Sun et al. 2023, RetNet, "
    "arXiv:2307.08621; Yang et al. 2023, Gated Linear Attention, arXiv:2312.06635",
    variants={"retnet": {"decay": "fixed"}, "gated": {"decay": "gated"}},
)
class LinearAttention(nn.Module):
    """Linear attention: softmax(q k^T) v replaced by phi(q) phi(k)^T v, computed as a running
    (d_key, d_head) state per head, so memory and time are linear in the sequence length and
    decoding keeps a constant-size state (:class:`RecurrentState`).

    ``feature_map`` phi: ``elu`` (elu + 1, Katharopoulos et al.), ``relu`` or ``identity`` (RetNet, GLA).
    ``decay``: ``none`` (a plain running sum), ``fixed`` (RetNet: head h keeps 1 - 2^(-5-h) of its
    state per token) or ``gated`` (a data-dependent per-head gate g_i = sigmoid(w_h . x_i + b_h)^(1/16),
    GLA's temperature; a scalar per head, as in Mamba-2). ``d_key``: query/key width per head (default
    d_head); the state holds n_heads x d_key x d_head numbers. Each head's output is RMS-normalized
    (RetNet's group norm, without gain: ``out`` absorbs it) in place of softmax's denominator.
    The ``pos`` axis rotates phi(q) and phi(k) (RetNet's xPos is a rotation too); a score bias (ALiBi)
    has no score matrix to act on, so it is refused. Non-causal (encoder) blocks use the quadratic form
    with the decay applied in both directions.

    ``backend``: ``sdpa`` computes the chunked form (chunks of ``chunk`` tokens), ``math`` the full
    quadratic form (the reference). It declares no cross-attention, so ``block.cross_attention=true``
    is refused with it (zoo.assembly.compat).

    Parameters: ``qkv`` (per head: d_key query, d_key key, d_head value features, heads in turn),
    ``gate`` (``decay: gated``: one logit per head) and ``out``.
    """

    #: Canon site b: a canon layer on q, k and v as ``qkv`` gives them, before the feature map.
    canon_sites: ClassVar[frozenset[str]] = frozenset({"b"})
    doc_reset: ClassVar[str | None] = (
        "the state reset at each document's first token: in the chunked and quadratic forms every product of "
        "decays that spans a boundary cut to 0"
    )
    conflicts: ClassVar[dict[str, str]] = {
        "score bias": "linear attention never forms the score matrix a score bias is added to; "
        "use pos=rotary, or decay: fixed (RetNet's decay plays ALiBi's part)"
    }

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        if options["d_key"] is not None and options["d_key"] < 1:
            raise ConfigError("block.attn.d_key", options["d_key"], "must be a positive integer, or null for d_head")
        if options["chunk"] < 1:
            raise ConfigError("block.attn.chunk", options["chunk"], "must be a positive integer")

    @classmethod
    def check_tp(cls, dims: BlockDims, tp: int, **options: Any) -> None:
        require_whole_heads(dims.n_heads, tp)

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        """Column-wise ``qkv`` and ``gate`` (heads in turn: each rank whole heads, their fixed decays
        with them), row-wise ``out``; the position part's own plan. Under sequence parallelism the input
        is gathered from the sequence shards and the output reduce-scattered back to them."""
        plan: Plan = {
            "qkv": tp.ColwiseParallel(),
            "out": row_output(sequence_parallel),
            **prefixed("position", self.position.tp_plan(sequence_parallel)),  # type: ignore[attr-defined]
        }
        if self.gate is not None:
            plan["gate"] = tp.ColwiseParallel()
        plan[""] = tp.Chain(gather_sequence(), tp.LocalHeads("heads")) if sequence_parallel else tp.LocalHeads("heads")
        return plan

    def __init__(
        self,
        dims: BlockDims,
        position: Position,
        *,
        feature_map: FeatureMap = "elu",
        decay: Decay = "none",
        d_key: int | None = None,
        chunk: int = 64,
        backend: Backend = "sdpa",
    ) -> None:
        super().__init__()
        self.n_heads, self.d_head = dims.n_heads, dims.d_head
        self.d_key = self.d_head if d_key is None else d_key
        self.causal, self.backend, self.chunk = dims.causal, backend, chunk
        self.feature_map, self.decay = feature_map, decay
        rotated = hook(position, "rotated")  # rotary's rotated features per head
        if rotated is not None and rotated > self.d_key:
            raise ConfigError(
                "block.attn.d_key", d_key, f"must be at least the {rotated} features per head the position rotates"
            )
        self.position = position
        self.qkv = nn.Linear(dims.d_model, self.n_heads * (2 * self.d_key + self.d_head), bias=dims.bias)
        self.gate = nn.Linear(dims.d_model, self.n_heads, bias=dims.bias) if decay == "gated" else None
        self.out = nn.Linear(self.n_heads * self.d_head, dims.d_model, bias=dims.bias)
        self.canon = Canon(self.qkv.out_features, "b") if "b" in dims.canon_sites else None
        self.heads: torch.Tensor  # (h,) the indices of the heads this module computes (a tp rank: its own)
        self.register_buffer("heads", torch.arange(self.n_heads), persistent=False)

    def matrix_blocks(self) -> dict[str, dict[str, torch.Tensor]]:
        """``qkv``'s rows as the query, key and value matrices (each head's d_key, d_key, d_head rows in
        turn); ``gate`` and ``out`` are one matrix each."""
        rows = rearrange(torch.arange(self.qkv.out_features), "(h n) -> h n", h=self.n_heads)
        q, k, v = (rearrange(part, "h n -> (h n)") for part in rows.split([self.d_key, self.d_key, self.d_head], 1))
        return {"qkv.weight": {"q": q, "k": k, "v": v}}

    def state_size(self, length: int) -> int:
        """Numbers one sample's decoding state holds after any number of tokens: a (d_key, d_head) matrix per head."""
        return self.n_heads * self.d_key * self.d_head

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """x: (b, t, d_model) -> log g (b, h, t), <= 0."""
        if self.gate is not None:
            return rearrange(F.logsigmoid(self.gate(x)), "b t h -> b h t") / GATE_TEMPERATURE
        if self.decay == "fixed":
            fixed = retnet_decay(self.heads).to(torch.promote_types(x.dtype, torch.float32))
            return repeat(fixed, "h -> b h t", b=x.shape[0], t=x.shape[1])
        return x.new_zeros(x.shape[0], len(self.heads), x.shape[1])

    def attention_logits(self, x: torch.Tensor) -> torch.Tensor | None:
        """None: no softmax, so no attention logits (probes skip this mixer by name)."""
        return None

    def forward(self, x: torch.Tensor, *, key_mask: torch.Tensor | None = None, cache: LayerState | None = None,
                positions: torch.Tensor | None = None, documents: Documents | None = None) -> torch.Tensor:  # fmt: skip
        """x: (b, t, d_model) -> (b, t, d_model).

        key_mask: (b, t_k) bool, True at real tokens (t_k counts earlier tokens too): a padding token
            adds nothing to the state and does not decay it. cache: this layer's state; its
            :class:`RecurrentState` carries the matrix across calls. positions: (b, t) per-sample
            position ids for the ``pos`` axis (left-padded batches); default: token index.
        documents: every token's document (zoo.parts.documents): the state starts anew at each one.
        """
        time = x.shape[1]
        state = None if cache is None else cache.mixer_state(RecurrentState)
        if state is not None and not self.causal:
            raise ValueError("a non-causal linear attention has no decoding state (every token sees the whole input)")
        slots = query_slots(state, time, x.device)  # (t,)
        mixed = self.qkv(x)
        if self.canon is not None:
            real = None if key_mask is None else key_mask.index_select(1, slots).bool()
            mixed = self.canon(mixed, real, cache, None if documents is None else documents.taps(slots, KERNEL))
        q, k, v = rearrange(mixed, "b t (h n) -> b h t n", n=2 * self.d_key + self.d_head).split(
            [self.d_key, self.d_key, self.d_head], dim=-1
        )
        q, k = feature(q, self.feature_map), feature(k, self.feature_map)
        q, k = self.position.rotate(q, k, slots if positions is None else positions)
        log_decay = self.log_decay(x).to(torch.promote_types(x.dtype, torch.float32))  # summed: at least float32
        if key_mask is not None:  # padding: no key, no decay
            real = rearrange(key_mask.index_select(1, slots).bool(), "b t -> b 1 t")  # the new tokens' columns
            k = k * real[..., None]
            log_decay = log_decay * real
        start = None if state is None else state.matrix
        segments = None if documents is None else documents.segments(slots)
        if not self.causal or self.backend == "math":
            y, end = quadratic(q, k, v, log_decay, start, self.causal, segments)
        elif time == 1 and start is not None:
            y, end = recurrent(q, k, v, log_decay, start, None if documents is None else documents.fresh(slots))
        else:
            y, end = chunked(q, k, v, log_decay, start, self.chunk, segments)
        if state is not None:
            state.update(end, time)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + NORM_EPS)  # per head, no gain
        return self.out(rearrange(y, "b h t d -> b t (h d)"))
