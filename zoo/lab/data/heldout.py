"""Held-out validation text that every install of zoo holds, by name (``task.heldout``): text unlike the
training text, in a domain the model never trains on, read without a download and without torch.

- ``cpp``: the C++ headers torch ships (``torch/include``): code, in another language than the standard
  library's Python.
- ``python``: torch's own Python sources: the training text's language, by other authors, on other subjects.
- ``docs``: the descriptions (their README, in Markdown or reStructuredText) of the distributions zoo
  requires: English prose.

Each source is a spread of its files (in the order of a hash of their names, as the training corpus reads
a folder) up to :data:`HELDOUT_BYTES`. A file whose content the training text also holds is skipped
(``exclude``: the training files' hashes), so no byte of a held-out source was trained on as part of
the same file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from zoo.lab.data.sources import read_spread, walk

#: How much of each held-out source is read (validation windows are spread across it).
HELDOUT_BYTES = 400_000
#: The distributions whose descriptions are the ``docs`` source: zoo's own requirements.
DOC_DISTRIBUTIONS = ("torch", "hydra-core", "omegaconf", "einops", "tqdm", "matplotlib", "safetensors", "scipy")


@dataclass(frozen=True)
class HeldOut:
    """One held-out source's text, where it came from and how many files it took."""

    name: str
    data: bytes
    source: str
    files: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def torch_dir() -> Path:
    """The installed torch package's folder, found without importing it."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None, "torch is not installed"
    return Path(spec.origin).parent


def cpp_files() -> tuple[Path, list[str], Callable[[Path], bytes]]:
    root = torch_dir() / "include"
    return root, walk(root, "*.h"), Path.read_bytes


def python_files() -> tuple[Path, list[str], Callable[[Path], bytes]]:
    root = torch_dir()
    return root, [rel for rel in walk(root, "*.py") if not rel.startswith("include/")], Path.read_bytes


def doc_files() -> tuple[Path, list[str], Callable[[Path], bytes]]:
    """The installed distributions of :data:`DOC_DISTRIBUTIONS`, each read as its description."""
    installed = []
    for name in DOC_DISTRIBUTIONS:
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        installed.append(name)
    return Path(), installed, description


def description(name: Path) -> bytes:
    """The description of the distribution ``name`` (its METADATA's text after the header lines)."""
    meta = importlib.metadata.distribution(name.name).read_text("METADATA") or ""
    return meta.replace("\r\n", "\n").partition("\n\n")[2].encode()


#: The held-out sources by name: each gives its root, its files (relative) and how one is read.
SOURCES: dict[str, Callable[[], tuple[Path, list[str], Callable[[Path], bytes]]]] = {
    "cpp": cpp_files,
    "python": python_files,
    "docs": doc_files,
}


@lru_cache(maxsize=8)
def read_heldout(name: str, exclude: frozenset[str] = frozenset(), max_bytes: int = HELDOUT_BYTES) -> HeldOut:
    """Up to ``max_bytes`` of source ``name`` (one of :data:`SOURCES`), less the files whose sha256 is in
    ``exclude`` (the training text's)."""
    root, files, read = SOURCES[name]()
    data, used, _ = read_spread(root, files, max_bytes, read=read, exclude=exclude)
    return HeldOut(name, data, str(root) if name != "docs" else "descriptions of " + ", ".join(DOC_DISTRIBUTIONS),
                   used)  # fmt: skip
