"""``tokens``: language modelling on pre-tokenized token files, memory-mapped (never loaded whole).

Reads zoo's own format (a folder with ``meta.json`` and train/val shards, written by ``zoo-prepare``),
nanoGPT's raw ``uint16`` ``.bin`` files, the speedrun's headered ``.bin`` shards (a 256-int32
header with magic 20240520, then ``uint16`` tokens) and one-dimensional ``.npy`` arrays of tokens.
"""

from __future__ import annotations

import glob as globbing
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from einops import rearrange

from zoo.core.errors import ConfigError
from zoo.lab.data.sources import FORMAT, META
from zoo.lab.data.tokenizer import tokenizer_record
from zoo.lab.tasks.base import Batch, Task, positive, register_task

SPEEDRUN_MAGIC, SPEEDRUN_HEADER = 20240520, 256  # int32 words
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
#: Files larger than this are hashed on a sample (their head, middle and tail) rather than whole.
HASH_WHOLE = 8 << 20
CHUNK = 1 << 24  # tokens per step of the vocabulary scan


@dataclass(frozen=True)
class Segment:
    """A run of tokens ``data[start:end]`` of one memory-mapped file."""

    path: Path
    data: np.ndarray
    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start


def file_hash(path: Path) -> str:
    """sha256 of the file, or of its size and three 1 MiB samples (head, middle, tail) when large."""
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= HASH_WHOLE:
            h.update(f.read())
            return h.hexdigest()
        h.update(str(size).encode())
        for at in (0, size // 2, size - (1 << 20)):
            f.seek(at)
            h.update(f.read(1 << 20))
    return "sample:" + h.hexdigest()


def expand(pattern: str, field: str) -> list[Path]:
    """The files a path, folder's ``*.bin`` or glob names, sorted; none is a ConfigError."""
    path = Path(pattern).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".bin", ".npy"))
    else:
        files = sorted(Path(p) for p in globbing.glob(str(path)) if Path(p).is_file())
    if not files:
        raise ConfigError(field, pattern, "no such file, folder of .bin files or glob of token files")
    return files


def check_source(path: str) -> None:
    """Refuse a ``task.path`` that names nothing, or a folder that holds neither a zoo-prepare ``meta.json``
    nor token files, saying what to run (before any other option is read against it)."""
    folder = Path(path).expanduser()
    prepare = f"prepare it with: zoo-prepare INPUT... --out {path} (docs/data.md)"
    if (
        folder.is_dir()
        and not (folder / META).is_file()
        and not any(p.suffix in (".bin", ".npy") for p in folder.iterdir())
    ):
        raise ConfigError(
            "task.path", path, f"a folder written by zoo-prepare: {folder.absolute()} has no {META}; {prepare}"
        )
    if not folder.exists() and not globbing.glob(str(folder)):
        where = f"not found (from {Path.cwd()})" if not folder.is_absolute() else "not found"
        raise ConfigError("task.path", path, f"an existing zoo-prepare folder or token files: {where}; {prepare}")


def map_raw(path: Path, dtype: str) -> np.ndarray:
    """A headerless file of ``dtype`` tokens, memory-mapped."""
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    size = path.stat().st_size
    if size % itemsize or size == 0:
        raise ConfigError(str(path), size, f"a file of {dtype} tokens has a positive size divisible by {itemsize}")
    return np.memmap(path, dtype=DTYPES[dtype], mode="r")


def map_speedrun(path: Path) -> np.ndarray:
    """A speedrun shard: 256 int32 (magic 20240520, version 1, token count), then uint16 tokens."""
    header = np.fromfile(path, dtype=np.int32, count=SPEEDRUN_HEADER)
    if len(header) < SPEEDRUN_HEADER or header[0] != SPEEDRUN_MAGIC or header[1] != 1:
        found = int(header[0]) if len(header) else None
        raise ConfigError(str(path), found, f"a speedrun shard starts with magic {SPEEDRUN_MAGIC}, version 1")
    n, expected = int(header[2]), SPEEDRUN_HEADER * 4 + 2 * int(header[2])
    if path.stat().st_size != expected:
        raise ConfigError(str(path), path.stat().st_size, f"its header says {n} tokens: {expected} bytes")
    return np.memmap(path, dtype=np.uint16, mode="r", offset=SPEEDRUN_HEADER * 4, shape=(n,))


