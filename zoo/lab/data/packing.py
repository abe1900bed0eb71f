"""How documents become training windows (``task.packing``), and the document ids a window's tokens carry
(``task.doc_mask``).

Every document starts with a BOS token. ``concat``: the documents as one stream, windows cut from it at random
offsets (a window may start and end inside a document). ``bos_aligned`` (modded-nanogpt's BOS-aligned batches):
each window starts at a random document's BOS and runs on through the documents after it; the window is cropped
at its length, and what is left of its last document is dropped, not carried into another window.
``best_fit`` (nanochat's best-fit packing): each window is filled from a pool of documents drawn at random, the
longest one that fits the space left first; when none fits, the shortest is cropped to fill the window and its
rest dropped. Both keep every document's tokens in order from its BOS, never continue a document in another
window, and fill every window.
"""

from __future__ import annotations

import torch

from zoo.core.errors import ConfigError

#: ``task.packing``'s values.
PACKINGS = ("concat", "bos_aligned", "best_fit")
#: The documents best_fit chooses from at a time (nanochat's buffer of documents).
POOL = 64


def check_packing(value: object) -> str:
    """``task.packing`` checked: one of :data:`PACKINGS` (a ConfigError naming the key otherwise)."""
    if value not in PACKINGS:
        raise ConfigError("task.packing", value, f"one of {', '.join(PACKINGS)}")
    return str(value)


def split_documents(stream: torch.Tensor, bos: int) -> list[torch.Tensor]:
    """The documents of a 1-D token stream, each from a BOS token to the next one (tokens before the first
    BOS are no document's and left out)."""
    starts = (stream == bos).nonzero().flatten().tolist()
    ends = [*starts[1:], len(stream)]
    return [stream[a:b] for a, b in zip(starts, ends, strict=True)]


def document_ids(inputs: torch.Tensor, bos: int) -> torch.Tensor:
    """(b, t) token ids -> (b, t) document ids: the BOS tokens counted up to each token (what the model's
    ``doc_ids`` reads: a window's tokens before its first BOS are one document, each BOS starts the next)."""
    return (inputs == bos).long().cumsum(dim=1)


def bos_aligned(documents: list[torch.Tensor], length: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` windows of ``length`` tokens (count, length): each starts at a random document's first token and
    runs on through the documents after it (after the last, the first), cropped at ``length``."""
    rows = []
    for first in torch.randint(0, len(documents), (count,), generator=generator).tolist():
        parts, filled, i = [], 0, first
        while filled < length:
            parts.append(documents[i % len(documents)][: length - filled])
            filled += len(parts[-1])
            i += 1
        rows.append(torch.cat(parts))
    return torch.stack(rows)


def best_fit(documents: list[torch.Tensor], length: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` windows of ``length`` tokens (count, length), each filled from a pool of :data:`POOL` documents
    drawn at random: the longest that fits the space left, until none does; then the shortest, cropped to fill
    the window. Every document used is replaced in the pool by a fresh draw."""

    def draw() -> torch.Tensor:
        return documents[int(torch.randint(0, len(documents), (1,), generator=generator))]

    pool = [draw() for _ in range(min(POOL, len(documents)))]
    rows = []
    for _ in range(count):
        parts, left = [], length
        while left > 0:
            fits = [i for i, doc in enumerate(pool) if len(doc) <= left]
            pick = max(fits, key=lambda i: len(pool[i])) if fits else min(range(len(pool)), key=lambda i: len(pool[i]))
            parts.append(pool[pick][:left])
            left -= len(parts[-1])
            pool[pick] = draw()
        rows.append(torch.cat(parts))
    return torch.stack(rows)


__all__ = ["PACKINGS", "POOL", "best_fit", "bos_aligned", "check_packing", "document_ids", "split_documents"]
