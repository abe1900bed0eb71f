"""A fast encoder for GPT-2-style byte-level BPE tokenizers, giving the ids the ``tokenizers`` library does.

``zoo-prepare`` spends nearly all its time in the tokenizer's pre-tokenizing regex (about 2 MB/s
on one core). Source code and prose repeat themselves: split at every place where whitespace
follows a non-whitespace character, and the same stretches ("\\n        return self") come back
again and again. Each distinct stretch is encoded once; its ids are kept in one flat array, and a
document's ids are gathered from it by numpy (no Python work per token).

Why the ids are the library's: the GPT-2 pattern
``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`` never matches
a non-whitespace character followed by whitespace, so such a place always ends one piece and
starts the next, and the pieces after it depend only on the text after it (the one lookahead
reads forward, and a stretch cut there ends in non-whitespace, so it cannot change how a stretch
ends). ASCII stretches, where the pattern's classes are plain ASCII sets, are split into pieces by
the same pattern in :mod:`re`, all new ones in one pass; the others by the library's own
pre-tokenizer. Each distinct piece goes through the library's BPE model once.

:func:`fast_encoder` returns None for a tokenizer this reasoning does not cover (a normalizer,
added tokens, another pre-tokenizer): those are encoded by the library itself.
"""

from __future__ import annotations

import gc
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

#: Unicode's White_Space characters: the ``\\s`` of the tokenizers library's regex engine.
WHITESPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
#: Stretches: optional whitespace, then non-whitespace (or trailing whitespace alone).
STRETCH = re.compile(f"[{WHITESPACE}]*[^{WHITESPACE}]+|[{WHITESPACE}]+")
#: Joins new ASCII stretches for one regex pass (a private-use character: never in ASCII text).
SEPARATOR = "\ue000"
#: The GPT-2 pattern on ASCII text, where \\p{L} is [A-Za-z], \\p{N} is [0-9] and \\s is tab to
#: carriage return and space. :data:`SEPARATOR` is a piece of its own, and the lookahead reads it
#: as the end of the text, so each stretch splits as it would alone.
ASCII_PIECE = re.compile(
    "\ue000|'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^A-Za-z0-9\t-\r \ue000]+"
    "|[\t-\r ]+(?![^\t-\r \ue000])|[\t-\r ]+"
)


def byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the ByteLevel pre-tokenizer's alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return chars


#: str.translate table taking ASCII text to its byte-level characters.
ASCII_TO_BYTE_CHARS = {b: c for b, c in byte_chars().items() if b < 128}


