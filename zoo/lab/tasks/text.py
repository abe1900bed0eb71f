"""``bytes``: byte-level language modelling on local text (default: this Python's standard library)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from einops import rearrange

from zoo.core.errors import ConfigError
from zoo.lab.data.sources import stdlib_dir, walk
from zoo.lab.tasks.base import Batch, Task, positive, register_task


@dataclass(frozen=True)
class Corpus:
    """Bytes read from disk, in a deterministic order, and where they came from."""

    data: bytes
    source: str
    files: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@lru_cache(maxsize=4)
def read_corpus(path: str | None, pattern: str | None, max_bytes: int) -> Corpus:
    """Up to ``max_bytes`` of text from a file, or from a folder's files matching ``pattern``.

    Folder files are taken in the order of a hash of their relative path (a spread, deterministic
    subset when ``max_bytes`` cuts it short); files holding a NUL byte (binaries) are skipped.
    ``path=None`` reads the standard library's ``*.py`` sources.
    """
    root = Path(path).expanduser() if path is not None else stdlib_dir()
    if root.is_file():
        data = root.read_bytes()[:max_bytes]
        return Corpus(data, str(root), 1)
    if not root.is_dir():
        raise ConfigError("task.path", path, "no such file or folder; give a local text file or folder (or null)")
    pattern = pattern or ("*.py" if path is None else "*")
    files = sorted(walk(root, pattern), key=lambda rel: hashlib.sha1(rel.encode()).hexdigest())
    parts, total, used = [], 0, 0
    for rel in files:
        if total >= max_bytes:
            break
        try:
            text = (root / rel).read_bytes()
        except OSError:
            continue
        if b"\0" in text:
            continue
        parts.append(text[: max_bytes - total])
        total += len(parts[-1])
        used += 1
    if not parts:
        raise ConfigError("task.path", str(root), f"no readable text files matching {pattern!r}")
    return Corpus(b"".join(parts), str(root), used)


@register_task("bytes")
class BytesTask(Task):
    """Next-byte prediction; the last ``val_fraction`` of the corpus is held out for validation.

    Metrics: ``val_loss`` (nats per byte) and ``val_bpb`` (bits per byte = loss / ln 2).
    """

    metrics = {"bpb": "min", "loss": "min"}
    path_options = ("path",)

    @classmethod
    def planned_vocab_size(cls, options: Mapping[str, Any]) -> int | None:
        return 256

    def __init__(
        self,
        *,
        path: str | None = None,
        glob: str | None = None,
        max_bytes: int = 4_000_000,
        seq_len: int = 128,
        val_fraction: float = 0.02,
        eval_lengths: tuple[int, ...] = (1,),
        metric: str | None = None,
    ) -> None:
        super().__init__(eval_lengths=eval_lengths, metric=metric)
        positive("task.max_bytes", max_bytes)
        positive("task.seq_len", seq_len)
        if not 0 < val_fraction < 1:
            raise ConfigError("task.val_fraction", val_fraction, "must be in (0, 1)")
        self.vocab_size, self.seq_len = 256, seq_len
        self.corpus = read_corpus(path, glob, max_bytes)
        data = torch.frombuffer(bytearray(self.corpus.data), dtype=torch.uint8)
        n_val = int(len(data) * val_fraction)
        self.train, self.val = data[: len(data) - n_val], data[len(data) - n_val :]
        longest = seq_len * max(eval_lengths) + 1
        if len(self.train) < seq_len + 1 or len(self.val) < longest:
            raise ConfigError(
                "task.val_fraction",
                val_fraction,
                f"too little data: {len(self.train)} train / {len(self.val)} val bytes for windows of "
                f"{seq_len + 1} (train) and {longest} (val); raise task.max_bytes or task.val_fraction",
            )
        self.positions = torch.arange(seq_len + 1)

    def train_batch(self, batch_size: int, generator: torch.Generator) -> Batch:
        starts = torch.randint(0, len(self.train) - self.seq_len, (batch_size,), generator=generator)
        windows = self.train[starts[:, None] + self.positions].long()  # (b, t + 1)
        return Batch(windows[:, :-1], windows[:, 1:])

    def val_batches(self, batch_size: int, n_batches: int, factor: int = 1) -> list[Batch]:
        length = self.seq_len * factor
        starts = torch.linspace(0, len(self.val) - length - 1, batch_size * n_batches).long()
        windows = self.val[starts[:, None] + torch.arange(length + 1)].long()  # (n b, t + 1)
        windows = rearrange(windows, "(n b) t -> n b t", n=n_batches)
        return [Batch(w[:, :-1], w[:, 1:]) for w in windows]

    def compute(self, sums: Mapping[str, float]) -> dict[str, float]:
        loss = sums["loss_sum"] / max(sums["count"], 1)
        return {"bpb": loss / math.log(2), "loss": loss}

    def info(self) -> dict[str, Any]:
        return {
            "task": self.name,
            "source": self.corpus.source,
            "files": self.corpus.files,
            "bytes": len(self.corpus.data),
            "train_bytes": len(self.train),
            "val_bytes": len(self.val),
            "sha256": self.corpus.sha256,
        }
