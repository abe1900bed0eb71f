"""Branches: a run that starts from another run's checkpoint (``train.branch.from=DIR train.branch.step=N``)
and trains on to its own ``train.steps`` under its own schedule: one long WSD run's stable phase, decays
branched from its checkpoints, the loss at several budgets (Hägele et al. 2024; docs/sweeps.md).

The branch takes the checkpoint's model, optimizer (its momentum buffers and step counts), random
generators and loop state, so its steps ``N + 1, ...`` are what the source run's would have been under
the branch's schedule. :func:`check_branch` refuses, before any model is built, a source that is not a run,
a step that is not one of its intact checkpoints, a source config that differs in anything but the steps,
the schedule and the warmup and floor of the rate, a step not below ``train.steps``, and a checkpoint whose
steps trained at rates the branch's schedule does not give them (a WSD checkpoint from inside its decay, a
cosine run's): refused, not warned about, as such a branch is not any run's continuation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.core.errors import ConfigError
from zoo.lab.recipe import Recipe, lr_at
from zoo.lab.records import checkpoint as ckpt
from zoo.lab.records.config import config_differences, differences_text
from zoo.lab.records.metrics import read_metrics
from zoo.lab.records.summary import RunRecord, read_record_checked

#: What a branch may set apart from its source (beside the runtime keys, which change no number): the steps
#: and the rate's schedule. Any other difference would make it another model or another optimizer.
MAY_DIFFER = ("train.steps", "train.budget.", "train.warmup_steps", "train.min_lr_ratio", "train.branch.", "schedule.")


@dataclass(frozen=True)
class Branch:
    """A checked branch: the source run folder, its checkpoint at ``step`` and the source's config hash
    (the checkpoint's)."""

    source: Path
    step: int
    folder: Path
    config_hash: str

    def record(self) -> dict[str, Any]:
        """``summary.json``'s ``branch``: where the source was, and its identity (:func:`identity`)."""
        return {"from": str(self.source.absolute()), **checkpoint_identity(self.source, self.step)}


def checkpoint_identity(source: Path, step: int) -> dict[str, Any]:
    """What names a branch's start whatever the source's path: the source's config hash, the step and the
    checksum of that checkpoint's manifest (which holds every file's sha256)."""
    record, _ = read_record_checked(source) if source.is_dir() else (None, None)
    manifest = ckpt.step_dir(source, step) / ckpt.MANIFEST
    checksum = hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None
    return {"config_hash": record.config_hash if record else None, "step": step, "checksum": checksum}


def identity(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The branch identity of a run config (None: not a branch), read from its source without loading it."""
    source, step = branch_options(raw.get("train"))
    return None if source is None or step is None else checkpoint_identity(Path(source).expanduser(), step)


def same_start(recorded: dict[str, Any] | None, current: dict[str, Any] | None) -> bool:
    """Whether a recorded ``branch`` and a config's :func:`identity` name the same start (keys a record made
    before checksums has not are not compared)."""
    if recorded is None or current is None:
        return recorded is None and current is None
    return all(recorded.get(k) == v for k, v in current.items() if k in recorded)


#: ``train.branch.step``'s word for the step where this run's WSD decay starts.
DECAY = "decay"


def branch_options(train: Any) -> tuple[str | None, int | None]:
    """``train.branch``'s ``from`` and ``step`` (both None: not a branch), their types checked."""
    section = (train or {}).get("branch") if isinstance(train, dict) else None
    if section is None:
        return None, None
    if not isinstance(section, dict) or set(section) - {"from", "step"}:
        raise ConfigError("train.branch", section, "a mapping of from (a run folder) and step (one of its checkpoints)")
    source, step = section.get("from"), section.get("step")
    if source is not None and not isinstance(source, str):
        raise ConfigError("train.branch.from", source, "a run folder (a path)")
    if (source is None) != (step is None):
        field, value = ("train.branch.step", step) if source is None else ("train.branch.from", source)
        other = "train.branch.from" if source is None else "train.branch.step"
        raise ConfigError(field, value, f"needs {other} too: a branch starts from one checkpoint of one run")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        allowed = f"the step of one of train.branch.from's checkpoints (an integer), or {DECAY} (a WSD decay's start)"
        raise ConfigError("train.branch.step", step, allowed)
    return source, step


def resolve_branch(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with ``train.branch`` as one run folder and one step: a ``from`` that is a sweep folder (no
    summary.json of its own) becomes the one run under it of this config but for what a branch may change
    (:data:`MAY_DIFFER`); ``step: decay`` becomes the step where this run's WSD decay starts. A ladder's budgets
    branch this way from its longest runs (zoo/lab/training/ladder_runs.py)."""
    section = (raw.get("train") or {}).get("branch")
    if not isinstance(section, dict) or section.get("from") is None:
        return raw
    source, step = section["from"], section.get("step")
    folder = Path(str(source)).expanduser()
    if folder.is_dir() and not (folder / "summary.json").is_file() and any(folder.glob("*/summary.json")):
        folder = matching_run(folder, raw, str(source))  # a sweep folder: its run of this config
    if step == DECAY:
        step = decay_step(raw)
    return {**raw, "train": {**raw["train"], "branch": {**section, "from": str(folder), "step": step}}}


def decay_start(raw: dict[str, Any], field: str, value: Any, allowed: str) -> Callable[[int], int]:
    """The run's WSD schedule's ``decay_start(steps)``; for another schedule ConfigError(``field``, ``value``,
    ``allowed``) naming it."""
    schedule = Recipe(schedule=raw.get("schedule") or {"name": "cosine"}).schedule_entry()
    start = getattr(schedule, "decay_start", None)
    if start is None:
        name = (raw.get("schedule") or {}).get("name", "cosine")
        raise ConfigError(field, value, f"{allowed}, not {name}'s")
    return start


def decay_step(raw: dict[str, Any]) -> int:
    """The step where the run's WSD decay starts (``train.branch.step: decay``); refused for another schedule."""
    from zoo.lab.planning.train_config import TrainConfig

    start = decay_start(raw, "train.branch.step", DECAY, "a WSD schedule's decay start (schedule=wsd)")
    return int(start(TrainConfig.from_config(raw.get("train")).steps))


def matching_run(sweep: Path, raw: dict[str, Any], source: str) -> Path:
    """The one run folder under ``sweep`` (its own runs, not a nested sweep's) whose config is ``raw``'s but for
    what a branch may change; refused by name when there is none or more than one."""
    found = []
    for summary in sorted(sweep.glob("*/summary.json")):
        record, _ = read_record_checked(summary.parent)
        ok = record is not None and record.config is not None and record.status == "ok"
        if ok and not differing(record.config, raw):  # type: ignore[union-attr]
            found.append(summary.parent)
    if len(found) != 1:
        what = "no finished run" if not found else f"{len(found)} runs ({', '.join(p.name for p in found[:3])})"
        why = ("a run folder, or a sweep folder holding one finished run of this config but for its steps and "
               f"schedule: it holds {what}")
        raise ConfigError("train.branch.from", source, why)
    return found[0]


def differing(theirs: dict[str, Any], raw: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The keys where a source's config differs from ``raw`` beyond what a branch may change."""
    return {
        k: values
        for k, values in config_differences(theirs, raw).items()
        if not any(k == d or (d.endswith(".") and k.startswith(d)) for d in MAY_DIFFER)
        and k != "schedule"  # the default schedule, left out of both
    }


def check_branch(raw: dict[str, Any], train: Any, recipe: Recipe, *, world: int) -> Branch | None:
    """The run's branch, checked against its source (no tensor work: the checkpoint's files are verified
    against their manifest, nothing is loaded); None when ``train.branch`` is unset."""
    source, step = branch_options(raw.get("train"))
    if source is None or step is None:
        return None
    if train.budget_tokens is not None or train.budget_flops is not None:
        raise ConfigError("train.budget", raw["train"].get("budget"), "null for a branch: set train.steps")
    if not 0 < step < train.steps:
        raise ConfigError("train.branch.step", step, f"in 1..{train.steps - 1}: below train.steps={train.steps}")
    folder = Path(source)
    record, problem = read_record_checked(folder) if folder.is_dir() else (None, "not a folder")
    if record is None or record.config is None or not record.config_hash:
        why = problem or "its summary.json holds no config"
        raise ConfigError("train.branch.from", source, f"a run folder (summary.json, checkpoints/): {why}")
    intact = [int(p.name.removeprefix("step_")) for p in ckpt.checkpoints(folder) if ckpt.verify_checkpoint(p) is None]
    if step not in intact:
        listed = ", ".join(map(str, intact)) or "none (keep more with train.keep_checkpoints in the source run)"
        raise ConfigError("train.branch.step", step, f"the step of an intact checkpoint of {source}: {listed}")
    checkpoint = ckpt.step_dir(folder, step)
    ckpt.check_checkpoint(checkpoint, config_hash=record.config_hash, world_size=world)
    check_same_run(raw, record.config, source)
    check_same_rates(record, train, recipe, step, source)
    return Branch(folder, step, checkpoint, record.config_hash)


def check_same_run(raw: dict[str, Any], theirs: dict[str, Any], source: str) -> None:
    """Refuse a source whose config differs from this run's in more than :data:`MAY_DIFFER`, naming each key."""
    differ = differing(theirs, raw)
    if differ:
        shown = differences_text(differ, 5)
        raise ConfigError(
            "train.branch.from", source,
            "a run of this config but for train.steps, train.budget, train.warmup_steps, train.min_lr_ratio and "
            f"the schedule (a branch continues its model and optimizer); it differs in {shown}",
        )  # fmt: skip


def check_same_rates(record: RunRecord, train: Any, recipe: Recipe, step: int, source: str) -> None:
    """Refuse a checkpoint whose steps trained at other rates than this run's schedule gives them: the branch
    must continue the source's schedule up to ``step`` (WSD: a checkpoint of its warmup or stable phase)."""
    from zoo.lab.planning.train_config import TrainConfig

    config = record.config or {}
    theirs = TrainConfig.from_config(config.get("train"))
    steps = (record.budget or {}).get("steps") or theirs.steps  # as their budget set them
    their_train = TrainConfig(steps=steps, lr=theirs.lr, warmup_steps=theirs.warmup_steps,
                              min_lr_ratio=theirs.min_lr_ratio)  # fmt: skip
    their_schedule = Recipe(schedule=config.get("schedule") or {"name": "cosine"}).schedule_entry()
    schedule = recipe.schedule_entry()
    for s in range(step):
        was, now = lr_at(their_schedule, s, their_train), lr_at(schedule, s, train)
        if abs(was - now) > 1e-12 * max(abs(was), abs(now)):
            start = getattr(their_schedule, "decay_start", None)
            hint = f"; its decay starts at step {start(steps)}: branch from a checkpoint before it" if start else ""
            raise ConfigError(
                "train.branch.step", step,
                f"a checkpoint of {source} whose steps trained at this run's rates: at step {s} it trained at lr "
                f"{was:.6g}, this run's schedule gives {now:.6g}{hint}",
            )  # fmt: skip


def source_metrics(branch: Branch) -> list[dict[str, Any]]:
    """The source's metrics records up to the branch's step: the start of the branch's curve."""
    return [r for r in read_metrics(branch.source) if r.get("step", 0) <= branch.step]


def load_branch(branch: Branch, model: Any, optimizer: Any, *, world: int) -> ckpt.TrainState:
    """Load the source checkpoint's model and optimizer (each file checked again against its manifest);
    returns its TrainState (generators and loop state) for the trainer to continue from."""
    return ckpt.load_checkpoint(branch.folder, model, optimizer, config_hash=branch.config_hash, world_size=world)
