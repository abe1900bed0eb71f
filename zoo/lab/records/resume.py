"""Where a run continues from: the newest intact checkpoint of its folder (checked against its config and world
size), and the data it trained on, the same as the data read now."""

from __future__ import annotations

import logging
from pathlib import Path

from zoo.lab.files import shown
from zoo.lab.records import checkpoint as ckpt
from zoo.lab.records.summary import RunRecord, read_record

log = logging.getLogger("zoo.lab.training.run")


class Refused(Exception):
    """The run may not write its folder (zoo.lab.training.run.refuse): raised where that is found out after planning."""


def check_same_data(out_dir: Path, record: RunRecord) -> None:
    """Refuse to resume a run on other data than its checkpoints trained on (its relative ``task.path`` read
    from another working folder, say), naming both hashes."""
    prior = read_record(out_dir)
    before = (prior.data or {}).get("sha256") if prior is not None else None
    data = record.data or {}
    now = data.get("sha256")
    if before is not None and now != before:
        where = (data.get("paths") or {}).get("path") or "the data read"
        raise Refused(
            f"holds a resumable run that trained on other data (sha256 {before}; {where} has {now}): resume it "
            "where its task.path names that data"
        )


def find_checkpoint(out_dir: Path, record: RunRecord, world: int, resume: bool) -> Path | None:
    """The checkpoint to continue from: the newest intact one in ``out_dir`` (checked against this config
    and world size: another's is refused), or None. Those that fail their check are logged, recorded in
    ``record.resume_skipped`` and deleted. Without ``resume`` the folder's checkpoints are deleted."""
    ckpt.remove_stale(out_dir)
    if not resume:
        ckpt.clear_checkpoints(out_dir)
        return None
    chosen, failed = ckpt.choose_checkpoint(out_dir, config_hash=record.config_hash, world_size=world)
    for name, problem in failed.items():
        log.warning("%s: not resuming from %s: %s", shown(out_dir), name, problem)
    if failed:
        record.resume_skipped = failed
        if chosen is None:
            log.warning("%s: no intact checkpoint: training from step 0", shown(out_dir))
    return chosen


def resumed_text(folder: Path, record: RunRecord) -> str:
    """``step_000120`` (and which newer checkpoints failed their check: find_checkpoint logged why)."""
    failed = record.resume_skipped or {}
    return folder.name + (f" (newer ones failed their check: {', '.join(failed)})" if failed else "")
