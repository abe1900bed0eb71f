"""The fast byte-level BPE encoder gives the tokenizers library's ids, on every kind of text."""

from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, normalizers, pre_tokenizers

from zoo.lab.data import bytebpe
from zoo.lab.data.bytebpe import ByteBPEEncoder, fast_encoder
from zoo.lab.data.prepare import LibraryEncoder, encode_all, encoder_of, load_tokenizer

# Whitespace of every kind (ASCII, the separators \x1c-\x1f that Python calls space and Unicode
# does not, no-break, ogham, en, hair, narrow, math and ideographic spaces, line and paragraph
# separators), characters whose UTF-8 shares a whitespace's first bytes (… Å ‰ 、 ᚁ and the
# zero-width space, which is not whitespace), contractions, digits, scripts, emoji, combining marks.
ALPHABET = [*" \t\n\r\v\f", "  ", "\n    ", "\x1c", "\x1f", "\xa0", "\u3000", "\u2028", "\u2029", "\x85", "\u1680",
            "\u2000", "\u200a", "\u202f", "\u205f", "…", "Å", "‰", "、", "ᚁ", "\u200b", *"aZq'srvemld", "'s", "'ll",
            "'re", *"0123456789", "²", "Ⅻ", *"()[]{}.,:;=+-*/#\"_!?", "é", "ß", "漢字", "🦒", "\u0301",
            "\u0915\u093c", "\x00", "\x7f"]  # fmt: skip
CODE = "def f(x):\n    return x * 2  # it's 2\n\nclass A:\n    pass\n" * 20


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    rng = random.Random(0)
    docs = [CODE, *(random_text(rng, 300) for _ in range(300))]
    return load_tokenizer("bpe", 3000, docs)  # merges across the alphabet's items: a wrong split shows


def library_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def test_the_ids_are_the_librarys_on_random_text_of_every_kind(tokenizer):
    rng = random.Random(1)
    encoder = fast_encoder(tokenizer)
    assert encoder is not None
    for _ in range(150):
        text = random_text(rng, rng.randrange(1, 200))
        assert encoder.encode(text) == library_ids(tokenizer, text), repr(text)


def test_documents_are_encoded_apart_and_the_caches_change_nothing(tokenizer):
    rng = random.Random(2)
    docs = [random_text(rng, 300) for _ in range(30)] + [CODE]
    expected = [i for doc in docs for i in library_ids(tokenizer, doc)]
    warm = ByteBPEEncoder(tokenizer)
    halves = [warm.encode_all(docs[:15]), warm.encode_all(docs[15:]), warm.encode_all(docs)]
    assert np.concatenate(halves[:2]).tolist() == expected  # the second call starts from full caches
    assert halves[2].tolist() == expected
    assert ByteBPEEncoder(tokenizer).encode_all(docs).tolist() == expected
    assert ByteBPEEncoder(tokenizer).encode_all([]).tolist() == []


def test_splitting_at_pythons_whitespace_instead_of_unicodes_would_change_the_ids(tokenizer, monkeypatch):
    text = "x\x1c  y!\x1f\n"  # \x1c and \x1f are whitespace to Python's \s, not to the library
    assert fast_encoder(tokenizer).encode(text) == library_ids(tokenizer, text)
    classes = bytebpe.BYTE_CLASSES.copy()
    classes[0x1C:0x20] = bytebpe.SPACE
    monkeypatch.setattr(bytebpe, "BYTE_CLASSES", classes)
    assert fast_encoder(tokenizer).encode(text) != library_ids(tokenizer, text)


@pytest.mark.parametrize("collide", ["everything", "same length"])
def test_segments_whose_hashes_collide_are_told_apart_by_their_bytes(tokenizer, monkeypatch, collide):
    rng = random.Random(4)
    docs = [random_text(rng, 200) for _ in range(10)] + [CODE]
    if collide == "everything":
        monkeypatch.setattr(bytebpe, "segment_hashes", lambda text, starts, lengths: np.zeros(len(starts), np.uint64))
    else:
        monkeypatch.setattr(bytebpe, "segment_hashes", lambda text, starts, lengths: lengths.astype(np.uint64))
    expected = [i for doc in docs for i in library_ids(tokenizer, doc)]
    assert ByteBPEEncoder(tokenizer).encode_all(docs).tolist() == expected


def test_ranges_are_each_start_counted_up_to_its_length():
    starts, lengths = np.array([5, 0, 9, 2]), np.array([3, 0, 1, 2])
    assert bytebpe.ranges(starts, lengths).tolist() == [5, 6, 7, 9, 2, 3]
    assert bytebpe.ranges(starts[:0], lengths[:0]).tolist() == []


def test_tokenizers_it_does_not_cover_are_left_to_the_library(tokenizer):
    assert isinstance(encoder_of(tokenizer), ByteBPEEncoder)
    assert isinstance(encoder_of(None), LibraryEncoder)  # bytes
    variants = []
    for change in ("normalizer", "added", "pre_tokenizer", "prefix"):
        other = Tokenizer.from_str(tokenizer.to_str())
        if change == "normalizer":
            other.normalizer = normalizers.Lowercase()
        elif change == "added":
            other.add_tokens(["<|end|>"])
        elif change == "pre_tokenizer":
            other.pre_tokenizer = pre_tokenizers.Whitespace()
        else:
            other.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        variants.append(other)
        assert fast_encoder(other) is None, change
    text = "Hello World<|end|> it's  Done\n"
    for other in variants:
        assert encode_all(other, [text, text], workers=1).tolist() == library_ids(other, text) * 2


def test_workers_give_the_same_ids_as_one_process(tokenizer):
    rng = random.Random(3)
    docs = [random_text(rng, 200) for _ in range(12)] + [CODE] * 3
    one = encode_all(tokenizer, docs, workers=1, dtype="uint16")
    assert one.dtype == np.uint16
    assert encode_all(tokenizer, docs, workers=2, dtype="uint16").tolist() == one.tolist()
    assert one.tolist() == [i for doc in docs for i in library_ids(tokenizer, doc)]


def test_a_long_document_is_encoded_in_parts_cut_where_segments_start(tokenizer):
    rng = random.Random(5)
    doc = "".join(random_text(rng, 3000) + CODE for _ in range(3))
    parts = bytebpe.document_parts(doc.encode(), size=2000)
    assert len(parts) > 3 and b"".join(parts) == doc.encode()
    encoder = ByteBPEEncoder(tokenizer)
    assert [i for p in parts for i in encoder.encode(p.decode())] == library_ids(tokenizer, doc)
    assert bytebpe.document_parts(b"a" * 20000, size=2000) == [b"a" * 20000]  # nowhere to cut
