"""A sweep's exit status: 1 when a run in its folder failed, or when its report could not be written. A diverged
run is a result; a failed one (a bad config, a crash) is not, so CI and scripts see it, while the report is still
written; a sweep without its report has no answer, whatever its runs did."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, ClassVar

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from zoo.lab.files import from_cwd
from zoo.lab.records.summary import SUMMARY, read_record_checked

#: Statuses that are results; any other (``failed``, or ``running`` left by a killed run) is not.
#: ``incompatible``: a grid's combination of parts the compatibility map refuses, with its reason.
RESULTS = ("ok", "diverged", "incompatible")


def runs_not_done(root: Path) -> list[tuple[Path, str]]:
    """Every run folder under ``root`` whose summary is not a result, with its error (or why it cannot be read)."""
    found = []
    for path in sorted(Path(root).rglob(SUMMARY)):
        record, unreadable = read_record_checked(path.parent)
        if record is None:
            found.append((path.parent, str(unreadable)))
        elif record.status not in RESULTS:
            found.append((path.parent, record.error or record.status))
    return found


#: Beside a sweep's runs: the runs it refused to write (a folder holding another config's finished run), one
#: JSON line each, appended by their jobs (in whatever process a launcher runs them) and read when it ends.
REFUSED = ".refused.jsonl"


def note_refused(sweep_dir: Path, run_dir: Path, error: str) -> None:
    """Record in the sweep's folder (not the refused run's) that ``run_dir`` was refused."""
    line = json.dumps({"run_dir": str(run_dir), "error": error}) + "\n"
    with open(Path(sweep_dir) / REFUSED, "a") as f:  # one short append: whole lines from parallel jobs
        f.write(line)


def take_refused(sweep_dir: Path) -> list[tuple[Path, str]]:
    """The runs the sweep refused (:func:`note_refused`), the record removed."""
    path = Path(sweep_dir) / REFUSED
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    path.unlink(missing_ok=True)
    records = [json.loads(line) for line in lines if line.strip()]
    return [(Path(r["run_dir"]), f"refused: {r['error']}") for r in records]


class SweepStatus(Callback):
    """Hydra callback: when a sweep ends, note the runs in its folder that failed or that it refused to
    write, for :func:`exit_if_a_run_failed` (called after Hydra returns, so every other callback has run); the
    report's callback notes its own failure (:func:`report_failed`)."""

    failed: ClassVar[list[tuple[Path, str]]] = []
    report_error: ClassVar[str | None] = None

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        root = Path(config.hydra.sweep.dir)
        SweepStatus.failed = runs_not_done(root) + take_refused(root)


def report_failed(root: Path, error: str) -> None:
    """Note that the report of the sweep in ``root`` could not be written, and why."""
    SweepStatus.report_error = f"the report of {from_cwd(root)} was not written: {error}"


def exit_if_a_run_failed() -> None:
    """Exit 1 when the sweep that just ended left failed runs (listing them) or wrote no report (saying why)."""
    failed, SweepStatus.failed = SweepStatus.failed, []
    report, SweepStatus.report_error = SweepStatus.report_error, None
    lines = "".join(f"\n  {from_cwd(path)}: {error}" for path, error in failed)
    said = [f"{len(failed)} run(s) failed (a diverged run is a result; a failed one is not):{lines}"] if failed else []
    if report is not None or said:
        sys.exit("\n".join([*said, *([report] if report is not None else [])]))
