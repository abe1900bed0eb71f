"""A sweep's runs named by their variant (zoo.lab.planning.named): each run's recorded ``variant``, else the name
the sweep's ``variants.json`` gives its folder (a run the sweep skipped because a grid run of the same config had
finished there). Read back checked: a file that is not the mapping a sweep writes is ignored with a warning."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zoo.core.errors import ConfigError
from zoo.lab.planning.named import VARIANT, collide, named_variants, override_key
from zoo.lab.planning.sweeper import VARIANTS_FILE
from zoo.lab.studies.runset import Run

log = logging.getLogger("zoo.lab.studies.named")


def read_variants(root: Path) -> tuple[dict[str, list[str]], dict[str, str]]:
    """``(variants, folders)`` of ``root``'s ``variants.json``; empty without one (or with one that does not check)."""
    path = root / VARIANTS_FILE
    if not path.is_file():
        return {}, {}
    try:
        data: Any = json.loads(path.read_text())
        variants, folders = data["variants"], data["folders"]
        lists = all(isinstance(v, list) and all(isinstance(o, str) for o in v) for v in variants.values())
        ok = lists and all(isinstance(k, str) and v in variants for k, v in folders.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        log.warning("%s is not a sweep's named variants: left out", path)
        return {}, {}
    return variants, folders


def name_runs(root: Path, runs: Sequence[Run]) -> tuple[dict[str, list[str]], list[Run]]:
    """Each run's ``variant`` set (its recorded one, else its folder's in ``variants.json``): ``(variants, runs
    without a name)``. A sweep without named variants: ``({}, [])``, its runs untouched."""
    variants, folders = read_variants(root)
    for run in runs:
        if VARIANT not in run.overrides and run.path.name in folders and run.path.parent == root:
            run.overrides[VARIANT] = folders[run.path.name]
    if not variants and not any(VARIANT in run.overrides for run in runs):
        return {}, []
    for run in runs:
        name = run.overrides.get(VARIANT)
        if name is not None and name not in variants:
            variants[name] = recorded_overrides(run).get(name, [])
    return variants, [run for run in runs if VARIANT not in run.overrides]


def recorded_overrides(run: Run) -> dict[str, list[str]]:
    """The named variants a run was launched with (its recorded ``variants`` or ``ablate``), {} when none read."""
    config = run.record.config or {}
    try:
        return named_variants(config.get("variants"), config.get("ablate")) or {}
    except ConfigError:
        return {}


def set_by_variants(key: str, variants: dict[str, list[str]]) -> bool:
    """Whether some variant's overrides set ``key`` (then it is part of the variant, not an axis of its own)."""
    return any(collide(override_key(key), override_key(o)) for change in variants.values() for o in change)


def first_named(variants: dict[str, list[str]], runs: Sequence[Run]) -> dict[str, str] | None:
    """The report's default baseline in a sweep of named variants: the first that has runs; None for a grid."""
    name = next((n for n in variants if any(r.overrides.get(VARIANT) == n for r in runs)), None)
    return {VARIANT: name} if name is not None else None
