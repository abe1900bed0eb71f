"""The ``flex`` attention backend: torch's FlexAttention, every mask a block mask and every score change a score
modification, so that one kernel computes them all.

A block mask (:func:`slot_mask`) says which keys a query may see, from its cache slot: causality, the window,
the key mask (padding) and the documents; compiled, blocks of keys no query of a block sees are skipped
(:func:`block_mask_of`). A score modification adds the position's score bias (ALiBi) and the soft-cap. A sink
divides by one more term, exp(sink_h), through the kernel's log-sum-exp: softmax(s) sigmoid(lse(s) - sink_h).

Compiled (``torch.compile``), FlexAttention generates one fused kernel for the mask and the modifications: on
CUDA the path for windows and document masks, which SDPA only takes as a dense float mask. Uncompiled, and on
CPU, torch runs an unfused reference implementation of the same function (and warns once), forward only: torch
has no FlexAttention backward on CPU, so training with ``flex`` needs a CUDA device. Compiled on CPU, torch's
kernel returns no log-sum-exp, so a sink runs there uncompiled only.

A query that sees no key at all (a padding query before any real key) sees every key at the score
lowest / 2, as the additive mask of the other backends gives (zoo.parts.kernels.additive): uniform weights,
and no weight beside a sink.

The masks and modifications read their captured tensors with :func:`at`, not ``[]``: inside FlexAttention
torch turns ``t[i]`` into a differentiable indexing function, a Python autograd Function that its unfused
implementation runs under four nested vmaps; a tensor without a gradient to carry needs only the index itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, and_masks, create_block_mask, flex_attention

from zoo.core.dims import BlockDims
from zoo.core.errors import ConfigError
from zoo.core.reshape import repeat

#: A FlexAttention mask modification: (batch, head, query, key) index tensors -> True where the key is seen.
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

#: The side of a block mask's blocks, in queries and keys (torch's default).
BLOCK = 128

#: Why flex cannot train on the CPU (refused by the forward and by a run's config).
NO_CPU_BACKWARD = "sdpa or math to train on CPU (torch's FlexAttention has no CPU backward)"


def at(tensor: torch.Tensor, *indices: Any) -> torch.Tensor:
    """``tensor[indices]`` inside a mask or score modification: ``aten.index`` directly (what ``[]`` becomes there,
    less torch's differentiable wrapper, which took most of an uncompiled call's time), or ``[]`` where ``tensor``
    requires a gradient, which the wrapper then carries."""
    return tensor[indices] if tensor.requires_grad else torch.ops.aten.index(tensor, list(indices))


def check_flex(dims: BlockDims, backend: str) -> None:
    """Refuse what ``flex`` cannot compute: attention-weight dropout (FlexAttention has none)."""
    if backend == "flex" and dims.dropout > 0:
        raise ConfigError(
            "block.attn.backend", backend, f"sdpa or math with block.dropout={dims.dropout} (flex has no dropout)"
        )


def slot_mask(
    slots: torch.Tensor,
    *,
    causal: bool,
    window: int | None,
    key_mask: torch.Tensor | None,
    documents: torch.Tensor | None,
) -> MaskMod | None:
    """The mask of :func:`zoo.parts.kernels.allowed_mask` (and the document mask) as a FlexAttention mask_mod, or
    None where every key is seen. slots: (t_q,) the queries' cache slots (key j is at slot j); key_mask: (b, t_k)
    True at real keys; documents: (b, 1, t_q, t_k) bool, True where query and key share a document."""
    mods: list[MaskMod] = []
    if causal:
        mods.append(lambda b, h, q, kv: kv <= at(slots, q))
    if window is not None:
        mods.append(lambda b, h, q, kv: (at(slots, q) - kv).abs() < window)
    if key_mask is not None:
        real = key_mask.bool()
        mods.append(lambda b, h, q, kv: at(real, b, kv))
    if documents is not None:
        same = documents[:, 0]  # (b, t_q, t_k)
        mods.append(lambda b, h, q, kv: at(same, b, q, kv))
    return and_masks(*mods) if mods else None


def flex_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask_mod: MaskMod | None = None,
    batched: bool = False,
    empty: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    softcap: float | None = None,
    scale: float | None = None,
    sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(softcap(scale q k^T) + bias) v over the keys ``mask_mod`` allows, by FlexAttention.

    q: (b, h, t_q, d); k: (b, g, t_k, d), v: (b, g, t_k, d_v) with g dividing h; ``batched``: the mask depends on
    the sample; ``empty``: (b, t_q) True at queries that see no key (they see every key at lowest / 2);
    ``bias``: an additive float score bias broadcasting to (b, h, t_q, t_k); ``scale``: None for 1 / sqrt(d);
    ``sink``: (h,) logits, as :func:`zoo.parts.kernels.attend`'s. -> (b, h, t_q, d_v).
    """
    if torch.is_grad_enabled() and q.device.type == "cpu" and any(t.requires_grad for t in (q, k, v)):
        raise ConfigError("block.attn.backend", "flex", NO_CPU_BACKWARD)
    (b, h, t_q, _), t_k = q.shape, k.shape[-2]
    dtype = torch.promote_types(q.dtype, torch.float32)
    lowest = torch.finfo(dtype).min / 2
    full = None if bias is None else bias.to(dtype).expand(b, h, t_q, t_k)  # a view: indexed per score
    block_mask = None
    if empty is not None:
        inner = mask_mod or (lambda b, h, q, kv: kv >= 0)
        mask_mod = _or_empty(inner, empty)
    if mask_mod is not None:
        batch = b if batched or empty is not None else None
        block_mask = block_mask_of(mask_mod, batch, t_q, t_k, q.device, sparse=torch.compiler.is_compiling())

    def score_mod(score: torch.Tensor, b: Any, h: Any, q_idx: Any, kv: Any) -> torch.Tensor:
        if softcap is not None:
            score = softcap * torch.tanh(score / softcap)
        if full is not None:
            score = score + at(full, b, h, q_idx, kv)
        if empty is not None:
            score = torch.where(at(empty, b, q_idx), lowest, score)
        return score

    plain = softcap is None and full is None and empty is None
    out = flex_attention(
        q, k, v, score_mod=None if plain else score_mod, block_mask=block_mask, scale=scale,
        enable_gqa=k.shape[1] != h, return_aux=None if sink is None else AuxRequest(lse=True),
    )  # fmt: skip
    if sink is None:
        return out
    out, aux = out  # exp(s_j) / (exp(sink_h) + sum_j' exp(s_j')) = softmax(s)_j sigmoid(lse - sink_h)
    return out * torch.sigmoid(aux.lse - sink.to(aux.lse.dtype)[:, None])[..., None].to(out.dtype)


