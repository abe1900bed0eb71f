"""Local text and token folders by name, without torch: the standard library's sources (the default corpus),
walking a folder for files, and the names of a zoo-prepare folder's format. ``task=bytes`` and ``task=tokens``
read through these, and so does ``zoo-prepare``, which tokenizes with no model in sight."""

from __future__ import annotations

import fnmatch
import os
import sysconfig
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
