"""Run folder locks: one process at a time trains a run folder.

The process that writes a run (rank 0 under torchrun) holds an exclusive ``flock`` on ``.lock`` in
the run folder while it trains. The kernel releases the lock when the process ends, however it ends
(``kill -9`` included), so a lock is never stale: a lock file left by a killed process is free to
take. Acquiring never blocks: a second sweep skips a run another process holds, and
:class:`WaitForRuns` waits for those at the end of the sweep, before its report.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from zoo.lab.files import from_cwd
from zoo.lab.records.metrics import read_metrics
from zoo.lab.records.summary import read_record

log = logging.getLogger("zoo.lab.records.lock")

LOCK = ".lock"


class RunLock:
    """An exclusive, non-blocking ``flock`` on ``run_dir/.lock``; the file is removed on release."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock; False when another process holds it (nothing is written then)."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this RunLock")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if attempt > 0:  # a second refusal: held (the first may be a momentary probe by held())
                    return False
                time.sleep(0.05)
                continue
            if same_file(fd, self.path):
                self._fd = fd
                os.ftruncate(fd, 0)
                os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.ctime()}\n".encode())
                return True
            os.close(fd)  # its holder removed the file as this process opened it: open the new one
        return False

    def release(self) -> None:
        """Remove the lock file (while still holding it, so no other process holds a removed file), then unlock."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def same_file(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path`` (not one removed since it was opened)."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def holder(run_dir: Path) -> str:
    """Who holds ``run_dir``'s lock, as its holder wrote it (``pid 123 on host, since ...``)."""
    try:
        text = (Path(run_dir) / LOCK).read_text().strip()
    except (FileNotFoundError, UnicodeDecodeError):
        text = ""
    return text or "another process"


def held(run_dir: Path) -> bool:
    """Whether another process holds ``run_dir``'s lock now (probed with a momentary lock of its own)."""
    try:
        fd = os.open(Path(run_dir) / LOCK, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases the probe's lock
    return False


def held_runs(root: Path) -> list[Path]:
    """The run folders under ``root`` that another process holds."""
    return sorted(path.parent for path in Path(root).rglob(LOCK) if held(path.parent))


@contextmanager
def report_lock(root: Path) -> Iterator[None]:
    """Hold ``root/.report.lock`` (blocking: the other holder writes for a second or two) while writing the
    report of the sweep folder ``root``, so that two sweeps into one folder never write its files at once."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".report.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def progress(run_dir: Path) -> str:
    """``step 40 of 200`` from what the run has recorded so far."""
    records = read_metrics(run_dir)
    record = read_record(run_dir)
    steps = record.config_value("train.steps") if record is not None else None
    if not records:
        return "starting"
    return f"step {records[-1].get('step')}" + (f" of {steps}" if steps else "")


def wait_for(
    runs: list[Path], *, show: Callable[[Path], str] = str, poll: float = 1.0, every: float = 30.0
) -> dict[Path, str]:
    """Wait until no other process holds any of ``runs``, logging which, with their progress every
    ``every`` seconds and each as it ends; returns each run's status when it ended."""
    waiting, ended = list(runs), {}
    log.info("waiting for %d run(s) that another process trains: %s", len(waiting), ", ".join(map(show, waiting)))
    last = time.monotonic()
    while waiting:
        for run_dir in [r for r in waiting if not held(r)]:
            waiting.remove(run_dir)
            record = read_record(run_dir)
            ended[run_dir] = record.status if record is not None else "not started"
            note = "" if ended[run_dir] != "running" else ": its process ended before the run did (resumed next time)"
            log.info("%s ended: %s%s (%d of %d)", show(run_dir), ended[run_dir], note, len(ended), len(runs))
        if waiting and time.monotonic() - last >= every:
            log.info("still waiting for: %s", ", ".join(f"{show(r)} ({progress(r)})" for r in waiting))
            last = time.monotonic()
        if waiting:
            time.sleep(poll)
    return ended


class WaitForRuns(Callback):
    """Hydra callback: when a sweep ends, wait for the runs in its folder that another process still
    trains (a second sweep into the same folder skipped them), so that the report includes them."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        runs = held_runs(Path(config.hydra.sweep.dir))
        if runs:
            wait_for(runs, show=lambda path: str(from_cwd(path)))
