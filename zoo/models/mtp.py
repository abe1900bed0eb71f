"""Multi-token prediction's extra heads (``objective=mtp``, zoo.models.objectives): k depths past the trunk,
each giving the hidden state from which the model's shared LM head predicts one more future token.

Depth j (1..k) at position t predicts token t + j + 1 (the trunk's own head predicts t + 1):

- ``sequential`` (DeepSeek-V3's MTP modules, arXiv:2412.19437 §2.2): ``g_j(t) = block_j(proj_j([norm(c_{j-1}(t));
  norm(embed(x_{t+j}))]))``, ``c_0`` the trunk's final hidden state; it reads tokens up to t + j, never its target.
  What depth j carries to depth j + 1 (``carry``): ``block``, its block's output ``c_j = g_j`` (the paper's
  equations: h_i^k = TRM_k(h'_i^k) is what depth k + 1 reads), or ``normed``, its final-normed state
  ``c_j = final_norm_j(g_j)`` (transformers' and Megatron-LM's MTP layers). The two differ from depth 2 on.
- ``independent`` (Gloeckle et al. 2024, arXiv:2404.19737): ``g_j(t) = block_j(h_t)`` on the trunk's final
  hidden state ``h``; it reads tokens up to t.

Each depth ends with a norm of its own before the shared head. A depth's block is the model's last block
(its spec), causal; depth j runs on the first T - j positions, those whose target lies inside the window.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from zoo.assembly.build import build_block
from zoo.assembly.spec import BlockSpec

HeadsForm = Literal["sequential", "independent"]
Carry = Literal["block", "normed"]


class Depth(nn.Module):
    """One extra head's trunk: for ``sequential``, norms of the previous depth's state and of the given
    token's embedding, concatenated and projected back to d_model (``proj``, no bias); then one block and
    a final norm."""

    def __init__(self, spec: BlockSpec, sequential: bool) -> None:
        super().__init__()
        d = spec.dims.d_model
        if sequential:
            self.norm_h, self.norm_e = spec.make_norm(), spec.make_norm()
            self.proj = nn.Linear(2 * d, d, bias=False)
        self.block = build_block(spec, context="model")
        self.final_norm = spec.make_norm()

    def forward(self, h: torch.Tensor, given: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """h: (b, n, d) the state it reads; given: (b, n, d) the embeddings of the tokens it is given (sequential).
        Returns the block's output (what the next sequential depth reads) and its final-normed state."""
        if given is not None:
            h = self.proj(torch.cat([self.norm_h(h), self.norm_e(given)], dim=-1))
        out = self.block(h)
        return out, self.final_norm(out)


class FutureHeads(nn.Module):
    """k depths (``depths.{j-1}``) predicting tokens t + 2 .. t + k + 1 in the ``heads`` form; a sequential depth
    hands the next its block's output (``carry: block``) or its final-normed state (``normed``)."""

    def __init__(self, spec: BlockSpec, k: int, heads: HeadsForm, carry: Carry = "block") -> None:
        super().__init__()
        self.heads, self.carry = heads, carry
        self.depths = nn.ModuleList(Depth(spec, heads == "sequential") for _ in range(k))

    def extra_repr(self) -> str:
        carry = f", carry={self.carry}" if self.heads == "sequential" and self.carry != "block" else ""
        return f"k={len(self.depths)}, heads={self.heads}{carry}"

    def forward(self, h: torch.Tensor, ids: torch.Tensor, embed: nn.Embedding) -> list[torch.Tensor]:
        """h: (b, T, d) the trunk's final hidden state; ids: (b, T) its tokens. Depth j's final-normed states
        (b, T - j, d), j = 1..k: position t's predicts token t + j + 1."""
        states, previous = [], h
        for j, depth in enumerate(self.depths, 1):
            n = ids.shape[1] - j
            if self.heads == "sequential":
                out, state = depth(previous[:, :n], embed(ids[:, j:]))  # position t is given token t + j
                previous = state if self.carry == "normed" else out
            else:
                _, state = depth(h[:, :n])
            states.append(state)
        return states


__all__ = ["Carry", "Depth", "FutureHeads", "HeadsForm"]
