"""What softmax attention may do to its heads' outputs before the output projection: the output gate
(``block.attn.gate``), exclusive self-attention (``block.attn.xsa``), and the options' FLOPs.

The learned sink (``block.attn.sink``) acts inside the softmax, so it is the kernel's
(:func:`zoo.parts.kernels.attend`). Order, per head: y = attend(q, k, v) (with the sink), then XSA,
then the gate, then ``out``. Every default leaves the attention as it was, bit for bit, with no new
parameter. Under tensor parallelism the options' share of the attention's plan is :func:`output_plan`.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from zoo.core import tp
from zoo.core.dims import BlockDims
from zoo.core.reshape import rearrange
from zoo.core.tp import Plan, gather_sequence

#: The output gate: none, one sigmoid per head, or one per output feature (Qiu et al. 2025).
Gate = Literal["none", "headwise", "elementwise"]
#: The softmax's extra denominator term: none, or a learned logit per head (gpt-oss).
Sink = Literal["none", "learned"]


def build_gate(gate: Gate, dims: BlockDims) -> nn.Linear | None:
    """The gate's projection W_g (d_model -> n_heads, or n_heads * d_head rows in head order), None for none."""
    if gate == "none":
        return None
    width = dims.n_heads if gate == "headwise" else dims.n_heads * dims.d_head
    return nn.Linear(dims.d_model, width, bias=dims.bias)


def build_sink(sink: Sink, n_heads: int) -> nn.Parameter | None:
    """One learned logit per head, initialized at 0 (an extra key whose score is 0), None for none."""
    return None if sink == "none" else nn.Parameter(torch.zeros(n_heads))


def gated(y: torch.Tensor, projection: nn.Linear | None, x: torch.Tensor) -> torch.Tensor:
    """y (b, h, t, d) ⊙ σ(x W_g): per head (the gate's width is h) or per feature (h d); ``x`` (b, t, d_model) is
    the attention's input. Unchanged when ``projection`` is None."""
    if projection is None:
        return y
    logits = projection(x)  # (b, t, h) or (b, t, h d); h: this rank's heads under tensor parallelism
    if logits.shape[-1] == y.shape[1]:
        gate = rearrange(logits, "b t h -> b h t 1")
    else:
        gate = rearrange(logits, "b t (h d) -> b h t d", d=y.shape[-1])
    return y * torch.sigmoid(gate)


def exclude_own_value(y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Exclusive self-attention: each head's output less its component along its own value at that position,
    z = y - (y . v̂) v̂, v̂ = v / ||v|| (a zero value removes nothing).

    y: (b, h, t, d); v: (b, g, t, d), the values at the queries' positions, g dividing h (query head h
    reads key/value head h // (h / g), as in the kernel)."""
    unit = F.normalize(v, dim=-1)
    heads = rearrange(y, "b (g r) t d -> b g r t d", g=v.shape[1])
    unit = rearrange(unit, "b g t d -> b g 1 t d")
    along = (heads * unit).sum(-1, keepdim=True)  # (b, g, r, t, 1)
    return rearrange(heads - along * unit, "b g r t d -> b (g r) t d")


def output_flops(n_heads: int, n_kv_heads: int, d_head: int, gate: Gate, sink: Sink, xsa: bool) -> int:
    """Training FLOPs per token (forward + backward, 3 x the forward's) of the options beyond their parameters,
    which 6 x parameters already counts (the gate's multiply-adds; the sink's term in each head's denominator,
    2 per head): the gate's sigmoid (one per gate) and product (h d_head); the sink's rescaling of each head's
    output (h d_head); XSA's unit values (per key/value head: 3 d_head, a norm and a division) and removal
    (per head: 4 d_head, a dot product, a scaled vector and a subtraction)."""
    forward = 0
    if gate != "none":
        forward += n_heads * d_head + (n_heads if gate == "headwise" else n_heads * d_head)
    if sink != "none":
        forward += n_heads * d_head
    if xsa:
        forward += 3 * n_kv_heads * d_head + 4 * n_heads * d_head
    return 3 * forward


def output_plan(attention: nn.Module, sequence_parallel: bool) -> Plan:
    """The output options' share of a softmax attention's tensor-parallel plan: the gate column-wise (its
    rows in head order, as each rank's query heads), the sinks cut to each rank's heads, and, under sequence
    parallelism, the input gathered from the sequence shards."""
    plan: Plan = {}
    if attention.gate is not None:
        plan["gate"] = tp.ColwiseParallel()
    whole = [gather_sequence()] if sequence_parallel else []
    parameters = [tp.HeadParameters("sink")] if attention.sink is not None else []
    if whole or parameters:
        plan[""] = tp.Chain(*whole, *parameters)
    return plan
