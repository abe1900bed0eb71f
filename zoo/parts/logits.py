"""Attention logits for probes: the pre-softmax scores a mixer's kernel computes, on the math path.

Parts with softmax attention expose them through the ``attention_logits`` hook (zoo.core.interface);
:func:`masked_logits` is what they share. It scales the scores with the kernel's own
:func:`zoo.parts.kernels.scaled`, from the ``scale`` the part passes to its kernel too, so a part whose
score scale changes (muP's 1 / d) is probed at that scale.
"""

from __future__ import annotations

import torch
from einops import repeat

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
    scores = scaled(q.to(dtype), q.shape[-1], scale) @ k.to(dtype).transpose(-1, -2)  # (b, h, t, t), a new tensor
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores += bias.to(dtype)
    slots = torch.arange(q.shape[-2], device=q.device)
    mask = allowed_mask(slots, slots, causal, None, window)
    return scores if mask is None else scores.masked_fill_(~mask, float("-inf"))
