"""zoo-prepare checks bytebpe against the tokenizers library on a run's first documents, and encodes
the whole run with the library where they differ."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

pytest.importorskip("tokenizers")
import tokenizers

from zoo.lab.data import bytebpe
from zoo.lab.data import prepare as prepare_module
from zoo.lab.data.prepare import CHECK_CHARS, CHECK_DOCS, check_sample, load_tokenizer, prepare

CODE = "def f(x):\n    return x * 2  # it's 2\n\nclass A:\n    pass\n"
LIBRARY = f"tokenizers {tokenizers.__version__}"


def corpus(folder, first: str = CODE):
    """Files 000.txt ... 019.txt; the first (the run's first document) holds ``first``."""
    folder.mkdir()
    for n in range(20):
        (folder / f"{n:03d}.txt").write_text((first if n == 0 else "") + f"{CODE * (n + 1)} t{n} = {n}\n")
    return folder


def library_ids(folder, split: str) -> list[int]:
    """The tokenizers library's own ids of a prepared split's documents, one after the other."""
    from zoo.lab.data.prepare import read_all, source_files, split_docs

    meta = json.loads((folder / "meta.json").read_text())
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    docs, _ = read_all(source_files([str(folder.parent / "in")], "*.txt"), set(), "text", 1, False)
    part = split_docs(docs, meta["val_fraction"])[split == "val"]
    return [i for doc in part for i in tok.encode(doc, add_special_tokens=False).ids]


def written(folder, split: str) -> list[int]:
    """The ids in a prepared split's shards."""
    meta = json.loads((folder / "meta.json").read_text())
    shards = [np.fromfile(folder / f, dtype=meta["dtype"]) for f in meta["splits"][split]["files"]]
    return np.concatenate(shards).tolist()


@pytest.mark.parametrize("workers", [1, 2])
def test_normal_text_passes_the_check_and_bytebpe_writes_the_librarys_ids(tmp_path, caplog, monkeypatch, workers):
    src, found = corpus(tmp_path / "in"), []
    check = prepare_module.first_difference

    def recorded(tokenizer, encoder, docs):
        found.append((len(docs), check(tokenizer, encoder, docs)))
        return found[-1][1]

    monkeypatch.setattr(prepare_module, "first_difference", recorded)
    with caplog.at_level(logging.WARNING, logger="zoo.lab.data.prepare"):
        meta = prepare([str(src)], tmp_path / "out", tokenizer="bpe", vocab_size=300, val_fraction=0.1,
                       workers=workers, progress=False)  # fmt: skip
    assert found == [(21, None)]  # checked once, on every document: no difference
    assert meta["encoder"].startswith(f"bytebpe (checked against {LIBRARY} on 21 documents, ")  # 20, one split in two
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    for split in ("train", "val"):
        assert written(tmp_path / "out", split) == library_ids(tmp_path / "out", split)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_bytebpe_that_drifts_from_the_library_is_caught_and_the_library_encodes_the_run(
    tmp_path, caplog, monkeypatch, workers
):
    """As if the library's whitespace table changed: bytebpe cuts before \\x1c, the library does not
    (the BPE merges "!" and "\\x1c", frequent in the first document)."""
    src = corpus(tmp_path / "in", first="y!\x1c" * 300 + "\n")
    classes = bytebpe.BYTE_CLASSES.copy()
    classes[0x1C:0x20] = bytebpe.SPACE
    monkeypatch.setattr(bytebpe, "BYTE_CLASSES", classes)  # the forked workers inherit it
    with caplog.at_level(logging.WARNING, logger="zoo.lab.data.prepare"):
        meta = prepare([str(src)], tmp_path / "out", tokenizer="bpe", vocab_size=300, val_fraction=0.1,
                       workers=workers, progress=False)  # fmt: skip
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"bytebpe's ids differ from {LIBRARY}'s at document 0 ('y!\\x1cy!\\x1c" in warnings[0]
    assert "encoding with the library instead" in warnings[0]
    assert meta["encoder"] == f"{LIBRARY} (bytebpe differed at document 0, token 1)"  # y, then !\\x1c
    for split in ("train", "val"):
        assert written(tmp_path / "out", split) == library_ids(tmp_path / "out", split)


def test_meta_names_the_encoder_and_a_folder_prepared_before_the_field_is_not_encoded_again(tmp_path):
    src = corpus(tmp_path / "in")
    assert prepare([str(src)], tmp_path / "bytes", progress=False)["encoder"] == "bytes"
    meta = prepare([str(src)], tmp_path / "out", tokenizer="bpe", vocab_size=300, progress=False)
    assert meta["encoder"].startswith("bytebpe (checked against")
    tok = load_tokenizer(str(tmp_path / "out/tokenizer.json"), 0, [])
    tok.normalizer = tokenizers.normalizers.Lowercase()  # bytebpe does not cover it
    tok.save(str(tmp_path / "lower.json"))
    assert prepare([str(src)], tmp_path / "lower", tokenizer=str(tmp_path / "lower.json"),
                   progress=False)["encoder"] == LIBRARY  # fmt: skip
    older = {k: v for k, v in meta.items() if k != "encoder"}  # as an earlier zoo-prepare wrote it
    (tmp_path / "out/meta.json").write_text(json.dumps(older))
    again = prepare([str(src)], tmp_path / "out", tokenizer="bpe", vocab_size=300, progress=False)
    assert again == older  # up to date: the request is the same, nothing encoded or written


def test_the_check_is_bounded_by_documents_and_characters():
    assert len(check_sample(["ab"] * (CHECK_DOCS + 10))) == CHECK_DOCS
    sample = check_sample(["x" * 1000, "y" * CHECK_CHARS, "z"])
    assert [len(d) for d in sample] == [1000, CHECK_CHARS - 1000]
    assert check_sample([]) == []


class Shifted:
    """An encoder giving the library's ids with the last token of the run dropped (``end=-1``) or one more
    token added after it (``end=+1``): every id they share agrees."""

    def __init__(self, tokenizer, end: int) -> None:
        self.tokenizer, self.end = tokenizer, end

    def encode_all(self, docs):
        ids = [i for doc in docs for i in self.tokenizer.encode(doc, add_special_tokens=False).ids]
        return np.array(ids[:-1] if self.end < 0 else [*ids, 0], dtype=np.int64)


@pytest.mark.parametrize("end", [-1, 1])
def test_an_encoder_that_drops_or_adds_a_token_at_the_end_is_caught_there(monkeypatch, end):
    tok = load_tokenizer("bpe", 300, [CODE * 20])
    docs = [CODE, "x = 1\n", "print(x)\n"]
    assert prepare_module.first_difference(tok, bytebpe.fast_encoder(tok), docs) is None  # the same ids
    last = len(tok.encode(docs[-1], add_special_tokens=False).ids)
    at = last - 1 if end < 0 else last  # the token dropped, or the one past the library's last
    assert prepare_module.first_difference(tok, Shifted(tok, end), docs) == (2, at)
    monkeypatch.setattr(prepare_module, "fast_encoder", lambda tokenizer: Shifted(tokenizer, end))
    said = f"{LIBRARY} (bytebpe differed at document 2, token {at})"
    assert prepare_module.checked_encoder(tok, docs) == (False, said)  # the library encodes the run
