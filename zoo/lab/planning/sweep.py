"""A sweep's own sections checked before any of its runs (tuning runs too), by :class:`SweepCheck`: which axes
it sweeps (its sweep file's ``hydra.sweeper.params`` and its command line's), ``report`` (its options, and
an interaction of two of those axes), ``tune`` (its rates and seeds) and ``ladder`` (a ladder that could not
be fitted or branched: fewer than 2 shorter budgets or 3 widths, a schedule other than WSD, or a decay start
without a checkpoint kept to branch from). None of them changes a run, and none names a run folder
(zoo.lab.keys.names_folder): a mistake in one would otherwise show only in the report, after every run.
"""

from __future__ import annotations

import sys
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from zoo.core.errors import ConfigError
from zoo.lab.keys import NOT_AXES
from zoo.lab.planning.branch import decay_start
from zoo.lab.planning.options import (
    check_interaction,
    ladder_options,
    report_interaction,
    report_options,
    tune_options,
)

#: The fewest widths a ladder fits (zoo.lab.studies.ladder.MIN_RUNGS, without importing numpy here).
MIN_WIDTHS = 3


def swept_values(config: DictConfig, key: str) -> list[str]:
    """The values a sweep gives ``key``: its command line's, else its sweep file's ``hydra.sweeper.params``."""
    for override in config.hydra.overrides.task:
        if override.startswith(f"{key}="):
            return override.split("=", 1)[1].split(",")
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    value = params.get(key)
    return str(value).split(",") if value is not None else [str(OmegaConf.select(config, key))]


def swept_axes(config: DictConfig) -> list[str]:
    """The keys a sweep gives several values (``mlp=gelu,swiglu``, ``optim=glob(*)``): its sweep file's, then
    its command line's (which overrides the file's), less those that are not axes (seeds, the sweep file)."""
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    lines = [f"{key}={value}" for key, value in params.items()] + list(config.hydra.overrides.task)
    values = {o.key_or_group: o.is_sweep_override() for o in OverridesParser.create().parse_overrides(lines)}
    return [key for key, swept in values.items() if swept and key not in NOT_AXES]


def decay_starts(config: dict[str, Any], budgets: list[int]) -> dict[int, int]:
    """``{budget: the step its WSD decay starts}``; refused when the schedule is not WSD."""
    name = (config.get("schedule") or {}).get("name", "cosine")
    start = decay_start(config, "schedule", name, "wsd for a ladder (its budgets branch from the stable phase)")
    return {b: int(start(b)) for b in budgets}


def check_ladder(config: dict[str, Any], widths: list[str]) -> list[int]:
    """The ladder's shorter budgets, checked before any run (ConfigError names the key); [] for no ladder."""
    train = config.get("train") or {}
    steps = int(train.get("steps", 0))
    budgets, _ = ladder_options(config.get("ladder"), steps)
    if not budgets:
        return []
    if len(set(widths)) < MIN_WIDTHS:
        raise ConfigError("block.d_model", ",".join(widths), f"at least {MIN_WIDTHS} widths for a ladder's fit")
    starts = decay_starts(config, budgets)
    every, keep = int(train.get("checkpoint_every") or 0), int(train.get("keep_checkpoints") or 0)
    first = min(starts.values())
    if every <= 0 or any(s % every for s in starts.values()):
        why = f"a divisor of every branch's start, {sorted(starts.values())} (ladder.steps={budgets})"
        raise ConfigError("train.checkpoint_every", every, why)
    needed = (steps - 1) // every - first // every + 1
    if 0 < keep < needed:
        why = f"at least {needed}: the checkpoints from step {first} on, where the branches start"
        raise ConfigError("train.keep_checkpoints", keep, why)
    return budgets


def check_sweep(config: DictConfig) -> None:
    """The sweep's ``report``, ``tune`` and ``ladder`` sections against its axes (ConfigError names the key)."""
    keys = [k for k in ("train", "report", "tune", "ladder", "schedule") if k in config]
    raw: dict[str, Any] = {k: OmegaConf.to_container(config[k], resolve=True) for k in keys}
    report_options(raw.get("report"))
    named = report_interaction((raw.get("report") or {}).get("interaction"))
    if named:
        check_interaction(named, swept_axes(config))
    tune_options(raw.get("tune"))
    check_ladder(raw, swept_values(config, "block.d_model"))


class SweepCheck(Callback):
    """Hydra callback, first of all: refuse a sweep whose report, tuning or ladder could not work, before any
    run (:func:`check_sweep`), in one line on stderr."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_sweep(config)
        except ConfigError as error:
            sys.exit(f"zoo-sweep: refused before any run: {error}")
