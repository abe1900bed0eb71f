"""zoo-prepare's reports on inputs it cannot honour: a BPE vocabulary smaller than asked for, and JSONL
strings that are not valid Unicode (lone surrogate escapes)."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from zoo.core.errors import ConfigError
from zoo.lab.commands.prepare import main, split_text
from zoo.lab.data.prepare import prepare

SMALL = "the cat sat on the mat; the dog dug a log. " * 20  # a few hundred merges at most


def test_a_bpe_short_of_its_vocab_size_warns_and_meta_records_both_sizes(tmp_path, caplog, capsys):
    (tmp_path / "in.txt").write_text(SMALL)
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="zoo.lab.data.prepare"):
        code = main([str(tmp_path / "in.txt"), "--out", str(out), "--tokenizer", "bpe", "--vocab-size", "10000000",
                     "--workers", "1"])  # fmt: skip
    assert code == 0
    meta = json.loads((out / "meta.json").read_text())
    reached = meta["vocab_size"]
    assert 256 <= reached < 10_000_000
    assert meta["vocab_size_requested"] == 10_000_000
    assert reached == len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"])  # the model's size
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "--vocab-size 10000000 asked for, but the BPE reached" in warnings[0]
    assert f"reached {reached} tokens" in warnings[0]
    printed = capsys.readouterr().out
    assert f"vocab_size {reached} (of 10000000 asked for" in printed
    caplog.clear()  # a second run finds the folder up to date: the summary still says so
    assert main([str(tmp_path / "in.txt"), "--out", str(out), "--tokenizer", "bpe", "--vocab-size", "10000000",
                 "--workers", "1"]) == 0  # fmt: skip
    assert f"vocab_size {reached} (of 10000000 asked for" in capsys.readouterr().out


def test_a_bpe_that_reaches_its_vocab_size_does_not_warn(tmp_path, caplog):
    (tmp_path / "in.txt").write_text(SMALL)
    with caplog.at_level(logging.WARNING, logger="zoo.lab.data.prepare"):
        meta = prepare([str(tmp_path / "in.txt")], tmp_path / "out", tokenizer="bpe", vocab_size=260, progress=False)
    assert meta["vocab_size"] == meta["vocab_size_requested"] == 260
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_lone_surrogate_in_jsonl_is_an_error_naming_the_file_and_line(tmp_path, capsys, workers):
    src = tmp_path / "d.jsonl"
    src.write_text('{"text": "fine"}\n{"text": "a\\ud800b"}\n{"text": "more"}\n')  # the escape, backslash and all
    code = main([str(src), "--out", str(tmp_path / "out"), "--workers", str(workers)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"zoo-prepare: {src}:2='a\\ud800b': not valid Unicode: a lone surrogate \\ud800" in err
    assert "allowed: any Unicode text" in err
    assert "Traceback" not in err
    with pytest.raises(ConfigError, match=r"d\.jsonl:2=.*lone surrogate \\udc00"):  # a low one alone, bpe
        src.write_text('{"text": "fine"}\n{"id": 1, "text": "\\udc00 x"}\n')
        prepare([str(src)], tmp_path / "o2", tokenizer="bpe", vocab_size=300, workers=workers, progress=False)


def test_surrogate_pairs_and_line_separators_in_jsonl_strings_are_text(tmp_path):
    src = tmp_path / "d.jsonl"  # a pair's escapes are one character; U+2028 and U+0085 may stand in a string raw
    src.write_text('{"text": "\\ud83e\\udd92 a\u2028b\x85c"}\n{"text": "x\\ud800"}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"d\.jsonl:2="):  # line 2 of the file, not of str.splitlines
        prepare([str(src)], tmp_path / "bad", progress=False)
    src.write_text('{"text": "\\ud83e\\udd92 a\u2028b\x85c"}\n', encoding="utf-8")
    prepare([str(src)], tmp_path / "out", val_fraction=0.3, progress=False)
    assert split_text(tmp_path / "out", "train") + split_text(tmp_path / "out", "val") == "🦒 a\u2028b\x85c"


@pytest.mark.parametrize(
    ("options", "missing_library", "error"),
    [
        (["--tokenizer", "bpe"], True, """--tokenizer='bpe': bytes, or install the tokenizers library (the tokens """
         """extra): pip install -e ".[tokens]" in zoo's clone"""),  # fmt: skip
        (["--tokenizer", "bpe", "--vocab-size", "100"], False, "--vocab-size=100: at least 256 (every byte is a "),
        (["--tokenizer", "BROKEN"], False, "--tokenizer='BROKEN': a tokenizer.json the tokenizers library reads ("),
    ],
)
def test_a_tokenizer_that_cannot_be_had_is_refused_before_any_input_is_read(
    tmp_path, monkeypatch, capsys, options, missing_library, error
):
    from zoo.lab.data import prepare as prepare_module

    if missing_library:
        monkeypatch.setitem(sys.modules, "tokenizers", None)  # not installed: importing it raises ImportError
    else:
        pytest.importorskip("tokenizers")
    (tmp_path / "in.txt").write_text(SMALL)
    (tmp_path / "broken.json").write_text('{"model": ')
    options = [str(tmp_path / "broken.json") if o == "BROKEN" else o for o in options]
    error = error.replace("BROKEN", str(tmp_path / "broken.json"))

    def read(*_, **__):
        pytest.fail("an input was read before the tokenizer was checked")

    monkeypatch.setattr(prepare_module, "sources_hash", read)
    monkeypatch.setattr(prepare_module, "read_all", read)
    assert main([str(tmp_path / "in.txt"), "--out", str(tmp_path / "out"), "--workers", "1", *options]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"zoo-prepare: {error}"), err
    assert not (tmp_path / "out").exists()