def covered(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` is a plain byte-level BPE: no normalizer, no added tokens, the
    ByteLevel pre-tokenizer with its GPT-2 regex and no prefix space, a BPE model without dropout."""
    spec = json.loads(tokenizer.to_str())
    pre, model = spec.get("pre_tokenizer") or {}, spec.get("model") or {}
    return (
        spec.get("normalizer") is None
        and not spec.get("added_tokens")
        and pre.get("type") == "ByteLevel"
        and pre.get("use_regex", True)
        and not pre.get("add_prefix_space", False)
        and model.get("type") == "BPE"
        and model.get("dropout") is None
    )


class Spans:
    """The token ids of many strings, one after the other in one flat int32 array, found by string."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.flat = np.zeros(0, dtype=np.int32)  # (n_ids,)
        self.start = np.zeros(0, dtype=np.int64)  # (n_keys,) where each key's ids begin in flat
        self.length = np.zeros(0, dtype=np.int64)  # (n_keys,)

    def add(self, keys: Sequence[str], ids: np.ndarray, lengths: np.ndarray) -> None:
        """Add new ``keys`` whose ids, one key after the other, are ``ids`` (``lengths`` each)."""
        first = len(self.start)
        self.index.update(zip(keys, range(first, first + len(keys)), strict=True))
        self.start = np.concatenate([self.start, len(self.flat) + np.cumsum(lengths) - lengths])
        self.length = np.concatenate([self.length, lengths])
        self.flat = np.concatenate([self.flat, ids.astype(np.int32)])

    def lookup(self, keys: Sequence[str]) -> np.ndarray:
        """The indices of known ``keys``: (n,)."""
        return np.array(list(map(self.index.__getitem__, keys)), dtype=np.int64)  # faster than fromiter

    def gather(self, indices: np.ndarray) -> np.ndarray:
        """The ids of the keys at ``indices``, one after the other."""
        lengths, starts = self.length[indices], self.start[indices]  # (n,)
        begins = np.cumsum(lengths) - lengths  # (n,) where each key's ids begin in the output
        return self.flat[np.arange(lengths.sum()) + np.repeat(starts - begins, lengths)]


class ByteBPEEncoder:
    """Text -> ids of one byte-level BPE ``tokenizers.Tokenizer``, caching stretches and pieces."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.stretches, self.pieces = Spans(), Spans()
        self.pieces.add([SEPARATOR], np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64))  # no ids

    def learn_pieces(self, pieces: Iterable[str], byte_level: bool) -> None:
        """Add the BPE model's ids of the new ones of ``pieces`` (text, or byte-level characters)."""
        new = list(set(pieces).difference(self.pieces.index))
        model = self.tokenizer.model
        ids = [[t.id for t in model.tokenize(p if byte_level else p.translate(ASCII_TO_BYTE_CHARS))] for p in new]
        flat = np.fromiter((i for piece in ids for i in piece), dtype=np.int32)
        self.pieces.add(new, flat, np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)))

    def learn(self, stretches: Sequence[str]) -> None:
        """Add the ids of new ``stretches``: the ASCII ones split by one regex pass over all of them
        (joined by :data:`SEPARATOR`), the others by the library's pre-tokenizer."""
        plain = [s for s in stretches if s.isascii()]
        if plain:
            pieces = ASCII_PIECE.findall(SEPARATOR.join(plain) + SEPARATOR)  # each stretch's, then a separator
            self.learn_pieces(pieces, byte_level=False)
            indices = self.pieces.lookup(pieces)
            ends = indices == 0  # the separator is piece 0
            owner = np.cumsum(ends) - ends  # (n_pieces,) the stretch each piece belongs to
            lengths = np.bincount(owner, weights=self.pieces.length[indices], minlength=len(plain))
            self.stretches.add(plain, self.pieces.gather(indices), lengths.astype(np.int64))
        other = [s for s in stretches if not s.isascii()]
        if other:
            split = [[p for p, _ in self.tokenizer.pre_tokenizer.pre_tokenize_str(s)] for s in other]
            pieces = [p for stretch in split for p in stretch]
            self.learn_pieces(pieces, byte_level=True)
            indices = self.pieces.lookup(pieces)
            owner = np.repeat(np.arange(len(other)), [len(stretch) for stretch in split])  # (n_pieces,)
            lengths = np.bincount(owner, weights=self.pieces.length[indices], minlength=len(other))
            self.stretches.add(other, self.pieces.gather(indices), lengths.astype(np.int64))

    def encode_all(self, docs: Sequence[str]) -> np.ndarray:
        """The ids of ``docs`` one after the other (each document encoded on its own; int64)."""
        stretches = [s for doc in docs for s in STRETCH.findall(doc)]  # (n_stretches,)
        collecting = gc.isenabled()
        gc.disable()  # many small objects: the cyclic collector would rescan the caches again and again
        try:
            self.learn(list(set(stretches).difference(self.stretches.index)))
            indices = self.stretches.lookup(stretches)
        finally:
            if collecting:
                gc.enable()
        return self.stretches.gather(indices).astype(np.int64)

    def encode(self, text: str) -> list[int]:
        return self.encode_all([text]).tolist()


def fast_encoder(tokenizer: Any) -> ByteBPEEncoder | None:
    """A :class:`ByteBPEEncoder` for ``tokenizer``, or None where it would not give the library's ids."""
    return ByteBPEEncoder(tokenizer) if covered(tokenizer) else None
