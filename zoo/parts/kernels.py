"""The attention kernels every attention part shares: the boolean mask of what a query may see
(:func:`allowed_mask`), its merge with a score bias into one additive mask (:func:`additive`), the
softmax kernel (:func:`attend`, SDPA or explicit math) and self-attention at cache slots
(:func:`attend_at`).

Mask convention, everywhere in zoo: a boolean mask is True where attention is *allowed*
(SDPA's convention; ``nn.MultiheadAttention`` uses the opposite). Key position > query position
is blocked in causal attention.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F

from zoo.core.reshape import rearrange, repeat
from zoo.parts.flex import flex_additive, flex_at
from zoo.parts.positions import Position

#: The attention kernels: ``sdpa`` (torch's fused scaled_dot_product_attention), ``math`` (explicit) or ``flex``
#: (torch's FlexAttention: masks as block masks, biases and the soft-cap as score modifications, zoo.parts.flex).
Backend = Literal["sdpa", "math", "flex"]


def allowed_mask(
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    causal: bool,
    key_mask: torch.Tensor | None,
    window: int | None = None,
) -> torch.Tensor | None:
    """Boolean (b or 1, 1, t_q, t_k) mask, True where query i may attend to key j, or None if all may.

    Built from absolute positions, so it stays right when there are fewer queries than keys
    (cached decoding), where SDPA's top-left-aligned ``is_causal`` would be wrong.
    key_mask: (b, t_k), True at real (non-padding) keys.
    window: keys must also be less than ``window`` positions away (causal: the query and the
    window - 1 keys before it).
    """
    mask = None
    if causal:
        mask = rearrange(k_positions, "k -> 1 1 1 k") <= rearrange(q_positions, "q -> 1 1 q 1")
    if window is not None:
        near = (rearrange(q_positions, "q -> 1 1 q 1") - rearrange(k_positions, "k -> 1 1 1 k")).abs() < window
        mask = near if mask is None else mask & near
    if key_mask is not None:
        keys = rearrange(key_mask.bool(), "b k -> b 1 1 k")
        mask = keys if mask is None else mask & keys
    return mask


def additive(mask: torch.Tensor | None, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Merge a boolean mask and a float score bias into one additive float mask.

    Blocked entries get half the dtype's lowest value rather than -inf, so a fully masked row
    softmaxes to finite (uniform) weights instead of NaN.
    """
    if mask is None and bias is None:
        return None
    device = (mask if mask is not None else bias).device
    out = torch.zeros((), dtype=dtype, device=device) if bias is None else bias.to(dtype)
    if mask is not None:
        out = torch.where(mask, out, torch.finfo(dtype).min / 2)
    return out


def scaled(scores: torch.Tensor, d: int, scale: float | None) -> torch.Tensor:
    """Raw scores q k^T of d features times the kernel's score scale: ``scale``, or 1 / sqrt(d) when None
    (the math path's, and the attention probes', one definition of it)."""
    return scores / math.sqrt(d) if scale is None else scores * scale


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    is_causal: bool,
    backend: Backend,
    dropout: float = 0.0,
    softcap: float | None = None,
    scale: float | None = None,
    sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """The attention kernel every attention part shares: softmax(scale q k^T + mask) v.

    q: (b, h, t_q, d); k, v: (b, g, t_k, d) with g dividing h (query head i reads key/value head
    i // (h / g)); mask: an additive float mask broadcasting to (b, h, t_q, t_k), or None;
    ``is_causal``: a top-left causal mask instead (never together with ``mask``). ``dropout`` is the
    attention-weight dropout to apply (pass 0.0 in eval). ``scale``: the score multiplier, None for
    1 / sqrt(d) (μP passes 1 / d). ``sink``: (h,) learned logits, one more term per head in the softmax's
    denominator (gpt-oss): weights exp(s_j) / (exp(sink_h) + sum_j' exp(s_j')), so a query may attend to
    nothing. -> (b, h, t_q, d).

    ``sdpa``: torch's fused scaled_dot_product_attention (GQA without copying keys); a sink is one more key
    (:func:`with_sink`). ``math``: explicit scores in at least float32, optional soft-capping, softmax
    (over the scores and the sink's column, dropped after), weights @ v (the reference). ``flex``: FlexAttention with
    the mask as a score modification (:func:`zoo.parts.flex.flex_attend`; no dropout).
    """
    group = q.shape[1] // k.shape[1]
    if backend == "flex":
        return flex_additive(q, k, v, mask, is_causal=is_causal, dropout=dropout, softcap=softcap, scale=scale,
                             sink=sink)  # fmt: skip
    if backend == "sdpa":
        if softcap is not None:
            raise ValueError("softcap needs the math backend (SDPA has no hook to cap the scores)")
        if sink is not None:
            k, v, mask = with_sink(q, k, v, mask, sink, is_causal=is_causal)
            is_causal = False
        # Never both attn_mask and is_causal: CPU would silently apply both.
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal, enable_gqa=group > 1, scale=scale
        )
    k = repeat(k, "b g t d -> b (g r) t d", r=group)  # grouped: query head h reads kv head h // group
    v = repeat(v, "b g t d -> b (g r) t d", r=group)
    dtype = torch.promote_types(q.dtype, torch.float32)  # scores in at least float32 (float64 stays)
    scores = scaled(torch.einsum("bhqd,bhkd->bhqk", q.to(dtype), k.to(dtype)), q.shape[-1], scale)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if is_causal:
        t_q, t_k = scores.shape[-2:]
        mask = additive(torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).tril(), None, dtype)
    if mask is not None:
        scores = scores + mask.to(dtype)
    if sink is not None:  # the sink's logit as one more column of every row, dropped after the softmax
        column = repeat(sink.to(dtype), "h -> b h q 1", b=scores.shape[0], q=scores.shape[2])
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)  # over keys
    weights = F.dropout(weights, dropout) if dropout > 0 else weights
    return torch.einsum("bhqk,bhkd->bhqd", weights.to(v.dtype), v)


