"""Writing a file whole or not at all: a temp file beside it, fsynced, renamed over the target (a reader
sees the old file or the new one, never half), and JSON made strict (NaN and infinity as null).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` whole or not at all: a temp file beside it, fsynced, renamed over
    ``path``, then the folder fsynced (the rename survives a crash). A kill leaves ``.<name>.<random>.tmp``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 is for the temp file, not what it becomes
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Make the renames inside ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` (:func:`write_atomic`)."""
    write_atomic(path, json.dumps(clean(data), indent=2, sort_keys=False) + "\n")


def clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become None (JSON has no NaN), containers recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def from_cwd(path: Path) -> Path:
    """``path`` relative to the working directory when inside it (shorter log lines and messages), else as given."""
    try:
        return Path(path).resolve().relative_to(Path.cwd())
    except ValueError:
        return Path(path)


def shown(path: Path | None) -> str:
    """``path`` relative to the working directory when inside it (shorter log lines), ``run`` for no folder."""
    return "run" if path is None else str(from_cwd(path))
