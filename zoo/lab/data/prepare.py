"""Local documents to zoo's token format: a tokenizer (bytes, a library's, or one trained on the input),
the documents encoded (in worker processes), split into train and val and written as shards of raw
uint16/uint32 tokens with a ``meta.json``; an input unchanged since the last run is not encoded again."""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import re
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from zoo.core.errors import ConfigError, install_extra
from zoo.lab.data.bytebpe import ByteBPEEncoder, fast_encoder
from zoo.lab.data.documents import read_documents, source_files
from zoo.lab.data.sources import FORMAT, META, walk
from zoo.lab.files import write_atomic, write_json_atomic

TOKENIZER_FILE = "tokenizer.json"
#: A ``bpe`` is trained on about this many characters of the input, spread through it (more gains
#: little: on the standard library 4M characters give 2% more tokens than all 31M, in a sixth of the time).
TRAIN_CHARS = 4_000_000
#: Tokens per shard file (nanoGPT's and the speedrun's shards hold 100M).
SHARD_TOKENS = 100_000_000
#: The names :func:`write_shards` gives: ``train_000.bin``, ``val_012.bin``, ...
SHARD_NAME = re.compile(r"(train|val)_[0-9]{3,}\.bin")
#: bytebpe's ids are checked against the library's on a run's first documents, at most this many
#: documents and characters (the library takes about 0.1 s a core on them).
CHECK_DOCS, CHECK_CHARS = 64, 256_000

log = logging.getLogger("zoo.lab.data.prepare")


def sources_hash(files: Sequence[Path]) -> str:
    """The sha256 of each file's resolved path and contents, in order."""
    h, folders = hashlib.sha256(), {}
    for path in files:
        inside = [path / rel for rel in sorted(walk(path, "*"))] if path.is_dir() else [path]
        for item in inside:
            if item.is_symlink():
                where = item.resolve()
            else:  # a file's own resolve() is its folder's and its name: each folder resolved once
                if item.parent not in folders:
                    folders[item.parent] = item.parent.resolve()
                where = folders[item.parent] / item.name
            h.update(str(where).encode() + b"\0" + hashlib.sha256(item.read_bytes()).digest())
    return h.hexdigest()


def tokenizer_file(spec: str) -> Path:
    """The ``tokenizer.json`` that ``--tokenizer PATH`` names: the file, or the one in a tokenizer folder."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / TOKENIZER_FILE).is_file():
            raise ConfigError("--tokenizer", spec, f"a Hugging Face tokenizer folder holds {TOKENIZER_FILE}")
        return path / TOKENIZER_FILE
    if not path.is_file():
        raise ConfigError("--tokenizer", spec, "bytes, bpe, a local tokenizer.json file or a tokenizer folder")
    return path


def training_sample(docs: Sequence[str], max_chars: int) -> list[str]:
    """Documents of ``docs`` at a regular stride, about ``max_chars`` characters in all (every one for 0,
    or where the corpus is no larger)."""
    total = sum(map(len, docs))
    if max_chars <= 0 or total <= max_chars:
        return list(docs)
    return list(docs[:: -(-total // max_chars)])  # a ceil division: the stride


def check_tokenizer(spec: str, vocab_size: int) -> Any | None:
    """``--tokenizer`` checked before any input is read: the tokenizers library installed (for any but
    ``bytes``), ``bpe``'s ``--vocab-size``, a tokenizer.json file read (returned; None for bytes and bpe)."""
    if spec == "bytes":
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        allowed = f"bytes, or install the tokenizers library (the tokens extra): {install_extra('tokens')}"
        raise ConfigError("--tokenizer", spec, allowed) from None
    if spec == "bpe":
        if vocab_size < 256:
            raise ConfigError("--vocab-size", vocab_size, "at least 256 (every byte is a token)")
        return None
    path = tokenizer_file(spec)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises a bare Exception on a bad file
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError("--tokenizer", spec, f"a tokenizer.json the tokenizers library reads ({reason})") from None


