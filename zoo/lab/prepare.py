"""``zoo-prepare``: local text to zoo's token format (train/val shards of raw uint16/uint32 tokens and a
``meta.json``), for ``zoo-train task=tokens task.path=DIR``."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from zoo.core.errors import ConfigError
from zoo.lab.records import write_atomic, write_json_atomic
from zoo.lab.tasks.text import walk
from zoo.lab.tasks.tokens import FORMAT, META

TOKENIZER_FILE = "tokenizer.json"


def source_files(inputs: Sequence[str], pattern: str) -> list[Path]:
    """The input files: each file given, and each folder's files matching ``pattern`` (sorted)."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [path / rel for rel in sorted(walk(path, pattern))]
        else:
            raise ConfigError("INPUT", item, "no such file or folder; give text or .jsonl files or folders")
    return files


def read_documents(path: Path) -> list[str]:
    """A text file as one document, or a ``.jsonl`` file's ``text`` fields; binaries (NUL bytes) as none."""
    raw = path.read_bytes()
    if b"\0" in raw:
        return []
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError("INPUT", str(path), f"UTF-8 text ({e})") from None
    if path.suffix != ".jsonl":
        return [text] if text else []
    docs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise ConfigError(f"{path}:{n}", line[:40], "a JSON object with a 'text' string") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ConfigError(f"{path}:{n}", line[:40], "a JSON object with a 'text' string")
        docs.append(record["text"])
    return docs


def sources_hash(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.resolve()).encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def load_tokenizer(spec: str, vocab_size: int, docs: Sequence[str]) -> Any | None:
    """None for ``bytes``; a byte-level BPE trained on ``docs`` for ``bpe``; else a tokenizer.json file."""
    if spec == "bytes":
        return None
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise ConfigError(
            "--tokenizer", spec, "bytes, or install the tokenizers library: pip install zoo[tokens]"
        ) from None

    if spec == "bpe":
        if vocab_size < 256:
            raise ConfigError("--vocab-size", vocab_size, "at least 256 (every byte is a token)")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=False)
        tok.train_from_iterator(docs, trainer=trainer)
        return tok
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError("--tokenizer", spec, "bytes, bpe or a local tokenizer.json file")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises a bare Exception on a bad file
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError("--tokenizer", spec, f"a tokenizer.json the tokenizers library reads ({reason})") from None


def encode(tokenizer: Any | None, docs: Sequence[str]) -> np.ndarray:
    """The token ids of ``docs`` one after the other (int64)."""
    if not docs:
        return np.zeros(0, dtype=np.int64)
    if tokenizer is None:
        return np.frombuffer("".join(docs).encode(), dtype=np.uint8).astype(np.int64)
    ids = [np.asarray(e.ids, dtype=np.int64) for e in tokenizer.encode_batch(list(docs), add_special_tokens=False)]
    return np.concatenate(ids)


