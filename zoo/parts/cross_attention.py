"""Cross-attention: queries from the decoder block, keys and values from the encoder's memory.

No causal mask (every decoder position may read the whole source) and no position part (decoder
and source positions are unrelated); a padding mask on memory, True at real source tokens.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.core.dims import BlockDims
from zoo.core.reshape import rearrange
from zoo.parts.kernels import Backend, additive, attend
from zoo.parts.state import LayerState


class CrossAttention(nn.Module):
    """Multi-head attention from the block's stream (queries) to encoder memory (keys and values).

    Parameters (a stable API): ``q`` (n_heads*d_head rows, head by head), ``kv`` (fused, grouped by
    key/value head like self-attention's ``qkv``: for each of the n_kv_heads heads, its d_head key
    rows, then its d_head value rows) and ``out``. ``n_kv_heads`` and ``backend`` follow the block's
    self-attention (validated with it); the kernel is self-attention's :func:`attend`. With a cache,
    memory keys and values are computed on the first call and kept in ``cache.cross``, so decoding
    steps only project their one query.
    """

    def __init__(self, dims: BlockDims, *, n_kv_heads: int | None = None, backend: Backend = "sdpa") -> None:
        super().__init__()
        self.n_heads = dims.n_heads
        self.n_kv_heads = dims.n_heads if n_kv_heads is None else n_kv_heads
        self.d_head = dims.d_head
        #: The softmax's score multiplier; None: 1 / sqrt(d_head) (μP sets sqrt(d_head_base) / d_head).
        self.score_scale: float | None = None
        self.score_features = self.d_head  # what q . k sums over (μP scales by it)
        self.dropout = dims.dropout
        self.backend = backend
        self.d_model = dims.d_model
        self.q = nn.Linear(dims.d_model, self.n_heads * self.d_head, bias=dims.bias)
        self.kv = nn.Linear(dims.d_model, 2 * self.n_kv_heads * self.d_head, bias=dims.bias)
        self.out = nn.Linear(self.n_heads * self.d_head, dims.d_model, bias=dims.bias)

    def mixing_flops(self, seq_len: int) -> int | None:
        """Scores and weighted values over ``seq_len`` memory positions: 6 x seq_len x n_heads x d_head training FLOPs
        per token; None where that is softmax attention's 6 x seq_len x d_model (n_heads d_head = d_model)."""
        width = self.n_heads * self.d_head
        return None if width == self.d_model else 6 * seq_len * width

    def matrix_blocks(self) -> dict[str, dict[str, torch.Tensor]]:
        """``kv``'s rows as the key and the value matrices; ``q`` and ``out`` are one matrix each."""
        rows = torch.arange(self.kv.out_features)
        k, v = rearrange(rows, "(g two d) -> two (g d)", two=2, g=self.n_kv_heads)
        return {"kv.weight": {"k": k, "v": v}}

    def memory_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """memory: (b, s, d_model) -> keys and values, each (b, n_kv_heads, s, d_head)."""
        k, v = rearrange(self.kv(memory), "b s (g two d) -> two b g s d", two=2, g=self.n_kv_heads)
        return k, v

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        *,
        memory_mask: torch.Tensor | None = None,
        cache: LayerState | None = None,
    ) -> torch.Tensor:
        """x: (b, t, d_model), memory: (b, s, d_model) -> (b, t, d_model).

        memory_mask: (b, s) bool, True at real source tokens. cache: once it holds this layer's
        memory keys and values (``cache.cross``, set by the first call), ``memory`` is not read;
        ``cache.reset()`` before decoding for another source.
        """
        if cache is not None and cache.cross is not None:
            k, v = cache.cross
        elif memory is None:
            raise ValueError("cross-attention needs encoder memory (or a cache that already holds its keys)")
        else:
            k, v = self.memory_kv(memory)
            if cache is not None:
                cache.cross = (k, v)
        q = rearrange(self.q(x), "b t (h d) -> b h t d", h=self.n_heads)
        mask = None
        if memory_mask is not None:
            mask = additive(rearrange(memory_mask.bool(), "b s -> b 1 1 s"), None, q.dtype)
        dropout = self.dropout if self.training else 0.0
        y = attend(q, k, v, mask, is_causal=False, backend=self.backend, dropout=dropout, scale=self.score_scale)
        return self.out(rearrange(y, "b h t d -> b t (h d)"))
