"""A fast encoder for GPT-2-style byte-level BPE tokenizers, giving the ids the ``tokenizers`` library does.

``zoo-prepare`` spends nearly all its time in the tokenizer's pre-tokenizing regex (about 2 MB/s
on one core). Text repeats itself: cut it where no piece of the pattern can cross, and the same
short segments ("\\n", "        ", " return", "self", ".") come back again and again. The cuts
are found by numpy over the UTF-8 bytes, equal segments by a hash (checked byte for byte), and
each distinct segment is looked up once per batch in a dictionary of the ids of every segment
seen so far; a document's ids are gathered from the flat arrays by numpy (no Python work per
token, and per segment only for the distinct ones).

Why the ids are the library's. The GPT-2 pattern is
``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``; a cut
is safe where every match ends before it and the matches after it depend only on the text after
it (the one lookahead reads forward, so that holds at any place where a match ends). Matches end:

- before whitespace that follows anything else (no match holds non-whitespace then whitespace);
- before the last character of a whitespace run followed by non-whitespace, where that character
  is ASCII: ``\\s+(?!\\S)`` takes the run but its last character, which starts the next match
  (`` ?\\p{L}+`` and the like when it is a space, ``\\s+`` alone otherwise); the run but its last
  character, alone, is one match too, as it ends the text;
- between ASCII letters, digits and other ASCII non-whitespace where a letter or digit run ends,
  or a digit follows the others: no match holds two of these classes, but ``'s`` holds
  punctuation then letters, so punctuation -> letter is no cut;
- at each document's start (each is encoded on its own).

ASCII segments, where the pattern's classes are plain ASCII sets, are split into pieces by the
same pattern in :mod:`re`, all new ones in one pass; the others by the library's own
pre-tokenizer. Each distinct piece goes through the library's BPE model once.

:func:`fast_encoder` returns None for a tokenizer this reasoning does not cover (a normalizer,
added tokens, another pre-tokenizer): those are encoded by the library itself. As the reasoning
holds for the library's pattern and Unicode tables of today, ``zoo-prepare`` checks this encoder
against the library on each run's first documents and falls back on the library where they differ
(:func:`zoo.lab.data.prepare.checked_encoder`).
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
#: Joins new ASCII segments for one regex pass (a private-use character: never in ASCII text).
SEPARATOR = "\ue000"
#: The GPT-2 pattern on ASCII text, where \\p{L} is [A-Za-z], \\p{N} is [0-9] and \\s is tab to
#: carriage return and space. :data:`SEPARATOR` is a piece of its own, and the lookahead reads it
#: as the end of the text, so each segment splits as it would alone.
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


#: Byte classes: what the GPT-2 pattern sees in a byte. OTHER is any byte of a non-ASCII character
#: but WIDE, the bytes of a non-ASCII whitespace character.
OTHER, SPACE, WIDE, LETTER, DIGIT, PUNCT = range(6)
#: Non-ASCII whitespace characters, UTF-8: every one starts with 0xc2, 0xe1, 0xe2 or 0xe3.
WIDE_SPACES = [c.encode() for c in map(chr, range(128, 0x3001)) if re.fullmatch(f"[{WHITESPACE}]", c)]
#: Batches of about this many bytes of text are encoded at once (the arrays of a batch: ~40 bytes a byte).
BATCH_BYTES = 1 << 20
#: The polynomial hash of segments: odd, so every power is odd and none is zero modulo 2**64.
HASH_BASE = np.uint64(0x9E3779B97F4A7C15)


def byte_classes() -> np.ndarray:
    """(256,) the class of each byte value; bytes of non-ASCII characters are OTHER."""
    classes = np.full(256, OTHER, dtype=np.int8)
    classes[:128] = PUNCT  # control characters too: they are [^\\s\\p{L}\\p{N}]
    classes[[*range(9, 14), 32]] = SPACE
    classes[ord("A") : ord("Z") + 1] = classes[ord("a") : ord("z") + 1] = LETTER
    classes[ord("0") : ord("9") + 1] = DIGIT
    return classes


def cut_table() -> np.ndarray:
    """(6, 6) whether a segment starts between a byte of one class and a byte of another: where
    whitespace starts after anything else, and where a letter, digit or punctuation run of ASCII
    meets another of them (no piece of the pattern holds both), but not punctuation -> letter
    (``'s`` is a piece)."""
    table = np.zeros((6, 6), dtype=bool)
    table[[OTHER, LETTER, DIGIT, PUNCT], SPACE] = table[[OTHER, LETTER, DIGIT, PUNCT], WIDE] = True
    table[LETTER, [DIGIT, PUNCT]] = table[DIGIT, [LETTER, PUNCT]] = table[PUNCT, DIGIT] = True
    return table


BYTE_CLASSES, CUTS = byte_classes(), cut_table()


def classify(text: np.ndarray) -> np.ndarray:
    """(n_bytes,) the class of each byte of UTF-8 ``text``, the bytes of non-ASCII whitespace WIDE."""
    classes = BYTE_CLASSES[text]
    if text.max(initial=0) >= 0x80:  # some non-ASCII character
        padded = np.concatenate([text, np.zeros(2, dtype=np.uint8)])
        leads = np.flatnonzero((text >= 0xC2) & (text <= 0xE3))  # where a non-ASCII whitespace can start
        for space in WIDE_SPACES:
            at = leads[np.logical_and.reduce([padded[leads + k] == byte for k, byte in enumerate(space)])]
            for k in range(len(space)):
                classes[at + k] = WIDE
    return classes


def segment_starts(text: np.ndarray, doc_starts: np.ndarray) -> np.ndarray:
    """Where the segments of UTF-8 ``text`` (documents beginning at ``doc_starts``) begin: pieces
    of the pattern never cross these places, and the pieces after one depend only on what follows.
    Besides the table's cuts: before the last whitespace of a run when it is ASCII and non-space
    follows in the document (that character starts a piece: `` ?\\p{L}+`` and the like, or ``\\s+``),
    and at each document's start."""
    classes = classify(text)  # (n,)
    before = np.concatenate([[OTHER], classes[:-1]])  # (n,) the class of the byte before each
    cut = CUTS[before, classes]
    is_space = (classes == SPACE) | (classes == WIDE)
    ends_doc = np.zeros(len(text) + 1, dtype=bool)
    ends_doc[doc_starts] = True  # the byte before a document's start ends the one before
    nonspace_next = np.concatenate([~is_space[1:], [False]]) & ~ends_doc[1:]  # in the same document
    cut |= (classes == SPACE) & ((before == SPACE) | (before == WIDE)) & nonspace_next
    cut[doc_starts[doc_starts < len(text)]] = True
    return np.flatnonzero(cut)


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``starts[i], starts[i] + 1, ..., starts[i] + lengths[i] - 1`` for each i, one range after the
    other: (lengths.sum(),), int32 where it fits (a cumulative sum of steps: no Python loop)."""
    keep = lengths > 0
    starts, lengths = starts[keep], lengths[keep]
    total = int(lengths.sum())
    dtype = np.int32 if max(total, int(starts.max(initial=0)) + 1) < 2**31 else np.int64
    steps = np.ones(total, dtype=dtype)
    if total:
        begins = np.cumsum(lengths) - lengths  # where each range begins in the output
        steps[0] = starts[0]
        steps[begins[1:]] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)  # from the last item of one to the next
    return np.cumsum(steps, dtype=dtype)


def segment_hashes(text: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """(n_segments,) a polynomial hash of each segment's bytes, modulo 2**64."""
    offset = ranges(np.zeros_like(starts), lengths)  # (n_bytes,) each byte's place in its segment
    powers = np.cumprod(np.full(int(lengths.max()), HASH_BASE, dtype=np.uint64))  # wraps modulo 2**64
    return np.add.reduceat((text.astype(np.uint64) + 1) * powers[offset], starts)


def same_hash(hashes: np.ndarray) -> np.ndarray:
    """(n,) for each hash the index of one hash equal to it (the same index for all equal ones):
    through a table of 2n or more slots, and a sort of those whose slot holds another hash."""
    n = len(hashes)
    bits = (2 * n - 1).bit_length()
    slots = (hashes * HASH_BASE) >> np.uint64(64 - bits)  # multiplicative hashing: the top bits
    table = np.empty(1 << bits, dtype=np.int64)
    table[slots] = np.arange(n)  # one of the hashes landing in each slot holds it
    found = table[slots]
    missed = np.flatnonzero(hashes[found] != hashes)  # a different hash holds their slot
    if len(missed):  # every hash equal to a missed one missed too (same slot): its group is complete
        order = missed[np.argsort(hashes[missed])]
        first = np.concatenate([[True], hashes[order[1:]] != hashes[order[:-1]]])
        found[order] = order[first][np.cumsum(first) - 1]
    return found


def distinct_segments(text: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(inverse, representative)``: segment i is the same bytes as segment representative[inverse[i]],
    found by hash and checked byte for byte; where two different segments share a hash, every
    segment is its own (the dictionary of :class:`ByteBPEEncoder` is exact either way)."""
    if not len(starts):
        return starts, starts
    same = same_hash(segment_hashes(text, starts, lengths))  # (n_segments,)
    held = np.zeros(len(starts), dtype=bool)
    held[same] = True
    representative = np.flatnonzero(held)  # (n_distinct,)
    inverse = (np.cumsum(held) - 1)[same]  # (n_segments,)
    if np.array_equal(lengths[same], lengths) and np.array_equal(text[ranges(starts[same], lengths)], text):
        return inverse, representative
    everything = np.arange(len(starts))
    return everything, everything


def document_parts(doc: bytes, size: int = BATCH_BYTES) -> list[bytes]:
    """``doc`` (UTF-8) in parts of about ``size`` bytes, each cut at a segment start, so that
    encoding the parts apart gives the document's ids; a document without such a place in reach
    stays whole. A cut is decided by the bytes around it: a window of 4 KiB is enough to find one."""
    parts, begin, window = [], 0, 4096
    while len(doc) - begin > size + window:
        around = begin + size  # look for the first segment start from here, a window at a time
        while around + window < len(doc):
            starts = segment_starts(np.frombuffer(doc, np.uint8, window, around), np.zeros(1, np.int64))
            inside = starts[(starts >= 4) & (starts < window - 4)]  # whole characters on both sides
            if len(inside):
                break
            around += window - 8
        else:
            break
        parts.append(doc[begin : around + int(inside[0])])
        begin = around + int(inside[0])
    parts.append(doc[begin:])
    return parts


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
    """The token ids of many keys (strings or bytes), one after the other in one flat int32 array."""

    def __init__(self) -> None:
        self.index: dict[str | bytes, int] = {}
        self.flat = np.zeros(0, dtype=np.int32)  # (n_ids,)
        self.start = np.zeros(0, dtype=np.int64)  # (n_keys,) where each key's ids begin in flat
        self.length = np.zeros(0, dtype=np.int64)  # (n_keys,)

    def add(self, keys: Sequence[str | bytes], ids: np.ndarray, lengths: np.ndarray) -> None:
        """Add new ``keys`` whose ids, one key after the other, are ``ids`` (``lengths`` each)."""
        first = len(self.start)
        self.index.update(zip(keys, range(first, first + len(keys)), strict=True))
        self.start = np.concatenate([self.start, len(self.flat) + np.cumsum(lengths) - lengths])
        self.length = np.concatenate([self.length, lengths])
        self.flat = np.concatenate([self.flat, ids.astype(np.int32)])

    def lookup(self, keys: Sequence[str | bytes]) -> np.ndarray:
        """The indices of known ``keys``: (n,)."""
        return np.array(list(map(self.index.__getitem__, keys)), dtype=np.int64)  # faster than fromiter

    def gather(self, indices: np.ndarray) -> np.ndarray:
        """The ids of the keys at ``indices``, one after the other."""
        return self.flat[ranges(self.start[indices], self.length[indices])]


class ByteBPEEncoder:
    """Text -> ids of one byte-level BPE ``tokenizers.Tokenizer``, caching segments and pieces."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.segments, self.pieces = Spans(), Spans()
        self.pieces.add([SEPARATOR], np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64))  # no ids

    def learn_pieces(self, pieces: Iterable[str], byte_level: bool) -> None:
        """Add the BPE model's ids of the new ones of ``pieces`` (text, or byte-level characters)."""
        new = list(set(pieces).difference(self.pieces.index))
        model = self.tokenizer.model
        ids = [[t.id for t in model.tokenize(p if byte_level else p.translate(ASCII_TO_BYTE_CHARS))] for p in new]
        flat = np.fromiter((i for piece in ids for i in piece), dtype=np.int32)
        self.pieces.add(new, flat, np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)))

    def learn(self, segments: Sequence[bytes]) -> None:
        """Add the ids of new ``segments`` (UTF-8): the ASCII ones split by one regex pass over all
        of them (joined by :data:`SEPARATOR`), the others by the library's pre-tokenizer."""
        plain = [s for s in segments if s.isascii()]
        if plain:
            pieces = ASCII_PIECE.findall(SEPARATOR.join(s.decode("ascii") for s in plain) + SEPARATOR)
            ends = np.array([p == SEPARATOR for p in pieces])  # each segment's pieces, then a separator
            self.add_segments(plain, pieces, np.cumsum(ends) - ends, byte_level=False)
        other = [s for s in segments if not s.isascii()]
        if other:
            pre_tokenize = self.tokenizer.pre_tokenizer.pre_tokenize_str
            split = [[p for p, _ in pre_tokenize(s.decode())] for s in other]
            owner = np.repeat(np.arange(len(other)), [len(segment) for segment in split])
            self.add_segments(other, [p for segment in split for p in segment], owner, byte_level=True)

    def add_segments(
        self, segments: Sequence[bytes], pieces: Sequence[str], owner: np.ndarray, byte_level: bool
    ) -> None:
        """Add ``segments`` whose pieces, one segment after the other, are ``pieces``; ``owner``:
        (n_pieces,) the segment each piece belongs to."""
        self.learn_pieces(pieces, byte_level)
        indices = self.pieces.lookup(pieces)  # (n_pieces,)
        lengths = np.bincount(owner, weights=self.pieces.length[indices], minlength=len(segments))
        self.segments.add(segments, self.pieces.gather(indices), lengths.astype(np.int64))

    def encode_all(self, docs: Sequence[str]) -> np.ndarray:
        """The ids of ``docs`` one after the other (each document encoded on its own; int64), in
        batches of about :data:`BATCH_BYTES` of text."""
        encoded = [part for doc in docs for part in document_parts(doc.encode())]
        batches, batch, size = [], [], 0
        for doc in encoded:
            if batch and size + len(doc) > BATCH_BYTES:
                batches.append(batch)
                batch, size = [], 0
            batch.append(doc)
            size += len(doc)
        parts = [self.encode_batch(b) for b in [*batches, batch]]
        return np.concatenate(parts).astype(np.int64)

    def encode_batch(self, docs: Sequence[bytes]) -> np.ndarray:
        """The ids of UTF-8 ``docs`` one after the other: each distinct segment looked up once."""
        data = b"".join(docs)
        text = np.frombuffer(data, dtype=np.uint8)  # (n_bytes,)
        doc_starts = np.cumsum([0, *map(len, docs[:-1])])
        starts = segment_starts(text, doc_starts)  # (n_segments,)
        lengths = np.diff(starts, append=len(text))  # (n_segments,)
        inverse, representative = distinct_segments(text, starts, lengths)
        begin, end = starts[representative], starts[representative] + lengths[representative]  # (n_distinct,)
        keys = [data[b:e] for b, e in zip(begin.tolist(), end.tolist(), strict=True)]
        collecting = gc.isenabled()
        gc.disable()  # many small objects: the cyclic collector would rescan the caches again and again
        try:
            self.learn(list(dict.fromkeys(k for k in keys if k not in self.segments.index)))
            indices = self.segments.lookup(keys)
        finally:
            if collecting:
                gc.enable()
        return self.segments.gather(indices[inverse])

    def encode(self, text: str) -> list[int]:
        return self.encode_all([text]).tolist()


def fast_encoder(tokenizer: Any) -> ByteBPEEncoder | None:
    """A :class:`ByteBPEEncoder` for ``tokenizer``, or None where it would not give the library's ids."""
    return ByteBPEEncoder(tokenizer) if covered(tokenizer) else None