def split_docs(docs: Sequence[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """The documents with the last ``val_fraction`` of their characters moved to validation."""
    total = sum(map(len, docs))
    cut, train, val, seen = total - int(total * val_fraction), [], [], 0
    for doc in docs:
        if seen + len(doc) <= cut:
            train.append(doc)
        elif seen >= cut:
            val.append(doc)
        else:
            train.append(doc[: cut - seen])
            val.append(doc[cut - seen :])
        seen += len(doc)
    return train, val


def tokenizer_id(spec: str, vocab_size: int) -> dict[str, Any]:
    """What the output depends on besides the input: the tokenizer asked for (a file by its hash)."""
    if spec in ("bytes", "bpe"):
        return {"kind": spec, "vocab_size": 256 if spec == "bytes" else vocab_size}
    path = Path(spec).expanduser()
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    return {"kind": "file", "source": str(path), "sha256": digest}


def up_to_date(out: Path, request: dict[str, Any]) -> bool:
    try:
        meta = json.loads((out / META).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(meta, dict) or any(meta.get(k) != v for k, v in request.items()):
        return False
    files = [f for s in meta.get("splits", {}).values() for f in s.get("files", [])]
    files += [meta["tokenizer_file"]] if "tokenizer_file" in meta else []
    return bool(files) and all((out / f).is_file() for f in files)


def prepare(
    inputs: Sequence[str],
    out: str | Path,
    *,
    tokenizer: str = "bytes",
    vocab_size: int = 4096,
    val_fraction: float = 0.02,
    pattern: str = "*",
    progress: bool = True,
) -> dict[str, Any]:
    """Tokenize ``inputs`` into ``out``; the folder's meta.json (unchanged when it was up to date)."""
    if not 0 < val_fraction < 1:
        raise ConfigError("--val-fraction", val_fraction, "must be in (0, 1)")
    out, files = Path(out), source_files(inputs, pattern)
    request = {"sources": sources_hash(files), "tokenizer": tokenizer_id(tokenizer, vocab_size)}
    request["val_fraction"] = val_fraction
    if up_to_date(out, request):
        return json.loads((out / META).read_text())
    docs = [d for path in tqdm(files, desc="reading", unit="file", disable=not progress) for d in read_documents(path)]
    if not any(docs):
        raise ConfigError("INPUT", list(inputs), f"no text found (files matching {pattern!r}, or .jsonl 'text' fields)")
    tok = load_tokenizer(tokenizer, vocab_size, docs)
    vocab = 256 if tok is None else tok.get_vocab_size()
    dtype = "uint16" if vocab <= 1 << 16 else "uint32"
    meta = {"format": FORMAT, "version": 1, **request, "vocab_size": vocab, "dtype": dtype, "splits": {}}
    meta["files"] = len(files)
    if tok is not None:
        write_atomic(out / TOKENIZER_FILE, tok.to_str())
        meta["tokenizer_file"] = TOKENIZER_FILE
    else:
        (out / TOKENIZER_FILE).unlink(missing_ok=True)  # a previous run's, not these tokens'
    for split, part in zip(("train", "val"), split_docs(docs, val_fraction), strict=True):
        ids = encode(tok, part).astype(dtype)
        name = f"{split}_000.bin"
        write_atomic(out / name, ids.tobytes())
        nbytes = sum(len(d.encode()) for d in part)
        meta["splits"][split] = {"files": [name], "shard_tokens": [len(ids)], "tokens": len(ids), "bytes": nbytes}
    write_json_atomic(out / META, meta)  # last: the folder is complete once meta.json names it
    return meta


def split_text(folder: str | Path, split: str) -> str:
    """The text of a prepared split, decoded from its shards (the round trip of :func:`prepare`)."""
    folder = Path(folder)
    meta = json.loads((folder / META).read_text())
    ids = np.concatenate([np.fromfile(folder / f, dtype=meta["dtype"]) for f in meta["splits"][split]["files"]])
    if "tokenizer_file" not in meta:
        return ids.astype(np.uint8).tobytes().decode()
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / meta["tokenizer_file"])).decode(ids.tolist(), skip_special_tokens=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zoo-prepare", description=__doc__)
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="text or .jsonl files, or folders of them")
    parser.add_argument("--out", required=True, help="the output folder (shards, meta.json, tokenizer.json)")
    parser.add_argument("--tokenizer", default="bytes", help="bytes, bpe (trained on the input) or a tokenizer.json")
    parser.add_argument("--vocab-size", type=int, default=4096, help="the BPE's vocabulary size (--tokenizer bpe)")
    parser.add_argument("--val-fraction", type=float, default=0.02, help="the text's tail held out for validation")
    parser.add_argument("--glob", default="*", help="the files to read from a folder (default: all, binaries skipped)")
    args = parser.parse_args(argv)
    try:
        meta = prepare(
            args.inputs,
            args.out,
            tokenizer=args.tokenizer,
            vocab_size=args.vocab_size,
            val_fraction=args.val_fraction,
            pattern=args.glob,
        )
    except ConfigError as e:
        print(f"zoo-prepare: {e}", file=sys.stderr)
        return 2
    splits = ", ".join(f"{k} {v['tokens']} tokens / {v['bytes']} bytes" for k, v in meta["splits"].items())
    print(f"{args.out}: vocab_size {meta['vocab_size']}; {splits}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
