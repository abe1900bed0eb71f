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
from zoo.lab.data.heldout import SOURCES, read_heldout
from zoo.lab.data.packing import best_fit, bos_aligned, check_packing, document_ids, split_documents
from zoo.lab.data.sources import read_spread, stdlib_dir, walk
from zoo.lab.tasks.base import Batch, Task, positive, register_task


@dataclass(frozen=True)
class Corpus:
    """Bytes read from disk, in a deterministic order, and where they came from."""

    data: bytes
    source: str
    files: int
    hashes: frozenset[str] = frozenset()  # each file's sha256 (what a held-out source leaves out)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


#: The byte that starts every document under ``task.doc_mask`` or a packing other than concat: NUL, which no
#: text file read holds (files holding one are skipped as binaries).
BOS = 0


@lru_cache(maxsize=4)
def read_corpus(path: str | None, pattern: str | None, max_bytes: int, documents: bool = False) -> Corpus:
    """Up to ``max_bytes`` of text from a file, or from a folder's files matching ``pattern``; ``documents``:
    each file (the file itself) a document, starting with the byte :data:`BOS`.

    Folder files are taken in the order of a hash of their relative path (a spread, deterministic
    subset when ``max_bytes`` cuts it short); files holding a NUL byte (binaries) are skipped.
    ``path=None`` reads the standard library's ``*.py`` sources.
    """
    root = Path(path).expanduser() if path is not None else stdlib_dir()
    if root.is_file():
        text = root.read_bytes()
        head = bytes([BOS]) if documents else b""
        return Corpus(head + text[:max_bytes], str(root), 1, frozenset({hashlib.sha256(text).hexdigest()}))
    if not root.is_dir():
        raise ConfigError("task.path", path, "no such file or folder; give a local text file or folder (or null)")
    pattern = pattern or ("*.py" if path is None else "*")
    data, used, hashes = read_spread(root, walk(root, pattern), max_bytes, separator=bytes([BOS]) if documents else b"")
    if not data:
        raise ConfigError("task.path", str(root), f"no readable text files matching {pattern!r}")
    return Corpus(data, str(root), used, hashes)


@register_task("bytes")
class BytesTask(Task):
    """Next-byte prediction; the last ``val_fraction`` of the corpus is held out for validation, and
    ``heldout`` names held-out sources of other text validated on too (zoo.lab.data.heldout).

    Metrics: ``val_loss`` (nats per byte) and ``val_bpb`` (bits per byte = loss / ln 2); per held-out source
    ``val_bpb_<source>`` and ``val_loss_<source>``, and their means ``val_bpb_macro``, ``val_loss_macro``.

    Documents (each file one, starting with the byte :data:`BOS`), under ``doc_mask`` or a ``packing`` other than
    ``concat``: ``packing`` makes the training windows (zoo.lab.data.packing; validation windows stay spread over
    the held-out stream), and ``doc_mask`` hands the model each window's document ids (its BOS bytes counted), so
    no byte reads another document. A single-file ``path`` is one document.
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
        heldout: tuple[str, ...] = (),
        doc_mask: bool = False,
        packing: str = "concat",
    ) -> None:
        self.heldout = check_heldout(heldout)
        self.doc_mask, self.packing = doc_mask, check_packing(packing)
        super().__init__(eval_lengths=eval_lengths, metric=metric)
        positive("task.max_bytes", max_bytes)
        positive("task.seq_len", seq_len)
        if not 0 < val_fraction < 1:
            raise ConfigError("task.val_fraction", val_fraction, "must be in (0, 1)")
        self.vocab_size, self.seq_len = 256, seq_len
        self.corpus = read_corpus(path, glob, max_bytes, doc_mask or packing != "concat")
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
        self.documents = split_documents(self.train, BOS) if packing != "concat" else []
        self.heldout_text = {name: read_heldout(name, self.corpus.hashes) for name in self.heldout}
        for name, text in self.heldout_text.items():
            if len(text.data) < seq_len + 1:
                raise ConfigError("task.heldout", list(heldout), f"{name!r} holds {len(text.data)} bytes here, too "
                                  f"few for a window of {seq_len + 1}")  # fmt: skip

    def train_batch(self, batch_size: int, generator: torch.Generator) -> Batch:
        if self.packing != "concat":
            pack = bos_aligned if self.packing == "bos_aligned" else best_fit
            windows = pack(self.documents, self.seq_len + 1, batch_size, generator).long()
            return Batch(windows[:, :-1], windows[:, 1:])
        starts = torch.randint(0, len(self.train) - self.seq_len, (batch_size,), generator=generator)
        windows = self.train[starts[:, None] + self.positions].long()  # (b, t + 1)
        return Batch(windows[:, :-1], windows[:, 1:])

    def logits(self, model: Any, batch: Batch) -> torch.Tensor:
        """The model's logits of ``batch``; under ``doc_mask`` with each token's document id."""
        if self.doc_mask:
            return model(batch.inputs, doc_ids=document_ids(batch.inputs, BOS))
        return model(batch.inputs)

    def val_batches(self, batch_size: int, n_batches: int, factor: int = 1) -> list[Batch]:
        return spread_windows(self.val, self.seq_len * factor, batch_size, n_batches)

    def heldout_batches(self, batch_size: int, n_batches: int) -> dict[str, list[Batch]]:
        return {name: spread_windows(torch.frombuffer(bytearray(text.data), dtype=torch.uint8), self.seq_len,
                                     batch_size, n_batches) for name, text in self.heldout_text.items()}  # fmt: skip

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
            **({"heldout": {name: {"source": text.source, "files": text.files, "bytes": len(text.data),
                                   "sha256": text.sha256} for name, text in self.heldout_text.items()}}
               if self.heldout else {}),
        }  # fmt: skip


def spread_windows(data: torch.Tensor, length: int, batch_size: int, n_batches: int) -> list[Batch]:
    """``n_batches`` batches of ``batch_size`` windows of ``length`` (+ 1 target) spread evenly across ``data``."""
    starts = torch.linspace(0, len(data) - length - 1, batch_size * n_batches).long()
    windows = data[starts[:, None] + torch.arange(length + 1)].long()  # (n b, t + 1)
    windows = rearrange(windows, "(n b) t -> n b t", n=n_batches)
    return [Batch(w[:, :-1], w[:, 1:]) for w in windows]


def check_heldout(value: tuple[str, ...]) -> tuple[str, ...]:
    """``task.heldout``: distinct names of held-out sources (zoo.lab.data.heldout)."""
    if any(name not in SOURCES for name in value) or len(set(value)) != len(value):
        raise ConfigError("task.heldout", list(value), f"distinct held-out sources among {', '.join(SOURCES)}, "
                          "e.g. [cpp, python, docs] (docs/data.md)")  # fmt: skip
    return tuple(value)
