"""Kimi Delta Attention (KDA): Gated DeltaNet whose decay is a gate per key channel rather than one per head
(the linear mixer of Kimi Linear), with low-rank projections for that gate and for the output gate.

It is :class:`zoo.parts.gated_deltanet.GatedDeltaNet` with three changes, so it shares that part's short
convolution, decoding state (:class:`zoo.parts.gated_deltanet.DeltaState`), document resets, output norm and both
forms of the delta rule (:func:`zoo.parts.gated_deltanet.delta_chunked` and ``delta_recurrent`` take a decay per key
channel): the decay, its rates and the output gate's activation.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from zoo.core import tp
from zoo.core.dims import BlockDims
from zoo.core.registry import ATTENTIONS
from zoo.core.reshape import rearrange, repeat
from zoo.core.tp import Plan, local
from zoo.parts.gated_deltanet import SUB, GatedDeltaNet, initial_rates


def low_rank(d_in: int, rank: int, d_out: int, bias: bool) -> nn.Sequential:
    """d_in -> rank -> d_out, two matrices (``0`` and ``1``); ``bias`` on the second only."""
    return nn.Sequential(nn.Linear(d_in, rank, bias=False), nn.Linear(rank, d_out, bias=bias))


@ATTENTIONS.register(
    "kda",
    summary="Kimi Delta Attention: Gated DeltaNet with a data-dependent decay per key channel (a low-rank gate) "
    "and a low-rank sigmoid output gate; chunked for training, recurrent for decoding.",
    formula="S_i = S_{i-1} diag(a_i) (I - beta_i k_i k_i^T) + beta_i v_i k_i^T, y_i = rmsnorm(S_i q_i) * "
    "sigmoid(W_g2 W_g1 x_i); a_i = exp(-exp(A_log) softplus(W_f2 W_f1 x_i + dt)) in (0, 1]^d_key per value head, "
    "W_f1 and W_g1 d_model -> head_dim (the rank), W_f2 -> n_heads d_key, W_g2 -> n_heads head_dim; q, k, v, beta, "
    "the key heads and allow_neg_eigval as gated_deltanet's; mixing cost per token 6 n_heads (chunk (3 d_key + 2 "
    "d_head) + 3 d_key d_head + 2 d_key (s + chunk / s)) training FLOPs, s = gcd(chunk, 16) tokens per sub-chunk",
    reference="Kimi Team 2025, Kimi Linear: An Expressive, Efficient Attention Architecture, arXiv:2510.26692; "
    "fla-core's KimiDeltaAttention layer and its naive_recurrent_kda / naive_chunk_kda; transformers' "
    "KimiLinearDeltaAttention",
)
class KimiDeltaAttention(GatedDeltaNet):
    """Kimi Delta Attention: Gated DeltaNet's delta rule with a decay per key channel, so each of a head's d_key
    state rows forgets at its own data-dependent rate (a_i, d_key numbers per value head and token).

    As :class:`zoo.parts.gated_deltanet.GatedDeltaNet` (``qkv`` by key head, the short convolution, SiLU, q and k
    L2-normalized, beta = sigmoid(``beta`` x) per value head, ``allow_neg_eigval``, ``n_key_heads``, ``head_dim``,
    the per-head output RMSNorm) but for:

    - the decay: log a = -exp(``a_log``) softplus(``decay`` x + ``dt``), ``decay`` a low-rank projection d_model ->
      head_dim -> n_heads x d_key (fla's f_proj), ``dt`` one bias per channel (fla's dt_bias), ``a_log`` one rate per
      value head; each head's ``dt`` starts at Gated DeltaNet's value for that head (:func:`initial_rates`);
    - the output gate: sigmoid(``gate`` x), ``gate`` low-rank d_model -> head_dim -> n_heads x head_dim (fla's
      g_proj; its bias on the second matrix, where the block has biases).

    The decay and beta are per value head (fla's kernels' form; fla's layer computes them per key head and repeats
    them, the same at n_key_heads = n_heads, transformers' Kimi Linear's only form). The chunked form (``backend:
    sdpa``) splits each chunk into sub-chunks of 16 tokens to keep every exponent at or below 0
    (:func:`zoo.parts.gated_deltanet.channel_products`); ``math`` is the recurrent form.
    """

    part_name: ClassVar[str] = "kda"
    conflicts: ClassVar[dict[str, str]] = {
        "score bias": "KDA never forms the score matrix a score bias is added to; use pos=rotary or pos=none (its "
        "convolution and decay carry order)"
    }

    def build_decay(self, dims: BlockDims) -> None:
        """``decay`` (low-rank, d_model -> head_dim -> n_heads x d_key), ``dt`` per channel, ``a_log`` per head."""
        self.decay = low_rank(dims.d_model, self.d_head, self.n_heads * self.d_key, bias=False)  # ``dt``: its bias
        a_log, dt = initial_rates(self.n_heads)
        self.a_log, self.dt = nn.Parameter(a_log), nn.Parameter(repeat(dt, "h -> (h k)", k=self.d_key).contiguous())

    def build_gate(self, dims: BlockDims) -> nn.Module:
        """``gate``: low-rank, d_model -> head_dim -> n_heads x head_dim."""
        return low_rank(dims.d_model, self.d_head, self.n_heads * self.d_head, bias=dims.bias)

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        """x: (b, t, d_model) -> sigmoid(``gate`` x) (b, h, t, d_head), this rank's heads."""
        return torch.sigmoid(rearrange(self.gate(x), "b t (h d) -> b h t d", d=self.d_head))

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """x: (b, t, d_model) -> log a (b, h, t, d_key) = -exp(a_log) softplus(decay x + dt), <= 0, in at least
        float32 (put in (b, h, t, d_key) order, contiguous, before the softplus, as Gated DeltaNet's)."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        logits = rearrange(self.decay(x).to(dtype), "b t (h k) -> b h t k", k=self.d_key).contiguous()
        step = F.softplus(logits + rearrange(local(self.dt).to(dtype), "(h k) -> h 1 k", k=self.d_key))
        return -rearrange(torch.exp(local(self.a_log).to(dtype)), "h -> h 1 1") * step

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        """Gated DeltaNet's, the low-rank projections' first matrices (``decay.0``, ``gate.0``) run whole on every
        rank and their second (``decay.1``, ``gate.1``) column-wise (rows in value-head order); ``dt``'s channels
        split with their heads."""
        plan = super().tp_plan(sequence_parallel)
        del plan["decay"], plan["gate"]
        for name in ("decay", "gate"):
            plan[f"{name}.0"], plan[f"{name}.1"] = tp.Replicated(), tp.ColwiseParallel()
        return plan

    def mixing_flops(self, seq_len: int) -> int:
        """Gated DeltaNet's count (:meth:`GatedDeltaNet.mixing_flops`) and, for each of K K^T and Q K^T, the decay's
        weights per key channel: per head and token s x d_key multiply-adds inside its sub-chunk of s = gcd(chunk,
        16) tokens and chunk / s x d_key to lift it to each earlier sub-chunk's last token. x 2 FLOPs, x 3."""
        chunk = min(self.chunk, seq_len)
        sub = math.gcd(chunk, SUB)
        return super().mixing_flops(seq_len) + 6 * self.n_heads * 2 * self.d_key * (sub + chunk // sub)
