"""Attention logits for probes: the pre-softmax scores a mixer's kernel computes, on the math path.

Parts with softmax attention expose them through the ``attention_logits`` hook (zoo.core.interface);
:func:`masked_logits` is what they share. It scales the scores with the kernel's own
:func:`zoo.parts.kernels.scaled`, from the ``scale`` the part passes to its kernel too, so a part whose
score scale changes (muP's 1 / d) is probed at that scale.
"""

from __future__ import annotations

import torch

from zoo.core.reshape import rearrange, repeat
from zoo.parts.kernels import allowed_mask, scaled


def masked_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    scale: float | None,
    causal: bool,
    bias: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Scores of queries at positions 0..t-1 against keys at the same positions, in at least float32,
    as :func:`zoo.parts.kernels.attend` computes them before its softmax.

    q: (b, h, t, d); k: (b, g, t, d), g dividing h; ``scale`` the kernel's (None: 1 / sqrt(d));
    ``bias`` the position's score bias; ``softcap`` as the kernel applies it (before the bias).
    -> (b, h, t, t), -inf where a key is blocked (later keys when ``causal``, outside ``window``).
    """
    if k.shape[1] != q.shape[1]:
        k = repeat(k, "b g t d -> b (g r) t d", r=q.shape[1] // k.shape[1])  # query head h reads kv head h // r
    dtype = torch.promote_types(q.dtype, torch.float32)
    # The kernel's scale on the queries (fewer numbers than the scores; the same product up to rounding).
    q, k = scaled(q.to(dtype), q.shape[-1], scale), k.to(dtype)
    slots = torch.arange(q.shape[-2], device=q.device)
    offset = offsets(allowed_mask(slots, slots, causal, None, window), bias, dtype)
    if softcap is not None:
        scores = softcap * torch.tanh((q @ k.transpose(-1, -2)) / softcap)  # (b, h, t, t), a new tensor
        return scores if offset is None else scores.add_(offset)
    if offset is None:
        return q @ k.transpose(-1, -2)  # (b, h, t, t)
    if offset.shape[:-2].numel() > 1:  # a bias per head (or sample): added after the product
        return (q @ k.transpose(-1, -2)).add_(offset)
    # One offset for every head: added in the product (one pass over the scores, not two).
    flat = torch.baddbmm(offset.reshape(offset.shape[-2:]), q.flatten(0, 1), k.flatten(0, 1).transpose(-1, -2))
    return rearrange(flat, "(b h) q k -> b h q k", b=q.shape[0])  # (b h, t, t) -> (b, h, t, t)


def offsets(allowed: torch.Tensor | None, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """What the raw scores get added: the score ``bias`` where ``allowed`` (a boolean mask), -inf elsewhere."""
    if allowed is None:
        return None if bias is None else bias.to(dtype)
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero if bias is None else bias.to(dtype), float("-inf"))
