"""``metrics.jsonl``: a run's records, one JSON line per logged step or evaluation, appended as it trains
(:class:`MetricsLog`) and read back skipping a line cut short by a kill.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from zoo.lab.files import clean, write_atomic

METRICS = "metrics.jsonl"


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of ``metrics.jsonl``; a line cut short by a kill is skipped."""
    records = []
    try:
        lines = (run_dir / METRICS).read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def keep_metrics_until(run_dir: Path, step: int) -> None:
    """Rewrite ``metrics.jsonl`` (atomically) with only its records up to ``step``: a run resumed from
    the checkpoint after ``step`` continues the curve from there (lines cut short by a kill are dropped)."""
    kept = [r for r in read_metrics(run_dir) if r.get("step", 0) <= step]
    write_atomic(run_dir / METRICS, "".join(json.dumps(r) + "\n" for r in kept))


class MetricsLog:
    """Appends one JSON object per line to ``metrics.jsonl``, flushed per record.

    Opened with "w": a re-run starts its curve afresh; ``append`` continues it (a resumed run,
    after :func:`keep_metrics_until`). ``None`` as the path writes nothing (ranks other than 0 under DDP).
    """

    def __init__(self, path: Path | None, append: bool = False) -> None:
        self._file: IO[str] | None = open(path, "a" if append else "w") if path is not None else None  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(clean(record)) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
