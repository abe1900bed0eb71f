"""Local text and token folders by name, without torch: the standard library's sources (the default corpus),
walking a folder for files, and the names of a zoo-prepare folder's format. ``task=bytes`` and ``task=tokens``
read through these, and so does ``zoo-prepare``, which tokenizes with no model in sight."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import sysconfig
from collections.abc import Callable, Iterable
from pathlib import Path

#: Folders a walk does not descend into: installed packages and caches.
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
#: A zoo-prepare folder's description, and the format it names.
META = "meta.json"
FORMAT = "zoo-tokens"


def stdlib_dir() -> Path:
    """This Python's standard library sources: the default corpus."""
    return Path(sysconfig.get_paths()["stdlib"])


def walk(root: Path, pattern: str) -> list[str]:
    """Relative paths (posix) of files under ``root`` matching ``pattern``, not descending into
    installed packages or caches."""
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        rel = Path(folder).relative_to(root)
        found += [(rel / name).as_posix() for name in names if fnmatch.fnmatch(name, pattern)]
    return found


def read_spread(
    root: Path,
    files: Iterable[str],
    max_bytes: int,
    *,
    read: Callable[[Path], bytes] = Path.read_bytes,
    exclude: frozenset[str] = frozenset(),
    separator: bytes = b"",
) -> tuple[bytes, int, frozenset[str]]:
    """Up to ``max_bytes`` of ``root``'s ``files`` (relative paths, read by ``read``) joined, taken in the order
    of a hash of their paths (a spread, deterministic subset when ``max_bytes`` cuts it short): the bytes, how
    many files they hold, and the sha256 of each file taken. Files holding a NUL byte (binaries), files that
    cannot be read and files whose sha256 is in ``exclude`` are skipped. ``separator``: put before every file
    (a BOS byte: each file a document, zoo.lab.data.packing)."""
    parts, total, hashes = [], 0, set()
    for rel in sorted(files, key=lambda rel: hashlib.sha1(rel.encode()).hexdigest()):
        if total >= max_bytes:
            break
        try:
            text = read(root / rel)
        except OSError:
            continue
        digest = hashlib.sha256(text).hexdigest()
        if b"\0" in text or digest in exclude:
            continue
        parts.append(text[: max_bytes - total])
        total += len(parts[-1])
        hashes.add(digest)
    return b"".join(separator + part for part in parts), len(parts), frozenset(hashes)
