"""Causal self-attention from projections and tensor ops: MHA, GQA and MQA in one class.

Mask convention, everywhere in zoo: a boolean mask is True where attention is *allowed*
(SDPA's convention; ``nn.MultiheadAttention`` uses the opposite). Key position > query position
is blocked in causal attention.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

from zoo.dims import BlockDims
from zoo.errors import ConfigError
from zoo.parts.positions import Position
from zoo.registry import ATTENTIONS, NORMS

Backend = Literal["sdpa", "math"]


class KVCache:
    """Keys and values of one attention layer, each (batch, n_kv_heads, time, d_head).

    Keys are stored after rotation, so a cached key never needs its position again.
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new (b, g, t_new, d) keys and values; return all of them."""
        if self.k is None or self.v is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat([self.k, k], dim=-2)
            self.v = torch.cat([self.v, v], dim=-2)
        return self.k, self.v


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
    if causal and not (len(q_positions) == 1 and int(q_positions[0]) >= int(k_positions[-1])):
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


@ATTENTIONS.register(
    "mha",
    summary="Multi-head attention: one key/value head per query head (n_kv_heads = n_heads)",
    formula="softmax(q k^T / sqrt(d_head) + mask) v per head; out(concat heads)",
    reference="Vaswani et al. 2017, Attention Is All You Need, arXiv:1706.03762",
    # Tiny values, so the contract suite's 6-token sequences exercise them.
    variants={
        "window": {"window": 3},
        "softcap": {"softcap": 2.0, "backend": "math"},
        "qknorm": {"qk_norm": "rmsnorm"},
    },
    n_kv_heads=None,
)
class Attention(nn.Module):
    """Multi-head causal self-attention with ``n_kv_heads`` key/value heads shared by groups of queries.

    Parameters (a stable API): ``qkv`` (fused q, k, v projection; rows: n_heads*d_head query rows,
    then n_kv_heads*d_head key rows, then n_kv_heads*d_head value rows) and ``out``.
    Query head h uses key/value head h // (n_heads // n_kv_heads).

    Backends: ``sdpa`` (torch's fused scaled_dot_product_attention) and ``math`` (explicit scores,
    mask, float32 softmax, weights @ v).

    Options: ``qk_norm`` (a registered norm applied to each head's queries and keys before the
    position part; parameters ``q_norm``, ``k_norm``), ``window`` (sliding-window attention: each query
    sees at most ``window`` keys, itself included; a float mask keeps SDPA on its fused kernels) and
    ``softcap`` (scores become softcap * tanh(scores / softcap); math backend only).
    """

    @classmethod
    def check(
        cls,
        dims: BlockDims,
        *,
        n_kv_heads: int | None = None,
        backend: Backend = "sdpa",
        qk_norm: str = "none",
        window: int | None = None,
        softcap: float | None = None,
    ) -> None:
        kv = dims.n_heads if n_kv_heads is None else n_kv_heads
        if kv < 1 or dims.n_heads % kv:
            divisors = [d for d in range(1, dims.n_heads + 1) if dims.n_heads % d == 0]
            raise ConfigError(
                "block.attn.n_kv_heads",
                n_kv_heads,
                f"must divide n_heads={dims.n_heads}: one of {divisors} (or null for n_heads)",
            )
        if qk_norm != "none" and qk_norm not in NORMS:
            raise ConfigError("block.attn.qk_norm", qk_norm, f"none or a registered norm: {', '.join(NORMS.names())}")
        if window is not None and window < 1:
            raise ConfigError("block.attn.window", window, "must be a positive integer, or null for no window")
        if window is not None and dims.max_len is not None and window >= dims.max_len:
            raise ConfigError(
                "block.attn.window",
                window,
                f"must be smaller than block.max_len={dims.max_len} (a window over the whole context is no window)",
            )
        if softcap is not None and not softcap > 0:
            raise ConfigError("block.attn.softcap", softcap, "must be > 0, or null for no cap")
        if softcap is not None and backend != "math":
            raise ConfigError(
                "block.attn.softcap", softcap, "needs block.attn.backend=math (SDPA has no hook to cap the scores)"
            )

    def __init__(
        self,
        dims: BlockDims,
        position: Position,
        *,
        n_kv_heads: int | None = None,
        backend: Backend = "sdpa",
        qk_norm: str = "none",
        window: int | None = None,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        self.check(dims, n_kv_heads=n_kv_heads, backend=backend, qk_norm=qk_norm, window=window, softcap=softcap)
        self.n_heads = dims.n_heads
        self.n_kv_heads = dims.n_heads if n_kv_heads is None else n_kv_heads
        self.d_head = dims.d_head
        self.causal = dims.causal
        self.dropout = dims.dropout
        self.backend = backend
        self.position = position
        width = (self.n_heads + 2 * self.n_kv_heads) * self.d_head
        self.qkv = nn.Linear(dims.d_model, width, bias=dims.bias)
        self.out = nn.Linear(self.n_heads * self.d_head, dims.d_model, bias=dims.bias)
        self.window, self.softcap = window, softcap
        self.q_norm = self.k_norm = None
        if qk_norm != "none":  # per head: a norm over d_head features
            norm, head_dims = NORMS.get(qk_norm), replace(dims, d_model=self.d_head)
            self.q_norm, self.k_norm = norm.cls(head_dims, **norm.defaults), norm.cls(head_dims, **norm.defaults)

    def forward(
        self,
        x: torch.Tensor,
        *,
        key_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """x: (b, t, d_model) -> (b, t, d_model).

        key_mask: (b, t_k) bool, True at real keys (t_k counts cached keys too).
        cache: keys and values of earlier positions; the new ones are appended to it.
        """
        offset = cache.length if cache is not None else 0
        positions = torch.arange(offset, offset + x.shape[1], device=x.device)

        q, k, v = self.qkv(x).split(
            [self.n_heads * self.d_head, self.n_kv_heads * self.d_head, self.n_kv_heads * self.d_head], dim=-1
        )
        q = rearrange(q, "b t (h d) -> b h t d", h=self.n_heads)
        k = rearrange(k, "b t (g d) -> b g t d", g=self.n_kv_heads)
        v = rearrange(v, "b t (g d) -> b g t d", g=self.n_kv_heads)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.position.rotate(q, k, positions)
        if cache is not None:
            k, v = cache.append(k, v)
        k_positions = torch.arange(k.shape[-2], device=x.device)

        mask = allowed_mask(positions, k_positions, self.causal, key_mask, self.window)
        bias = self.position.score_bias(positions, k_positions)
        plain_causal = self.causal and key_mask is None and bias is None and offset == 0 and self.window is None
        attend = self._sdpa if self.backend == "sdpa" else self._math
        y = attend(q, k, v, None if plain_causal else additive(mask, bias, q.dtype), plain_causal)
        return self.out(rearrange(y, "b h t d -> b t (h d)"))

    def _sdpa(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool
    ) -> torch.Tensor:
        # Never both attn_mask and is_causal: CPU would silently apply both.
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,  # SDPA drops even in eval() otherwise
            is_causal=is_causal,
            enable_gqa=self.n_kv_heads != self.n_heads,
        )

    def _math(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool
    ) -> torch.Tensor:
        group = self.n_heads // self.n_kv_heads
        k = repeat(k, "b g t d -> b (g r) t d", r=group)  # grouped: query head h reads kv head h // group
        v = repeat(v, "b g t d -> b (g r) t d", r=group)
        # Scores in at least float32 (the promoted type: float64 stays float64).
        dtype = torch.promote_types(q.dtype, torch.float32)
        scores = torch.einsum("bhqd,bhkd->bhqk", q.to(dtype), k.to(dtype)) / math.sqrt(self.d_head)
        if self.softcap is not None:
            scores = self.softcap * torch.tanh(scores / self.softcap)
        if is_causal:
            t_q, t_k = scores.shape[-2:]
            mask = additive(torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).tril(), None, dtype)
        if mask is not None:
            scores = scores + mask.to(dtype)
        weights = torch.softmax(scores, dim=-1)  # over keys
        weights = F.dropout(weights, self.dropout, self.training)
        return torch.einsum("bhqk,bhkd->bhqd", weights.to(v.dtype), v)


ATTENTIONS.register(
    "gqa",
    summary="Grouped-query attention: groups of query heads share a key/value head (default 2)",
    formula="as mha, query head h reads kv head h // (n_heads / n_kv_heads)",
    reference="Ainslie et al. 2023, GQA, arXiv:2305.13245",
    n_kv_heads=2,
)(Attention)
ATTENTIONS.register(
    "mqa",
    summary="Multi-query attention: every query head shares one key/value head",
    formula="as mha with n_kv_heads = 1",
    reference="Shazeer 2019, Fast Transformer Decoding, arXiv:1911.02150",
    n_kv_heads=1,
)(Attention)
