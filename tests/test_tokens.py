"""task=tokens (token files, memory-mapped) and zoo-prepare (local text to token files)."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import interrupt, tiny, without_timings

from zoo.core.errors import ConfigError
from zoo.lab.commands.prepare import main, split_text
from zoo.lab.data.prepare import prepare, sources_hash
from zoo.lab.records.metrics import read_metrics
from zoo.lab.tasks import build_task
from zoo.lab.tasks import tokens as tokens_module
from zoo.lab.tasks.tokens import SPEEDRUN_MAGIC

TEXT = "Café déjà vu, 漢字 and emoji 🦒🐘 — naïve façade.\n" * 40 + "def f(x):\n    return x * 2  # ünïcödé\n" * 30


def corpus(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.txt").write_text(TEXT[: len(TEXT) // 2])
    (folder / "b.txt").write_text(TEXT[len(TEXT) // 2 :])
    return folder


def task(path: Path | str, **options) -> object:
    return build_task({"name": "tokens", "path": str(path), "seq_len": 16, **options})


def speedrun(path: Path, tokens: np.ndarray, magic: int = SPEEDRUN_MAGIC) -> Path:
    header = np.zeros(256, dtype=np.int32)
    header[:3] = magic, 1, len(tokens)
    path.write_bytes(header.tobytes() + tokens.astype(np.uint16).tobytes())
    return path


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_decoding_the_shards_gives_back_the_input_text_exactly(tmp_path, tokenizer):
    meta = prepare(
        [str(corpus(tmp_path / "in"))], tmp_path / "out", tokenizer=tokenizer, vocab_size=300, progress=False
    )
    assert split_text(tmp_path / "out", "train") + split_text(tmp_path / "out", "val") == TEXT
    assert meta["splits"]["train"]["bytes"] + meta["splits"]["val"]["bytes"] == len(TEXT.encode())
    assert meta["vocab_size"] == (256 if tokenizer == "bytes" else 300)
    if tokenizer == "bpe":
        assert meta["splits"]["val"]["tokens"] < meta["splits"]["val"]["bytes"]  # merges compress


def test_jsonl_text_fields_are_the_documents(tmp_path):
    lines = [json.dumps({"text": "première ligne 漢"}), "", json.dumps({"text": "second 🦒", "id": 2})]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    prepare([str(tmp_path / "d.jsonl")], tmp_path / "out", val_fraction=0.3, progress=False)
    assert split_text(tmp_path / "out", "train") + split_text(tmp_path / "out", "val") == "première ligne 漢second 🦒"


def test_rerunning_on_the_same_input_and_tokenizer_is_a_no_op(tmp_path):
    src = corpus(tmp_path / "in")
    prepare([str(src)], tmp_path / "out", tokenizer="bpe", vocab_size=300, progress=False)
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()}
    prepare([str(src)], tmp_path / "out", tokenizer="bpe", vocab_size=300, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()} == stamps
    prepare([str(src)], tmp_path / "out", tokenizer="bytes", progress=False)  # another tokenizer: redone
    assert json.loads((tmp_path / "out/meta.json").read_text())["vocab_size"] == 256
    assert not (tmp_path / "out/tokenizer.json").exists()  # the BPE's tokenizer no longer describes the tokens
    (tmp_path / "out/val_000.bin").unlink()  # a shard gone: redone
    prepare([str(src)], tmp_path / "out", tokenizer="bytes", progress=False)
    assert split_text(tmp_path / "out", "val")


def test_a_local_tokenizer_file_is_used_and_a_bad_one_is_a_clear_error(tmp_path):
    src = corpus(tmp_path / "in")
    prepare([str(src)], tmp_path / "bpe", tokenizer="bpe", vocab_size=280, progress=False)
    prepare([str(src)], tmp_path / "again", tokenizer=str(tmp_path / "bpe/tokenizer.json"), progress=False)
    assert (tmp_path / "again/train_000.bin").read_bytes() == (tmp_path / "bpe/train_000.bin").read_bytes()
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"--tokenizer=.*bad.json.*tokenizers library"):
        prepare([str(src)], tmp_path / "x", tokenizer=str(tmp_path / "bad.json"), progress=False)


def test_without_the_tokenizers_library_bytes_still_work_and_bpe_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails
    src = corpus(tmp_path / "in")
    prepare([str(src)], tmp_path / "bytes", progress=False)
    with pytest.raises(ConfigError, match=r"--tokenizer='bpe'.*pip install -e \"\.\[tokens\]\" in zoo's clone"):
        prepare([str(src)], tmp_path / "bpe", tokenizer="bpe", progress=False)


def test_a_missing_folder_and_an_empty_corpus_are_clear_errors(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "INPUT=" in err and "nowhere" in err and "no such file or folder" in err and len(err.splitlines()) == 1
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty/blank.txt").write_text("")
    with pytest.raises(ConfigError, match="no text found"):
        prepare([str(tmp_path / "empty")], tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()


def test_zoo_folder_windows_metrics_and_bits_per_byte(tmp_path):
    meta = prepare([str(corpus(tmp_path / "in"))], tmp_path / "out", tokenizer="bpe", vocab_size=300,
                   val_fraction=0.2, progress=False)  # fmt: skip
    t = task(tmp_path / "out")
    assert t.vocab_size == 300 and t.metric == "val_bpb"
    val = meta["splits"]["val"]
    out = t.compute({"loss_sum": 2.0 * 10, "count": 10, "correct": 0})
    assert out["bpb"] == pytest.approx(2.0 / math.log(2) * val["tokens"] / val["bytes"])
    tokens = np.fromfile(tmp_path / "out/train_000.bin", dtype=np.uint16)
    batch = t.train_batch(8, torch.Generator().manual_seed(3))
    slices = np.lib.stride_tricks.sliding_window_view(tokens, 17)
    windows = torch.cat([batch.inputs, batch.targets[:, -1:]], 1)  # targets are the inputs shifted by one
    assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
    assert all((slices == w.numpy()).all(1).any() for w in windows)  # each window is a slice of the file
    again = t.train_batch(8, torch.Generator().manual_seed(3))
    assert torch.equal(batch.inputs, again.inputs)  # the run's generator alone decides the windows
    assert [b.inputs.tolist() for b in t.val_batches(2, 2)] == [
        b.inputs.tolist() for b in task(tmp_path / "out").val_batches(2, 2)
    ]
    info = t.info()
    assert [f["path"] for f in info["files"]] == [str(tmp_path / "out" / n) for n in ("train_000.bin", "val_000.bin")]
    assert info["files"][0]["sha256"] == hashlib.sha256((tmp_path / "out/train_000.bin").read_bytes()).hexdigest()


def test_nanogpt_and_speedrun_bins_are_read_with_a_held_out_tail(tmp_path):
    tokens = np.arange(2000) % 500
    tokens.astype(np.uint16).tofile(tmp_path / "train.bin")
    speedrun(tmp_path / "fineweb_train_000001.bin", tokens)
    for path in ("train.bin", "fineweb_train_*.bin"):
        t = task(tmp_path / path, vocab_size=500, val_fraction=0.1)
        assert t.metric == "val_loss" and "val_bpb" not in t.metric_names()
        assert sum(map(len, t.val)) == 200
        assert t.val_batches(1, 1)[0].inputs[0].tolist() == list(range(300, 316))  # the tail, header skipped


def test_npy_files_are_memory_mapped_and_must_hold_unsigned_tokens(tmp_path):
    np.save(tmp_path / "train.npy", (np.arange(1000) % 64).astype(np.uint32))
    np.save(tmp_path / "val.npy", (np.arange(100) % 64).astype(np.uint16))
    t = task(tmp_path / "train.npy", val_path=str(tmp_path / "val.npy"), vocab_size=64)
    assert isinstance(t.train[0].data, np.memmap) and sum(map(len, t.val)) == 100
    assert t.val_batches(1, 1)[0].inputs[0].tolist() == list(range(16))
    np.save(tmp_path / "bad.npy", np.zeros((10, 10), dtype=np.float32))
    with pytest.raises(ConfigError, match=r"bad\.npy=.*float32.*one-dimensional array of uint16 or uint32"):
        task(tmp_path / "bad.npy", vocab_size=64)


def test_a_speedrun_header_mismatch_names_the_file(tmp_path):
    speedrun(tmp_path / "s.bin", np.arange(100), magic=1234)
    with pytest.raises(ConfigError, match=r"s\.bin=1234: a speedrun shard starts with magic 20240520"):
        task(tmp_path / "s.bin", vocab_size=500, format="speedrun")
    path = speedrun(tmp_path / "t.bin", np.arange(100))
    with open(path, "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(ConfigError, match=r"t\.bin=.*header says 100 tokens"):
        task(path, vocab_size=500)


def test_a_token_past_the_vocabulary_names_the_file_and_offset(tmp_path, monkeypatch):
    monkeypatch.setattr(tokens_module, "CHUNK", 1000)  # the scan goes in chunks: the offset is the file's
    tokens = np.arange(3000) % 100
    tokens[2345] = 100
    tokens.astype(np.uint16).tofile(tmp_path / "x.bin")
    with pytest.raises(ConfigError, match=r"x\.bin=100: token ids below vocab_size=100.*offset 2345"):
        task(tmp_path / "x.bin", vocab_size=100)
    with pytest.raises(ConfigError, match="task.vocab_size=None"):
        task(tmp_path / "x.bin")


def test_shards_disagreeing_with_meta_json_are_clear_errors(tmp_path):
    prepare([str(corpus(tmp_path / "in"))], tmp_path / "out", progress=False)
    meta = json.loads((tmp_path / "out/meta.json").read_text())
    (tmp_path / "out/meta.json").write_text(json.dumps({**meta, "dtype": "uint32"}))
    with pytest.raises(ConfigError, match=r"train_000\.bin=\d+: meta.json says \d+ uint32 tokens"):
        task(tmp_path / "out")
    (tmp_path / "out/meta.json").write_text(json.dumps({**meta, "dtype": "int8"}))
    with pytest.raises(ConfigError, match="dtype='int8': one of uint16, uint32"):
        task(tmp_path / "out")
    (tmp_path / "out/meta.json").write_text(json.dumps({**meta, "splits": {"train": {"files": ["train_000.bin"]}}}))
    with pytest.raises(ConfigError, match=r"splits.train=.*shard files with a token count each"):
        task(tmp_path / "out")
    (tmp_path / "out/meta.json").write_text(json.dumps({**meta, "vocab_size": 100}))
    with pytest.raises(ConfigError, match=r"token ids below vocab_size=100 \(meta.json"):
        task(tmp_path / "out")


def test_a_validation_split_shorter_than_one_window_is_a_clear_error(tmp_path):
    (np.arange(1000) % 50).astype(np.uint16).tofile(tmp_path / "x.bin")
    with pytest.raises(ConfigError, match=r"validation split \(10 tokens\) holds a window of 17 tokens"):
        task(tmp_path / "x.bin", vocab_size=50, val_fraction=0.01)


def test_prepare_then_train_reports_bits_per_byte_and_resumes_to_the_last_bit(tmp_path):
    from zoo.lab.training.run import run

    big = (TEXT * 3).replace("x", "y")  # a few KB
    (tmp_path / "in").mkdir()
    (tmp_path / "in/doc.txt").write_text(big)
    prepare([str(tmp_path / "in")], tmp_path / "tok", tokenizer="bpe", vocab_size=300, val_fraction=0.1, progress=False)
    cfg = tiny(f"task.path={tmp_path / 'tok'}", "task.seq_len=16", "model.vocab_size=300",
               "train.checkpoint_every=3", "train.keep_checkpoints=10", task="tokens")  # fmt: skip
    whole = run(cfg, out_dir=tmp_path / "whole")
    assert whole["status"] == "ok", whole.get("error")
    assert whole["metric"]["name"] == "val_bpb" and 0 < whole["final"]["val_bpb"] < 20
    assert whole["data"]["vocab_size"] == 300 and len(whole["data"]["files"]) == 2
    interrupt(tmp_path / "whole", tmp_path / "resumed", 6)
    resumed = run(cfg, out_dir=tmp_path / "resumed")
    assert resumed["resumed_from"] == [6] and resumed["final"] == whole["final"]  # the same batches after resume
    assert without_timings(read_metrics(tmp_path / "resumed")) == without_timings(read_metrics(tmp_path / "whole"))


def test_the_model_vocabulary_follows_the_files_and_a_smaller_one_is_an_error_naming_model_vocab_size(tmp_path):
    from zoo.lab.training.run import run

    prepare([str(corpus(tmp_path / "in"))], tmp_path / "tok", tokenizer="bpe", vocab_size=300, progress=False)
    base = (f"task.path={tmp_path / 'tok'}", "task.seq_len=16", "train.steps=2", "train.checkpoint_every=0")
    summary = run(tiny(*base, "model.vocab_size=256", task="tokens"), out_dir=tmp_path / "r")
    assert summary["status"] == "failed" and "model.vocab_size=256" in summary["error"] and "300" in summary["error"]
    followed = run(tiny(*base, task="tokens"), out_dir=tmp_path / "followed")  # model.vocab_size: null
    assert followed["status"] == "ok", followed["error"]
    assert followed["config"]["model"]["vocab_size"] == 300  # recorded: the run builds again from its config


DOCS = ["première ligne 漢", "", "second 🦒 — naïve", "def f(x):\n    return x\n" * 20, "façade"]


def test_parquet_files_give_their_text_field_and_bad_fields_are_clear_errors(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="Parquet input needs pyarrow: pip install -e '.[parquet]'")
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    table = pa.table({"body": DOCS, "id": list(range(len(DOCS)))})
    pq.write_table(table.slice(0, 3), tmp_path / "in/a.parquet")
    pq.write_table(table.slice(3), tmp_path / "in/b.parquet")  # a folder's Parquet files are read, not skipped
    main([str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--text-field", "body", "--val-fraction", "0.3"])
    assert split_text(tmp_path / "out", "train") + split_text(tmp_path / "out", "val") == "".join(DOCS)
    with pytest.raises(ConfigError, match=r"a.parquet: --text-field='text': one of its columns: body, id"):
        prepare([str(tmp_path / "in")], tmp_path / "x", progress=False)
    with pytest.raises(ConfigError, match=r"a.parquet: row 0 'id'=0: a string"):
        prepare([str(tmp_path / "in")], tmp_path / "x", text_field="id", progress=False)


def test_a_saved_datasets_folder_is_read_offline_split_after_split(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets", reason="datasets folders need datasets: pip install -e '.[datasets]'")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    datasets.Dataset.from_dict({"content": DOCS[:3]}).save_to_disk(str(tmp_path / "one"))
    splits = {"train": datasets.Dataset.from_dict({"content": DOCS[:3]}),
              "test": datasets.Dataset.from_dict({"content": DOCS[3:]})}  # fmt: skip
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "dict"))
    prepare([str(tmp_path / "one")], tmp_path / "a", text_field="content", val_fraction=0.3, progress=False)
    assert split_text(tmp_path / "a", "train") + split_text(tmp_path / "a", "val") == "".join(DOCS[:3])
    prepare([str(tmp_path / "dict")], tmp_path / "b", text_field="content", val_fraction=0.3, progress=False)
    assert split_text(tmp_path / "b", "train") + split_text(tmp_path / "b", "val") == "".join(DOCS)
    with pytest.raises(ConfigError, match=r"dict \(train\): --text-field='text': one of its columns: content"):
        prepare([str(tmp_path / "dict")], tmp_path / "c", progress=False)


def test_a_tokenizer_folder_is_its_tokenizer_json(tmp_path):
    src = corpus(tmp_path / "in")
    prepare([str(src)], tmp_path / "bpe", tokenizer="bpe", vocab_size=280, progress=False)
    (tmp_path / "hf").mkdir()  # a Hugging Face tokenizer folder: tokenizer.json and its configs
    (tmp_path / "hf/tokenizer.json").write_bytes((tmp_path / "bpe/tokenizer.json").read_bytes())
    (tmp_path / "hf/tokenizer_config.json").write_text("{}")
    prepare([str(src)], tmp_path / "again", tokenizer=str(tmp_path / "hf"), progress=False)
    assert (tmp_path / "again/train_000.bin").read_bytes() == (tmp_path / "bpe/train_000.bin").read_bytes()
    (tmp_path / "hf/tokenizer.json").unlink()
    with pytest.raises(ConfigError, match=r"--tokenizer=.*hf': a Hugging Face tokenizer folder holds tokenizer.json"):
        prepare([str(src)], tmp_path / "x", tokenizer=str(tmp_path / "hf"), progress=False)


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_workers_write_the_same_files_as_one_process(tmp_path, tokenizer):
    src = corpus(tmp_path / "in")
    for n in range(6):
        (src / f"c{n}.txt").write_text(TEXT[n * 50 : n * 50 + 700])
    for workers in (1, 3):
        prepare([str(src)], tmp_path / f"w{workers}", tokenizer=tokenizer, vocab_size=300, workers=workers,
                progress=False)  # fmt: skip
    for name in ("meta.json", "train_000.bin", "val_000.bin"):
        assert (tmp_path / f"w3/{name}").read_bytes() == (tmp_path / f"w1/{name}").read_bytes(), name
    (src / "bad.jsonl").write_text('{"text": 3}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:1=.*a JSON object with a 'text' string"):  # from a worker
        prepare([str(src)], tmp_path / "bad", tokenizer=tokenizer, workers=2, progress=False)


def test_a_folders_file_that_is_not_utf8_is_skipped_and_a_named_one_is_an_error(tmp_path, capsys):
    src = corpus(tmp_path / "in")
    (src / "latin1.txt").write_bytes("café".encode("latin-1"))
    assert main([str(src), "--out", str(tmp_path / "out")]) == 0
    assert "1 files skipped (not UTF-8)" in capsys.readouterr().out
    assert split_text(tmp_path / "out", "train") + split_text(tmp_path / "out", "val") == TEXT
    with pytest.raises(ConfigError, match=r"latin1.txt': UTF-8 text"):
        prepare([str(src / "latin1.txt")], tmp_path / "x", progress=False)


def test_stdlib_reads_the_standard_librarys_python_sources(tmp_path, monkeypatch):
    from zoo.lab.commands import prepare as prepare_module

    src = corpus(tmp_path / "lib")
    (src / "mod.py").write_text("import os\n" * 50)
    (src / "site-packages").mkdir()
    (src / "site-packages/pkg.py").write_text("installed, not the standard library\n")
    monkeypatch.setattr(prepare_module, "stdlib_dir", lambda: src)
    assert main(["--stdlib", "--out", str(tmp_path / "out"), "--val-fraction", "0.1"]) == 0
    assert split_text(tmp_path / "out", "train") + split_text(tmp_path / "out", "val") == "import os\n" * 50
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "none")])  # neither INPUT nor --stdlib


def test_shards_hold_at_most_shard_tokens_and_read_back_as_one_split(tmp_path):
    out = tmp_path / "out"
    meta = prepare([str(corpus(tmp_path / "in"))], out, shard_tokens=500, progress=False)
    train = meta["splits"]["train"]
    assert len(train["files"]) == -(-train["tokens"] // 500) > 2
    assert train["files"][:2] == ["train_000.bin", "train_001.bin"] and sum(train["shard_tokens"]) == train["tokens"]
    assert all(n == 500 for n in train["shard_tokens"][:-1]) and 0 < train["shard_tokens"][-1] <= 500
    assert split_text(out, "train") + split_text(out, "val") == TEXT
    assert sum(len(s) for s in task(out).train) == train["tokens"]  # every shard, memory-mapped
    (out / "train_001_mine.bin").write_bytes(b"not a shard")  # a file of the user's beside them
    assert main([str(tmp_path / "in"), "--out", str(out), "--shard-tokens", "100000", "--workers", "1"]) == 0
    names = sorted(p.name for p in out.glob("*.bin"))
    assert names == ["train_000.bin", "train_001_mine.bin", "val_000.bin"]  # the old shards went, not the user's
    assert split_text(out, "train") + split_text(out, "val") == TEXT
    with pytest.raises(ConfigError, match=r"--shard-tokens=0: a positive number of tokens"):
        prepare([str(tmp_path / "in")], out, shard_tokens=0, progress=False)


def test_a_bpe_trains_on_a_sample_spread_through_a_large_input(tmp_path):
    from zoo.lab.data.prepare import training_sample

    docs = [f"doc{i} " * 10 for i in range(100)]
    assert training_sample(docs, 0) == docs and training_sample(docs, 10**6) == docs
    sample = training_sample(docs, sum(map(len, docs)) // 10)
    assert sample == docs[::10]  # every tenth: from the start to the end of the input
    src = corpus(tmp_path / "in")
    small = prepare([str(src)], tmp_path / "small", tokenizer="bpe", vocab_size=300, train_chars=300, progress=False)
    whole = prepare([str(src)], tmp_path / "whole", tokenizer="bpe", vocab_size=300, train_chars=0, progress=False)
    assert small["tokenizer"]["train_chars"] == 300 and whole["tokenizer"]["train_chars"] == 0
    assert small["splits"]["train"]["tokens"] > whole["splits"]["train"]["tokens"]  # a worse fit, still exact:
    assert split_text(tmp_path / "small", "train") + split_text(tmp_path / "small", "val") == TEXT
    with pytest.raises(ConfigError, match=r"--train-chars=-1: a number of characters"):
        prepare([str(src)], tmp_path / "x", tokenizer="bpe", train_chars=-1, progress=False)


def test_the_sources_hash_names_each_file_by_its_resolved_path(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "real/a.txt").write_text("a")
    (tmp_path / "other/c.txt").write_text("c")
    (tmp_path / "link").symlink_to(tmp_path / "real")  # a folder reached through a link
    (tmp_path / "real/b.txt").symlink_to(tmp_path / "other/c.txt")  # a file that is a link
    files = [tmp_path / "link/a.txt", tmp_path / "real/b.txt"]
    expected = hashlib.sha256()
    for real, text in ((tmp_path / "real/a.txt", b"a"), (tmp_path / "other/c.txt", b"c")):
        expected.update(str(real.resolve()).encode() + b"\0" + hashlib.sha256(text).digest())
    assert sources_hash(files) == expected.hexdigest()
