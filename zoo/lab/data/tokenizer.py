"""A run's tokenizer: text to token ids and back, as the run's data was tokenized.

A ``tokens`` run trained on a ``zoo-prepare`` folder with a ``tokenizer.json`` records it in
``summary.json`` (``data.tokenizer``: path, sha256, vocab_size) and keeps a copy in the run folder,
so that the folder carries what its text needs; one on a folder of UTF-8 bytes (``--tokenizer bytes``)
records ``{"kind": "bytes", "vocab_size": 256}``. The copy (else the recorded path) is read only when
its sha256 is the recorded one: a ``tokenizer.json`` is JSON, parsed by the ``tokenizers`` library,
never unpickled. Byte-level runs use UTF-8; other runs have no text, only token ids.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zoo.core.errors import ConfigError, install_extra

#: The copy of the run's tokenizer in its run folder.
RUN_TOKENIZER = "tokenizer.json"
#: Tasks whose tokens are bytes: prompts are text, samples are decoded as UTF-8.
BYTE_TASKS = ("bytes",)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tokenizer_record(path: Path, vocab_size: int) -> dict[str, Any]:
    """What ``summary.json``'s ``data.tokenizer`` says of a tokenizer file."""
    return {"path": str(path.resolve()), "sha256": sha256(path), "vocab_size": vocab_size}


def copy_to_run(out_dir: Path, data: dict[str, Any]) -> None:
    """Copy the data's tokenizer (``data['tokenizer']``, if any) into the run folder ``out_dir``."""
    record = data.get("tokenizer")
    if record is not None and "path" in record and Path(record["path"]).is_file():
        shutil.copyfile(record["path"], out_dir / RUN_TOKENIZER)  # this run's (a re-run's replaces it)


class Codec:
    """Text <-> token ids for one run: ``kind`` is ``bytes`` (UTF-8), ``tokenizer`` (a tokenizers
    ``Tokenizer``) or ``ids`` (no text: token ids written out, separated by spaces)."""

    def __init__(self, kind: str, tokenizer: Any | None = None) -> None:
        self.kind, self.tokenizer = kind, tokenizer

    @property
    def has_text(self) -> bool:
        return self.kind != "ids"

    def encode(self, text: str) -> list[int]:
        if self.kind == "bytes":
            return list(text.encode("utf-8"))
        if self.kind == "tokenizer":
            return list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        try:
            return [int(token) for token in text.split()]
        except ValueError:
            allowed = "token ids separated by spaces (this run has no tokenizer)"
            raise ConfigError("prompt", text, allowed) from None

    def decode(self, ids: Sequence[int]) -> str:
        """UTF-8 with undecodable bytes replaced, the tokenizer's decoding, or the ids separated by spaces."""
        if self.kind == "bytes":
            return bytes(ids).decode("utf-8", errors="replace")
        if self.kind == "tokenizer":
            return self.tokenizer.decode(list(ids), skip_special_tokens=False)
        return " ".join(str(i) for i in ids)


def verified_file(run_dir: Path, record: dict[str, Any]) -> Path:
    """The run's tokenizer file (its copy in the run folder, else the recorded path), its sha256 checked."""
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
        raise ConfigError(f"{run_dir}/summary.json: data.tokenizer", record, "path, sha256 and vocab_size")
    candidates = [run_dir / RUN_TOKENIZER, Path(str(record.get("path")))]
    found = [p for p in candidates if p.is_file()]
    if not found:
        names = " or ".join(str(p) for p in candidates)
        raise ConfigError("tokenizer", names, "the run's tokenizer.json (summary.json's data.tokenizer)")
    digest = sha256(found[0])
    if digest != record["sha256"]:
        allowed = f"sha256 {record['sha256'][:16]}... (summary.json's data.tokenizer), found {digest[:16]}..."
        raise ConfigError("tokenizer", str(found[0]), allowed)
    return found[0]


def run_codec(run_dir: str | Path, task: str, data: dict[str, Any]) -> Codec:
    """How the run at ``run_dir`` turns text into tokens and back, from its task's name and what its
    summary.json records of its data (``data``: ``data.tokenizer``)."""
    if task in BYTE_TASKS:
        return Codec("bytes")
    record = data.get("tokenizer")
    if record is None:
        return Codec("ids")
    if isinstance(record, dict) and record.get("kind") == "bytes":  # zoo-prepare --tokenizer bytes
        return Codec("bytes")
    path = verified_file(Path(run_dir), record)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError("tokenizer", str(path), f"the tokenizers library: {install_extra('tokens')}") from None
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises a bare Exception on a bad file
        raise ConfigError("tokenizer", str(path), f"a tokenizer.json the tokenizers library reads ({e})") from None
    if tokenizer.get_vocab_size() != record.get("vocab_size"):
        allowed = f"vocab_size {record.get('vocab_size')} (summary.json), the file has {tokenizer.get_vocab_size()}"
        raise ConfigError("tokenizer", str(path), allowed)
    return Codec("tokenizer", tokenizer)