def with_sink(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, sink: torch.Tensor, *, is_causal: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sink as one more key for SDPA, after the last: a zero key (its score q . 0 = 0) and a zero value
    (it adds nothing to the output), every query sees it, and the mask's column there is the head's sink
    logit, so its score is the sink exactly. SDPA differentiates its float mask, so the sink learns.

    q: (b, h, t_q, d); k, v: (b, g, t_k, d); mask: additive, broadcasting to (b, h, t_q, t_k), or None;
    ``is_causal``: the top-left causal mask instead (made explicit here). -> keys, values (b, g, t_k + 1, d)
    and the additive mask (b or 1, h, t_q, t_k + 1).
    """
    (_, heads, t_q, _), t_k = q.shape, k.shape[-2]
    if is_causal:
        mask = additive(torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).tril(), None, q.dtype)
    rows = torch.zeros((), dtype=q.dtype, device=q.device) if mask is None else mask.to(q.dtype)
    rows = rows.expand(torch.broadcast_shapes(rows.shape, (1, heads, t_q, t_k)))
    column = repeat(sink.to(q.dtype), "h -> b h q 1", b=rows.shape[0], q=t_q)
    k, v = (F.pad(tensor, (0, 0, 0, 1)) for tensor in (k, v))  # a zero key and value after the last
    return k, v, torch.cat([rows, column], dim=-1)


def attend_at(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    slots: torch.Tensor,
    positions: torch.Tensor | None,
    k_positions: torch.Tensor | None,
    key_mask: torch.Tensor | None,
    causal: bool,
    position: Position,
    backend: Backend,
    dropout: float = 0.0,
    window: int | None = None,
    softcap: float | None = None,
    preallocated: bool = False,
    scale: float | None = None,
    sink: torch.Tensor | None = None,
    documents: torch.Tensor | None = None,
) -> torch.Tensor:
    """Self-attention of queries at cache slots ``slots`` (t_q,) to the keys at slots 0..t_k-1.

    q: (b, h, t_q, d); k: (b, g, t_k, d); v: (b, g, t_k, d_v). positions / k_positions: per-sample
    position ids of queries / keys for the position's score bias (default: slots). The mask follows
    slots (causality, the window) and ``key_mask``; with neither padding, bias, window nor cached
    keys, the plain causal case goes to the fused kernel's ``is_causal``. ``preallocated``: the keys
    include empty slots after the last query (a static cache), which the causal mask must hide.
    ``scale``, ``sink``: as for ``attend``. ``documents`` (b, 1, t_q, t_k) bool: True where query and key share
    a document (zoo.parts.documents.Documents.same), the block-diagonal mask combined with the others.
    -> (b, h, t_q, d_v).
    """
    time = q.shape[-2]
    k_slots = torch.arange(k.shape[-2], device=q.device)
    bias = position.score_bias(
        slots if positions is None else positions, k_slots if k_positions is None else k_positions
    )
    # One query at the last slot of a growing cache may see every key: decoding steps need no causal mask.
    needs_causal = causal and (time > 1 or preallocated)
    if backend == "flex":  # the mask as a block mask from the slots, the bias as a score modification
        seen = None if key_mask is None else allowed_mask(slots, k_slots, needs_causal, key_mask, window)
        return flex_at(q, k, v, slots=slots, causal=needs_causal, window=window, key_mask=key_mask, seen=seen,
                       documents=documents, bias=bias, dropout=dropout, softcap=softcap, scale=scale, sink=sink)
    mask = allowed_mask(slots, k_slots, needs_causal, key_mask, window)
    if documents is not None:
        mask = documents if mask is None else mask & documents
    plain = key_mask is None and bias is None and window is None and documents is None
    plain_causal = causal and time > 1 and k.shape[-2] == time and plain
    return attend(
        q,
        k,
        v,
        None if plain_causal else additive(mask, bias, q.dtype),
        is_causal=plain_causal,
        backend=backend,
        dropout=dropout,
        softcap=softcap,
        scale=scale,
        sink=sink,
    )
