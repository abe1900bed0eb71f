"""The causal depthwise convolution over time that Gated DeltaNet's short convolution and the canon layers
(zoo.parts.canon) compute, continued across decoding calls from the inputs before it."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import einsum
from torch import nn

from zoo.core.reshape import rearrange


def short_convolution(
    x: torch.Tensor, kernel: torch.Tensor, tail: torch.Tensor | None, taps: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A causal depthwise convolution over time: x (b, t, c), kernel (c, 1, w), ``tail`` (b, w - 1, c) the
    inputs before x (None: zeros) -> y (b, t, c), y_i = sum_j kernel[:, 0, j] x_{i - w + 1 + j}, and the
    last w - 1 inputs (the next call's tail). ``taps`` (b, t, w) bool (zoo.parts.documents.Documents.taps):
    False where tap j of token i reaches into another document, which it then reads as zero."""
    width = kernel.shape[-1]
    if tail is None:
        tail = x.new_zeros(x.shape[0], width - 1, x.shape[-1])
    padded = torch.cat([tail, x], dim=1)  # (b, w - 1 + t, c)
    rest = padded[:, padded.shape[1] - (width - 1) :]
    if taps is not None:  # each token's own window, taps from other documents zeroed
        windows = padded.unfold(1, width, 1) * taps[:, :, None, :].to(x.dtype)  # (b, t, c, w)
        return einsum(windows, kernel[:, 0], "b t c w, c w -> b t c"), rest
    y = F.conv1d(rearrange(padded, "b t c -> b c t"), kernel, groups=x.shape[-1])
    return rearrange(y, "b c t -> b t c"), rest


def add_kernel(module: nn.Module, channels: int, taps: int) -> None:
    """Give ``module`` a short convolution's kernel ``conv`` (channels, 1, taps), stored as its difference from the
    identity (so the model's std-0.02 draw starts it near a kernel that passes the present token through; drawn here
    as nn.Conv1d draws its own), and the identity ``present`` (taps,), a buffer: the kernel is ``conv + present``."""
    module.conv = nn.Parameter(torch.empty(channels, 1, taps))
    nn.init.kaiming_uniform_(module.conv, a=math.sqrt(5))  # nn.Conv1d's own default draw
    present = torch.zeros(taps)
    present[-1] = 1.0
    module.register_buffer("present", present, persistent=False)
