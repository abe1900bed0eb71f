"""What a sweep held fixed: the settings every run shares that differ from zoo's defaults.

The report's table shows what varies; a value set on every run (by the sweep file or the command
line, e.g. ``block.placement.alpha=2.0``) would otherwise be on no page. Each group choice shared by
every run is compared with zoo's default choice (``norm=rmsnorm``), and every other value with what
that choice composes to, so a part's own option defaults are not listed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from omegaconf import OmegaConf

from zoo.assembly.compose import compose_with_choices
from zoo.core.errors import ConfigError
from zoo.lab.keys import RUNTIME
from zoo.lab.planning.run_model import task_vocab_size
from zoo.lab.records.config import flatten
from zoo.lab.studies.runset import Run

log = logging.getLogger("zoo.lab.studies.fixed")

#: Group choices that say how a sweep was launched, not what its runs compute.
LAUNCH_CHOICES = ("sweeps",)
#: The model's vocabulary: null by default, recorded as the task's (zoo.lab.planning.run_model).
VOCAB = "model.vocab_size"
_MISSING = object()


def shared(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The key-value pairs every mapping of ``items`` has."""
    if not items:
        return {}
    return {k: v for k, v in items[0].items() if all(other.get(k, _MISSING) == v for other in items[1:])}


def fixed_settings(runs: Iterable[Run]) -> list[str]:
    """``key=value`` for each setting every run shares that differs from zoo's defaults, group choices
    first (``placement=deepnorm``), then values (``block.placement.alpha=2.0``); runtime-only keys
    (threads, progress) left out. Empty when the defaults no longer compose (e.g. a plugin is gone)."""
    runs = [r for r in runs if r.record.config is not None]
    if not runs:
        return []
    choices = shared([r.record.choices or {} for r in runs])
    choices = {k: v for k, v in choices.items() if k not in LAUNCH_CHOICES}
    try:
        _, default_choices = compose_with_choices()
        reference_cfg, _ = compose_with_choices([f"{k}={v}" for k, v in choices.items() if v is not None])
    except Exception as error:  # the report must not fail on this line
        log.warning("fixed settings left out of the report: %s: %s", type(error).__name__, error)
        return []
    reference = flatten(OmegaConf.to_container(reference_cfg, resolve=True))
    if reference.get(VOCAB) is None and all(takes_task_vocab(r) for r in runs):
        reference.pop(VOCAB)  # model.vocab_size: null, recorded as each run's task's: not a setting of its own
    lines = [f"{k}={v}" for k, v in choices.items() if v != default_choices.get(k)]
    for key, value in shared([flatten(r.record.config or {}) for r in runs]).items():
        if key == VOCAB and VOCAB not in reference:
            continue
        if key.split(".")[0] not in RUNTIME and reference.get(key, _MISSING) != value:
            lines.append(f"{key}={value}")
    return lines


def takes_task_vocab(run: Run) -> bool:
    """Whether the run's ``model.vocab_size`` is its task's vocabulary (what the default, null, records)."""
    config = run.record.config or {}
    try:
        return (config.get("model") or {}).get("vocab_size") == task_vocab_size(config.get("task"))
    except ConfigError:  # the task no longer reads (its data moved): the value is shown
        return False


def fixed_line(runs: Iterable[Run]) -> list[str]:
    """The report's lines under its table: a blank line and the fixed settings (none when there are none)."""
    settings = fixed_settings(runs)
    return ["", f"Fixed in every run (not zoo's defaults): {', '.join(settings)}"] if settings else []
