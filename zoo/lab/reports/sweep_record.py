"""``sweep.json``: what a sweep was, beside its report, for ``zoo-results``: its command line as the sweep's process
saw it, the zoo version that reported it and when. Written when a sweep writes its report (ReportCallback), read
back checked; a folder without one (reported by ``zoo-report`` alone, or before the file existed) is read from
Hydra's ``multirun.yaml`` instead (zoo/lab/reports/results.py)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import zoo
from zoo.lab.files import write_json_atomic

SWEEP_RECORD = "sweep.json"
#: sweep.json's fields, each a string.
FIELDS = ("command", "zoo_version", "reported")


def write_sweep_record(root: Path, argv: Sequence[str]) -> None:
    """sweep.json in ``root``: the command (``argv``, its program by name), the zoo version and the time (UTC)."""
    command = shlex.join([Path(argv[0]).name, *argv[1:]]) if argv else ""
    reported = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_json_atomic(root / SWEEP_RECORD, {"schema": 1, "command": command, "zoo_version": zoo.__version__,
                                            "reported": reported})  # fmt: skip


def read_sweep_record(root: Path) -> tuple[dict[str, str] | None, str | None]:
    """sweep.json's fields, checked (``(None, None)``: no file; ``(None, why)``: one that does not read)."""
    path = root / SWEEP_RECORD
    if not path.is_file():
        return None, None
    try:
        data: Any = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return None, f"not JSON: {error}"
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in FIELDS):
        return None, f"not a sweep record: each of {', '.join(FIELDS)} a string"
    return {k: data[k] for k in FIELDS}, None