def block_mask_of(
    mask_mod: MaskMod, batch: int | None, t_q: int, t_k: int, device: torch.device, *, sparse: bool
) -> BlockMask:
    """``mask_mod`` as a block mask. ``sparse`` (compiled): torch's ``create_block_mask``, which evaluates
    ``mask_mod`` at every query and key to find the blocks of keys no query of a block sees, which the fused kernel
    skips. Otherwise every block is marked partial, one structure for every sample (``batch`` unread): torch's
    unfused implementation evaluates ``mask_mod`` at every score itself and reads no block structure, so the output
    is the same without evaluating the mask twice."""
    if sparse:
        return create_block_mask(mask_mod, batch, None, t_q, t_k, device=device)
    n_q, n_k = -(-t_q // BLOCK), -(-t_k // BLOCK)
    counts = torch.full((1, 1, n_q), n_k, dtype=torch.int32, device=device)  # (1, 1, query blocks): all partial
    blocks = repeat(torch.arange(n_k, dtype=torch.int32, device=device), "k -> 1 1 q k", q=n_q).contiguous()
    return BlockMask.from_kv_blocks(counts, blocks, BLOCK_SIZE=BLOCK, mask_mod=mask_mod, seq_lengths=(t_q, t_k))


def no_dropout(dropout: float) -> None:
    """Refuse attention dropout (FlexAttention has none; the config check refuses it before this)."""
    if dropout > 0:
        raise ValueError("attention dropout needs the sdpa or math backend (FlexAttention has none)")


def flex_additive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    is_causal: bool,
    dropout: float,
    softcap: float | None,
    scale: float | None,
    sink: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`zoo.parts.kernels.attend`'s arguments on flex: the additive float ``mask`` as a score bias (a query
    that sees no key gets lowest / 2 at every key from it, as math does), ``is_causal`` as a top-left mask_mod."""
    no_dropout(dropout)
    causal = (lambda b, h, q, kv: kv <= q) if is_causal else None
    return flex_attend(q, k, v, mask_mod=causal, bias=mask, softcap=softcap, scale=scale, sink=sink)


def flex_at(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    slots: torch.Tensor,
    causal: bool,
    window: int | None,
    key_mask: torch.Tensor | None,
    seen: torch.Tensor | None,
    documents: torch.Tensor | None,
    bias: torch.Tensor | None,
    dropout: float,
    softcap: float | None,
    scale: float | None,
    sink: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`zoo.parts.kernels.attend_at`'s attention on flex: :func:`slot_mask` as the block mask, ``bias`` (the
    position's) as a score modification. ``seen``: with a key mask, the boolean mask without the documents
    (b, 1, t_q, t_k), from which the queries that see no key are found."""
    no_dropout(dropout)
    empty = None
    if seen is not None:  # queries before any real key (left padding) see none
        empty = ~(seen if documents is None else seen & documents).any(-1)[:, 0]  # (b, t_q)
    mod = slot_mask(slots, causal=causal, window=window, key_mask=key_mask, documents=documents)
    return flex_attend(q, k, v, mask_mod=mod, batched=key_mask is not None or documents is not None, empty=empty,
                       bias=bias, softcap=softcap, scale=scale, sink=sink)  # fmt: skip


def _or_empty(inner: MaskMod, empty: torch.Tensor) -> MaskMod:
    """``inner``, and every key for the queries marked ``empty`` (b, t_q)."""
    return lambda b, h, q, kv: inner(b, h, q, kv) | at(empty, b, q)
