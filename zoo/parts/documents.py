"""Documents packed into one sequence (``task.doc_mask``): which document each token belongs to, and the
masks every mixer derives from it so that no token reads another document.

A model is given ``doc_ids`` (b, t_k), one id per token, cached tokens included (the span of a key mask);
two tokens are in the same document when their ids are equal, and a document is a run of equal ids. The new
tokens of a call are the last t of those t_k. Each mixer states how it keeps documents apart (its
``doc_reset`` hook, zoo.core.interface) and receives a :class:`Documents` in its forward:

- softmax attention: the block-diagonal mask :meth:`Documents.same` (combined with causality, windows, padding);
- a linear mixer (linear attention, Gated DeltaNet): its state reset at each document's first token: in the
  recurrent form the decay before that token is 0 (:meth:`Documents.fresh`), in the chunked form every
  product of decays that spans a boundary is cut (:func:`chunk_cuts`);
- a short convolution (canon layers, Gated DeltaNet's): taps that reach into another document read zeros
  (:meth:`Documents.taps`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from zoo.core.reshape import rearrange


class Documents:
    """The document id of every token, ``ids`` (b, t_k) (cached tokens first, the call's new tokens last)."""

    def __init__(self, ids: torch.Tensor) -> None:
        if ids.ndim != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ValueError(f"document ids: an integer tensor (batch, tokens), got {ids.dtype} {tuple(ids.shape)}")
        self.ids = ids

    def at(self, slots: torch.Tensor) -> torch.Tensor:
        """The documents of the tokens at ``slots`` (t,) -> (b, t)."""
        return self.ids.index_select(1, slots)

    def segments(self, slots: torch.Tensor) -> torch.Tensor:
        """(b, 1 + t): the document of the token before the first of ``slots`` (the first's own at slot 0),
        then those of the tokens at ``slots``."""
        before = self.ids.index_select(1, (slots[:1] - 1).clamp(min=0))
        return torch.cat([before, self.at(slots)], dim=1)

    def fresh(self, slots: torch.Tensor) -> torch.Tensor:
        """(b, t) bool: True where the token at a slot starts a document (its previous token is another's)."""
        seg = self.segments(slots)
        return seg[:, 1:] != seg[:, :-1]

    def same(self, slots: torch.Tensor, keys: int) -> torch.Tensor:
        """(b, 1, t, keys) bool: whether the query at each slot and each of the first ``keys`` tokens share a
        document (the block-diagonal mask)."""
        if keys != self.ids.shape[1]:
            raise ValueError(f"document ids cover {self.ids.shape[1]} tokens, the attention reads {keys} keys")
        return rearrange(self.at(slots), "b q -> b 1 q 1") == rearrange(self.ids, "b k -> b 1 1 k")

    def taps(self, slots: torch.Tensor, width: int) -> torch.Tensor:
        """(b, t, width) bool: whether tap j of a causal convolution of ``width`` taps at each slot (the token
        width - 1 - j back) lies in the query's document (taps before the first token read zeros anyway)."""
        back = slots[:, None] - torch.arange(width - 1, -1, -1, device=slots.device)  # (t, width)
        ids = self.ids.index_select(1, back.clamp(min=0).flatten()).view(self.ids.shape[0], *back.shape)
        return ids == self.at(slots)[..., None]

    def positions(self, slots: torch.Tensor) -> torch.Tensor:
        """(b, t): each token's position inside its document (0 at its first token): what rotary, learned and
        ALiBi positions read, so that a document packed after others is positioned as it is alone."""
        index = torch.arange(self.ids.shape[1], device=self.ids.device)
        starts = F.pad(self.ids[:, 1:] != self.ids[:, :-1], (1, 0), value=True)
        first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values  # each token's start
        return (index - first).index_select(1, slots)


class Cuts(NamedTuple):
    """Which decay products of a chunked linear mixer stay within one document, per chunk of c tokens
    (a heads axis of 1 before the chunk axis n, so they broadcast over heads)."""

    #: (b, 1, n, c, c): query i and key j of a chunk in one document.
    within: torch.Tensor
    #: (b, 1, n, c): the query reads the state entering the chunk (same document as the token before it).
    entered: torch.Tensor
    #: (b, 1, n, c): the key reaches the state leaving the chunk (same document as the chunk's last token).
    kept: torch.Tensor
    #: (b, 1, n): the state entering the chunk reaches its end.
    through: torch.Tensor

    def cut(
        self, within: torch.Tensor, to_end: torch.Tensor, through: torch.Tensor, entry: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A chunked form's decay products (b, h, n, c, c), (b, h, n, c), (b, h, n), (b, h, n, c): within a
        chunk, from each key to the chunk's end, through the chunk, from its start to each query; each zeroed
        where it spans a document boundary."""
        return within * self.within, to_end * self.kept, through * self.through, entry * self.entered


def chunk_cuts(segments: torch.Tensor, chunk: int) -> Cuts:
    """The :class:`Cuts` of ``segments`` (b, 1 + t) (:meth:`Documents.segments`) in chunks of ``chunk``; the
    tokens padded to a whole chunk count as the last document's."""
    tokens = segments[:, 1:]
    pad = -tokens.shape[1] % chunk
    if pad:
        tokens = torch.cat([tokens, tokens[:, -1:].expand(-1, pad)], dim=1)
    tokens = rearrange(tokens, "b (n c) -> b 1 n c", c=chunk)
    before = torch.cat([segments[:, None, :1], tokens[:, :, :-1, -1]], dim=2)  # (b, 1, n): the token before each
    return Cuts(
        within=tokens[..., :, None] == tokens[..., None, :],
        entered=tokens == before[..., None],
        kept=tokens == tokens[..., -1:],
        through=tokens[..., -1] == before,
    )


__all__ = ["Cuts", "Documents", "chunk_cuts"]