def train_bpe(vocab_size: int, docs: Sequence[str], train_chars: int = 0) -> Any:
    """A byte-level BPE of ``vocab_size`` tokens trained on :func:`training_sample` of ``docs`` (``train_chars``,
    0 for all of them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(training_sample(docs, train_chars), trainer=trainer)
    return tok


def load_tokenizer(spec: str, vocab_size: int, docs: Sequence[str], train_chars: int = 0) -> Any | None:
    """None for ``bytes``; for ``bpe`` one trained on ``docs`` (:func:`train_bpe`); else a tokenizer.json file."""
    tok = check_tokenizer(spec, vocab_size)
    return train_bpe(vocab_size, docs, train_chars) if spec == "bpe" else tok


class LibraryEncoder:
    """Token ids through the ``tokenizers`` library itself (any tokenizer), or UTF-8 bytes for None."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer

    def encode_all(self, docs: Sequence[str]) -> np.ndarray:
        """The token ids of ``docs`` one after the other (int64)."""
        if not docs:
            return np.zeros(0, dtype=np.int64)
        if self.tokenizer is None:
            return np.frombuffer("".join(docs).encode(), dtype=np.uint8).astype(np.int64)
        tok = self.tokenizer
        batch = getattr(tok, "encode_batch_fast", tok.encode_batch)  # the same ids, no offsets (0.20+)
        return np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in batch(list(docs), add_special_tokens=False)])


def encoder_of(tokenizer: Any | None, fast: bool = True) -> Any:
    """The fastest encoder giving ``tokenizer``'s ids: :mod:`zoo.lab.data.bytebpe`'s for a plain byte-level
    BPE (unless ``fast`` is False), else the library (``encode_all(docs) -> int64 array``)."""
    return (fast and tokenizer is not None and fast_encoder(tokenizer)) or LibraryEncoder(tokenizer)


def check_sample(docs: Sequence[str], max_docs: int = CHECK_DOCS, max_chars: int = CHECK_CHARS) -> list[str]:
    """The first documents of ``docs``: at most ``max_docs`` of them and ``max_chars`` characters (the
    last one cut short where it would pass that)."""
    sample, left = [], max_chars
    for doc in docs[:max_docs]:
        if left <= 0:
            break
        sample.append(doc[:left])
        left -= len(doc)
    return sample


def first_difference(tokenizer: Any, encoder: ByteBPEEncoder, docs: Sequence[str]) -> tuple[int, int] | None:
    """Where ``encoder``'s ids of ``docs`` first differ from the library's: (document, token in it), or None."""
    expected = [tokenizer.encode(doc, add_special_tokens=False).ids for doc in docs]  # one thread: forks quietly
    want, got = np.array([i for ids in expected for i in ids], dtype=np.int64), encoder.encode_all(docs)
    n = min(len(want), len(got))
    if len(want) == len(got) and np.array_equal(want, got):
        return None
    wrong = np.flatnonzero(want[:n] != got[:n])
    at = int(wrong[0]) if len(wrong) else n  # the first differing token, or where the shorter one ends
    ends = np.cumsum([len(ids) for ids in expected])
    doc = min(int(np.searchsorted(ends, at, side="right")), len(docs) - 1)
    return doc, at - int(ends[doc] - len(expected[doc]))


def checked_encoder(tokenizer: Any | None, docs: Sequence[str]) -> tuple[bool, str]:
    """Whether bytebpe encodes a run whose first documents are ``docs`` (the ``fast`` of :func:`encode_all`),
    and meta.json's ``encoder``: bytebpe where it covers ``tokenizer`` and gives the library's ids on
    :func:`check_sample` of ``docs``; else the library, with a warning naming the first difference."""
    if tokenizer is None:
        return False, "bytes"
    import tokenizers

    library, encoder = f"tokenizers {tokenizers.__version__}", fast_encoder(tokenizer)
    if encoder is None:
        return False, library
    sample = check_sample(docs)
    where = first_difference(tokenizer, encoder, sample)
    if where is None:
        chars = sum(map(len, sample))
        return True, f"bytebpe (checked against {library} on {len(sample)} documents, {chars} characters)"
    doc, token = where
    log.warning(
        "bytebpe's ids differ from %s's at document %d (%r...), token %d: encoding with the library instead",
        library, doc, sample[doc][:40], token,
    )  # fmt: skip
    return False, f"{library} (bytebpe differed at document {doc}, token {token})"


def encode(tokenizer: Any | None, docs: Sequence[str]) -> np.ndarray:
    """The token ids of ``docs`` one after the other (int64)."""
    return encoder_of(tokenizer).encode_all(docs)


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


def short_vocabulary(requested: int, reached: int, docs: Sequence[str], train_chars: int) -> str:
    """Why a trained ``bpe`` has fewer tokens than ``--vocab-size``: its training text ran out of pairs to merge."""
    trained, total = sum(map(len, training_sample(docs, train_chars))), sum(map(len, docs))
    more = f"; --train-chars 0 trains on all {total}" if trained < total else ""
    return (
        f"--vocab-size {requested} asked for, but the BPE reached {reached} tokens: the {trained} characters "
        f"it was trained on hold no more pairs to merge{more}. meta.json records vocab_size {reached} "
        f"(the model's) and vocab_size_requested {requested}"
    )


