"""The causal depthwise convolution over time that Gated DeltaNet's short convolution and the canon layers
(zoo.parts.canon) compute, continued across decoding calls from the inputs before it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange


def short_convolution(
    x: torch.Tensor, kernel: torch.Tensor, tail: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A causal depthwise convolution over time: x (b, t, c), kernel (c, 1, w), ``tail`` (b, w - 1, c) the
    inputs before x (None: zeros) -> y (b, t, c), y_i = sum_j kernel[:, 0, j] x_{i - w + 1 + j}, and the
    last w - 1 inputs (the next call's tail)."""
    width = kernel.shape[-1]
    if tail is None:
        tail = x.new_zeros(x.shape[0], width - 1, x.shape[-1])
    padded = torch.cat([tail, x], dim=1)  # (b, w - 1 + t, c)
    y = F.conv1d(rearrange(padded, "b t c -> b c t"), kernel, groups=x.shape[-1])
    return rearrange(y, "b c t -> b t c"), padded[:, padded.shape[1] - (width - 1) :]