def map_npy(path: Path) -> np.ndarray:
    """A ``.npy`` file of uint16 or uint32 tokens, memory-mapped (never unpickled)."""
    try:
        data = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ConfigError(str(path), None, f"a readable .npy file ({e})") from None
    if data.ndim != 1 or data.dtype not in (np.uint16, np.uint32) or len(data) == 0:
        raise ConfigError(str(path), f"{data.dtype} {data.shape}", "a one-dimensional array of uint16 or uint32")
    return data


def is_speedrun(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4)
    return len(head) == 4 and int(np.frombuffer(head, dtype=np.int32)[0]) == SPEEDRUN_MAGIC


def map_bins(files: Sequence[Path], fmt: str) -> list[Segment]:
    """``.bin`` files as segments: ``fmt`` speedrun, nanogpt (raw uint16) or auto (by the magic)."""
    segments = []
    for path in files:
        if path.suffix == ".npy" and fmt == "auto":
            data = map_npy(path)
        elif fmt == "speedrun" or (fmt == "auto" and is_speedrun(path)):
            data = map_speedrun(path)
        else:
            data = map_raw(path, "uint16")
        segments.append(Segment(path, data, 0, len(data)))
    return segments


def read_meta(folder: Path) -> dict[str, Any]:
    """``meta.json`` of a zoo token folder, checked against the shards beside it."""
    try:
        meta = json.loads((folder / META).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(str(folder / META), None, f"a readable JSON file ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ConfigError(str(folder / META), meta.get("format") if isinstance(meta, dict) else meta, FORMAT)
    if meta.get("dtype") not in DTYPES:
        raise ConfigError(f"{folder / META}: dtype", meta.get("dtype"), f"one of {', '.join(DTYPES)}")
    vocab = meta.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 1:
        raise ConfigError(f"{folder / META}: vocab_size", vocab, "a positive integer")
    return meta


def map_split(folder: Path, meta: dict[str, Any], split: str) -> list[Segment]:
    """One split's shards, each checked to hold as many ``meta['dtype']`` tokens as meta.json says."""
    entry = meta.get("splits", {}).get(split)
    files, counts = (entry.get("files"), entry.get("shard_tokens")) if isinstance(entry, dict) else (None, None)
    if not files or not isinstance(counts, list) or len(counts) != len(files):
        raise ConfigError(f"{folder / META}: splits.{split}", entry, "shard files with a token count each")
    itemsize = np.dtype(DTYPES[meta["dtype"]]).itemsize
    segments = []
    for name, tokens in zip(files, counts, strict=True):
        path = folder / name
        size = path.stat().st_size if path.is_file() else None
        if size != tokens * itemsize:
            raise ConfigError(
                str(path), size, f"meta.json says {tokens} {meta['dtype']} tokens: {tokens * itemsize} bytes"
            )
        data = np.memmap(path, dtype=DTYPES[meta["dtype"]], mode="r")
        segments.append(Segment(path, data, 0, len(data)))
    return segments


def hold_out(segments: list[Segment], n_val: int) -> tuple[list[Segment], list[Segment]]:
    """The last ``n_val`` tokens of ``segments`` (in order) as validation, the rest as training."""
    train, val = list(segments), []
    while n_val > 0 and train:
        last = train.pop()
        take = min(n_val, len(last))
        val.insert(0, Segment(last.path, last.data, last.end - take, last.end))
        if take < len(last):
            train.append(Segment(last.path, last.data, last.start, last.end - take))
        n_val -= take
    return train, val


def check_vocab(segments: Sequence[Segment], vocab_size: int, source: str) -> None:
    """Every token id below ``vocab_size``, else a ConfigError naming the file and the token offset."""
    for seg in segments:
        for lo in range(seg.start, seg.end, CHUNK):
            chunk = seg.data[lo : min(lo + CHUNK, seg.end)]
            if int(chunk.max()) >= vocab_size:
                at = lo + int(np.argmax(chunk >= vocab_size))
                raise ConfigError(
                    str(seg.path),
                    int(seg.data[at]),
                    f"token ids below vocab_size={vocab_size} ({source}); this one is at token offset {at}",
                )


class Windows:
    """Fixed-length windows over segments (none crosses a segment's end), addressed by one index."""

    def __init__(self, segments: Sequence[Segment], length: int) -> None:
        self.segments = [s for s in segments if len(s) >= length]
        self.length = length
        self.counts = np.cumsum([len(s) - length + 1 for s in self.segments])

    @property
    def n(self) -> int:
        return int(self.counts[-1]) if len(self.counts) else 0

    def take(self, indices: torch.Tensor) -> torch.Tensor:
        """The windows (len(indices), length) at window ``indices`` (in [0, n)), as int64 token ids."""
        idx = indices.numpy()
        which = np.searchsorted(self.counts, idx, side="right")
        before = np.concatenate([[0], self.counts[:-1]])[which]
        rows = []
        for i, w, b in zip(idx, which, before, strict=True):
            seg = self.segments[w]
            start = seg.start + int(i - b)
            rows.append(np.asarray(seg.data[start : start + self.length], dtype=np.int64))
        return torch.from_numpy(np.stack(rows))


@register_task("tokens")
class TokensTask(Task):
    """Next-token prediction on token files (``task.path``: a zoo-prepare folder, a ``.bin`` file,
    folder or glob). Metrics: ``val_loss`` (nats per token) and, when the validation text's byte count
    is known (zoo's format), ``val_bpb`` = loss / ln 2 x tokens per byte."""

    metrics = {"bpb": "min", "loss": "min"}
    path_options = ("path", "val_path")

    @classmethod
    def planned_vocab_size(cls, options: Mapping[str, Any]) -> int | None:
        """meta.json's vocabulary for a zoo-prepare folder (checked), else ``task.vocab_size``."""
        path = options.get("path")
        if path is None:
            return None  # the constructor names task.path
        folder = Path(path).expanduser()
        if (folder / META).is_file() and options.get("format", "auto") in ("auto", "zoo"):
            return read_meta(folder)["vocab_size"]
        check_source(path)
        return options.get("vocab_size")

    def __init__(
        self,
        *,
        path: str | None = None,
        val_path: str | None = None,
        format: str = "auto",
        vocab_size: int | None = None,
        seq_len: int = 128,
        val_fraction: float = 0.02,
        eval_lengths: tuple[int, ...] = (1,),
        metric: str | None = None,
    ) -> None:
        if path is None:
            raise ConfigError("task.path", path, "a zoo-prepare folder, a .bin token file, folder or glob")
        if format not in ("auto", "zoo", "nanogpt", "speedrun"):
            raise ConfigError("task.format", format, "one of auto, zoo, nanogpt, speedrun")
        positive("task.seq_len", seq_len)
        if not 0 < val_fraction < 1:
            raise ConfigError("task.val_fraction", val_fraction, "must be in (0, 1)")
        self.seq_len, self.val_bytes, self.tokenizer_file, self.byte_tokens = seq_len, None, None, False
        self.train, self.val = self.load(path, val_path, format, vocab_size, val_fraction)
        if self.val_bytes is None:
            self.metrics = {"loss": "min"}
        super().__init__(eval_lengths=eval_lengths, metric=metric)
        self.check_lengths(eval_lengths)

    def load(
        self, path: str, val_path: str | None, fmt: str, vocab_size: int | None, val_fraction: float
    ) -> tuple[list[Segment], list[Segment]]:
        """The train and validation segments, with ``self.vocab_size`` (and ``val_bytes`` when known) set."""
        folder = Path(path).expanduser()
        check_source(path)
        if fmt == "zoo" or (fmt == "auto" and (folder / META).is_file()):
            if not (folder / META).is_file():
                raise ConfigError("task.path", path, f"a folder written by zoo-prepare (with {META})")
            meta = read_meta(folder)
            self.vocab_size = meta["vocab_size"]
            if vocab_size is not None and vocab_size != meta["vocab_size"]:
                raise ConfigError("task.vocab_size", vocab_size, f"null or {META}'s {meta['vocab_size']}")
            train, val = map_split(folder, meta, "train"), map_split(folder, meta, "val")
            self.val_bytes = meta["splits"]["val"].get("bytes")
            if isinstance(meta.get("tokenizer_file"), str):
                self.tokenizer_file = folder / meta["tokenizer_file"]
            self.byte_tokens = (meta.get("tokenizer") or {}).get("kind") == "bytes"  # zoo-prepare's UTF-8 bytes
            source = f"{META}'s vocab_size"
        else:
            if vocab_size is None:
                raise ConfigError("task.vocab_size", None, f"the tokenizer's vocabulary size ({path} has no {META})")
            positive("task.vocab_size", vocab_size)
            self.vocab_size, source = vocab_size, "task.vocab_size"
            train = map_bins(expand(path, "task.path"), fmt)
            if val_path is None:
                train, val = hold_out(train, int(sum(map(len, train)) * val_fraction))
            else:
                val = map_bins(expand(val_path, "task.val_path"), fmt)
        check_vocab(train + val, self.vocab_size, source)
        return train, val

    def check_lengths(self, eval_lengths: tuple[int, ...]) -> None:
        longest = self.seq_len * max(eval_lengths) + 1
        self.train_windows = Windows(self.train, self.seq_len + 1)
        if self.train_windows.n == 0:
            raise ConfigError("task.seq_len", self.seq_len, f"a training window of {self.seq_len + 1} tokens fits")
        n_val = sum(map(len, self.val))
        if not any(len(s) >= longest for s in self.val):
            raise ConfigError(
                "task.seq_len",
                self.seq_len,
                f"the validation split ({n_val} tokens) holds a window of {longest} tokens "
                f"(seq_len x {max(eval_lengths)} + 1); give more validation data or a shorter task.seq_len",
            )

    def train_batch(self, batch_size: int, generator: torch.Generator) -> Batch:
        indices = torch.randint(0, self.train_windows.n, (batch_size,), generator=generator)
        windows = self.train_windows.take(indices)  # (b, t + 1)
        return Batch(windows[:, :-1], windows[:, 1:])

    def val_batches(self, batch_size: int, n_batches: int, factor: int = 1) -> list[Batch]:
        val = Windows(self.val, self.seq_len * factor + 1)
        indices = torch.linspace(0, val.n - 1, batch_size * n_batches).long()
        windows = rearrange(val.take(indices), "(n b) t -> n b t", n=n_batches)
        return [Batch(w[:, :-1], w[:, 1:]) for w in windows]

    def compute(self, sums: dict[str, float]) -> dict[str, float]:
        loss = sums["loss_sum"] / max(sums["count"], 1)
        if self.val_bytes is None:
            return {"loss": loss}
        tokens = sum(map(len, self.val))
        return {"bpb": loss / math.log(2) * tokens / self.val_bytes, "loss": loss}

    def info(self) -> dict[str, Any]:
        files = [{"path": str(p), "bytes": p.stat().st_size, "sha256": file_hash(p)} for p in self.paths()]
        combined = hashlib.sha256(json.dumps([f["sha256"] for f in files]).encode()).hexdigest()
        tokenizer: dict[str, Any] = {}
        if self.tokenizer_file is not None:
            tokenizer["tokenizer"] = tokenizer_record(self.tokenizer_file, self.vocab_size)
        elif self.byte_tokens:
            tokenizer["tokenizer"] = {"kind": "bytes", "vocab_size": 256}
        return {
            "task": self.name,
            "vocab_size": self.vocab_size,
            "train_tokens": sum(map(len, self.train)),
            "val_tokens": sum(map(len, self.val)),
            "val_bytes": self.val_bytes,
            "files": files,
            "sha256": combined,  # of the files' hashes, in order
            **tokenizer,  # the text's tokenizer.json (zoo-generate and zoo-eval read it)
        }

    def paths(self) -> list[Path]:
        """The token files read, each once, in order (training first)."""
        return list(dict.fromkeys(s.path for s in self.train + self.val))