def tokenizer_id(spec: str, vocab_size: int) -> dict[str, Any]:
    """What the output depends on besides the input: the tokenizer asked for (a file by its hash)."""
    if spec in ("bytes", "bpe"):
        return {"kind": spec, "vocab_size": 256 if spec == "bytes" else vocab_size}
    path = tokenizer_file(spec)
    return {"kind": "file", "source": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


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


def read_all(
    files: Sequence[Path], explicit: set[Path], field: str, workers: int, progress: bool
) -> tuple[list[str], int]:
    """The documents of ``files`` in order, and how many folder files were skipped for not being
    UTF-8 (a file in ``explicit``, named as INPUT, is an error instead). JSONL, Parquet and
    ``datasets`` folders are parsed by ``workers`` processes; plain text is read by this one, as
    decoding it is quicker than sending it from another process."""
    docs, skipped, strict = [], 0, [path in explicit for path in files]
    parsed = any(path.is_dir() or path.suffix in (".jsonl", ".parquet") for path in files)
    bar = tqdm(total=len(files), desc="reading", unit="file", disable=not progress)
    with pool_of(workers if parsed else 1) as pool:
        for part in pool.map(read_reporting, files, [field] * len(files), strict, chunksize=16):
            if isinstance(part, tuple):  # a worker's ConfigError, raised here
                raise ConfigError(*part)
            docs += part or []
            skipped += part is None
            bar.update()
    bar.close()
    return docs, skipped


def read_reporting(path: Path, field: str, strict: bool) -> list[str] | None | tuple[str, Any, str]:
    """:func:`read_documents`, a ConfigError returned as its (field, value, allowed): it crosses processes."""
    try:
        return read_documents(path, field, strict)
    except ConfigError as e:
        return (e.field, e.value, e.allowed)


class Serial:
    """A stand-in for a process pool with one worker: ``map`` in this process."""

    def __enter__(self) -> Serial:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def map(self, fn: Any, *iterables: Any, chunksize: int = 1) -> Any:
        return map(fn, *iterables)


def pool_of(workers: int, tokenizer: Any | None = None, fast: bool = True) -> Any:
    """``workers`` forked processes (each with its own copy of ``tokenizer``, one thread each, and
    :func:`encoder_of` it and ``fast``), or this one."""
    if workers <= 1:
        return Serial()
    spec = None if tokenizer is None else tokenizer.to_str()
    context = multiprocessing.get_context("fork")  # no re-import of zoo and torch, as spawn would
    return ProcessPoolExecutor(workers, mp_context=context, initializer=start_worker, initargs=(spec, fast))


WORKER_ENCODER: list[Any] = []


def start_worker(spec: str | None, fast: bool = True) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the processes are the parallelism
    if spec is not None:
        from tokenizers import Tokenizer

        WORKER_ENCODER[:] = [encoder_of(Tokenizer.from_str(spec), fast)]  # its caches last the worker's life


def encode_in_worker(docs: Sequence[str], dtype: str) -> np.ndarray:
    return WORKER_ENCODER[0].encode_all(docs).astype(dtype)  # the narrow dtype crosses the pipe


def encode_all(
    tokenizer: Any | None,
    docs: Sequence[str],
    workers: int,
    dtype: str = "int64",
    progress: bool = False,
    desc: str = "tokenizing",
    fast: bool = True,
) -> np.ndarray:
    """:func:`encode` of ``docs`` as ``dtype``, by ``workers`` processes over runs of documents (the same ids);
    ``fast`` False: by the library even where bytebpe covers ``tokenizer``."""
    if tokenizer is None or len(docs) < 2:
        return encoder_of(tokenizer, fast).encode_all(docs).astype(dtype)
    runs = min(len(docs), 8 * workers)  # a few per worker: work spread evenly, a bar that moves
    bounds = np.linspace(0, len(docs), runs + 1).astype(int)
    chunks = [docs[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    parts, bar = [], tqdm(total=sum(map(len, docs)), desc=desc, unit="char", unit_scale=True, disable=not progress)
    with pool_of(workers, tokenizer, fast) as pool:
        if workers > 1:
            done = pool.map(encode_in_worker, chunks, [dtype] * runs)
        else:  # one encoder for every run: its caches carry over
            encoder = encoder_of(tokenizer, fast)
            done = (encoder.encode_all(chunk).astype(dtype) for chunk in chunks)
        for chunk, part in zip(chunks, done, strict=True):
            parts.append(part)
            bar.update(sum(map(len, chunk)))
    bar.close()
    return np.concatenate(parts)


def write_shards(out: Path, split: str, ids: np.ndarray, shard_tokens: int) -> dict[str, Any]:
    """Write ``ids`` as ``{split}_000.bin``, ... of at most ``shard_tokens`` each; meta.json's entry."""
    shards = [ids[i : i + shard_tokens] for i in range(0, max(len(ids), 1), shard_tokens)]
    names = [f"{split}_{i:03d}.bin" for i in range(len(shards))]
    for name, shard in zip(names, shards, strict=True):
        write_atomic(out / name, shard.tobytes())
    return {"files": names, "shard_tokens": [len(shard) for shard in shards], "tokens": len(ids)}


def prepare(
    inputs: Sequence[str],
    out: str | Path,
    *,
    tokenizer: str = "bytes",
    vocab_size: int = 4096,
    val_fraction: float = 0.02,
    pattern: str = "*",
    text_field: str = "text",
    workers: int = 1,
    train_chars: int = TRAIN_CHARS,
    shard_tokens: int = SHARD_TOKENS,
    progress: bool = True,
) -> dict[str, Any]:
    """Tokenize ``inputs`` into ``out``; the folder's meta.json (unchanged when it was up to date).

    ``train_chars``: the characters a ``bpe`` is trained on (:func:`training_sample`; 0 for all);
    ``shard_tokens``: the most tokens one shard file holds."""
    check_options(val_fraction, workers, train_chars, shard_tokens)
    tok = check_tokenizer(tokenizer, vocab_size)  # before any input is read (or hashed)
    out, files = Path(out), source_files(inputs, pattern)
    request = {"sources": sources_hash(files), "tokenizer": tokenizer_id(tokenizer, vocab_size)}
    request["val_fraction"], request["shard_tokens"] = val_fraction, shard_tokens
    if tokenizer == "bpe":
        request["tokenizer"]["train_chars"] = train_chars
    if text_field != "text":
        request["text_field"] = text_field
    if up_to_date(out, request):
        return json.loads((out / META).read_text())
    explicit = {Path(item).expanduser() for item in inputs}
    docs, skipped = read_all(files, explicit, text_field, workers, progress)
    if not any(docs):
        raise ConfigError(
            "INPUT", list(inputs), f"no text found (files matching {pattern!r}, or {text_field!r} fields)"
        )
    tok = train_bpe(vocab_size, docs, train_chars) if tokenizer == "bpe" else tok  # a file: read above
    vocab = 256 if tok is None else tok.get_vocab_size()
    dtype = "uint16" if vocab <= 1 << 16 else "uint32"
    meta = {"format": FORMAT, "version": 1, **request, "vocab_size": vocab, "dtype": dtype, "splits": {}}
    if tokenizer == "bpe":
        meta["vocab_size_requested"] = vocab_size  # vocab_size is the one reached: the model's
        if vocab < vocab_size:
            log.warning("%s", short_vocabulary(vocab_size, vocab, docs, train_chars))
    meta["files"], meta["skipped_not_utf8"] = len(files) - skipped, skipped
    if tok is not None:
        write_atomic(out / TOKENIZER_FILE, tok.to_str())
        meta["tokenizer_file"] = TOKENIZER_FILE
    else:
        (out / TOKENIZER_FILE).unlink(missing_ok=True)  # a previous run's, not these tokens'
    splits = split_docs(docs, val_fraction)
    fast, meta["encoder"] = checked_encoder(tok, [*splits[0][:CHECK_DOCS], *splits[1][:CHECK_DOCS]])  # once a run
    for split, part in zip(("train", "val"), splits, strict=True):
        ids = encode_all(tok, part, workers, dtype, progress, f"tokenizing {split}", fast)
        meta["splits"][split] = write_shards(out, split, ids, shard_tokens)
        meta["splits"][split]["bytes"] = sum(len(d.encode()) for d in part)
    write_json_atomic(out / META, meta)  # the folder is complete once meta.json names it
    ours = {p for p in out.glob("*.bin") if SHARD_NAME.fullmatch(p.name)}
    for stale in ours - {out / f for s in meta["splits"].values() for f in s["files"]}:
        stale.unlink()  # a previous preparation's shards beyond this one's, named by no meta.json now
    return meta


def check_options(val_fraction: float, workers: int, train_chars: int, shard_tokens: int) -> None:
    """:func:`prepare`'s numeric options, each refused by its flag's name."""
    if not 0 < val_fraction < 1:
        raise ConfigError("--val-fraction", val_fraction, "must be in (0, 1)")
    if workers < 1:
        raise ConfigError("--workers", workers, "a positive number of processes")
    if train_chars < 0:
        raise ConfigError("--train-chars", train_chars, "a number of characters, or 0 to train on all the input")
    if shard_tokens < 1:
        raise ConfigError("--shard-tokens", shard_tokens, "a positive number of tokens per shard file")

