"""A sweep checked before any of its runs (tuning runs too), by :class:`SweepCheck`: its own sections against the
axes it sweeps (its sweep file's ``hydra.sweeper.params`` and its command line's): ``report`` (its options, a
baseline of values the sweep has, an interaction of two of its axes), ``tune`` (its rates and seeds) and ``ladder``
(a ladder that could not be fitted or branched: fewer than 2 shorter budgets or 3 widths, a schedule other than
WSD, or a decay start without a checkpoint kept to branch from); then every job's run config
(zoo.lab.planning.jobs), and the tuning sweep of ``tune.lr`` the same way. None of the sections changes a run,
and none names a run folder (zoo.lab.keys.names_folder): a mistake in one, or in one job's value, would otherwise
show only after every run.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from zoo.core.errors import ConfigError
from zoo.lab.keys import NOT_AXES, run_folder_name
from zoo.lab.planning.branch import decay_start
from zoo.lab.planning.gates import check_gates
from zoo.lab.planning.jobs import (
    Job,
    check_jobs,
    checked_selection,
    forget_composed,
    group_finder,
    job_configs,
    sweep_jobs,
)
from zoo.lab.planning.options import (
    TUNE_DIR,
    check_interaction,
    ladder_options,
    report_interaction,
    report_options,
    tune_options,
)
from zoo.lab.planning.run_model import with_task_vocab
from zoo.lab.planning.tuning import search_argv
from zoo.lab.records.config import config_differences, differences_text
from zoo.lab.records.settings import parse_overrides, setting
from zoo.lab.records.summary import RunRecord, read_record

log = logging.getLogger("zoo.lab.planning.sweep")

#: The fewest widths a ladder fits (zoo.lab.studies.ladder.study.MIN_RUNGS, without importing numpy here).
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
    budgets = check_ladder(raw, swept_values(config, "block.d_model"))
    report = raw.get("report") or {}
    check_gates(report.get("gates"), swept_axes(config), bool(budgets), report.get("target") is not None)


def check_before_any_run(config: DictConfig) -> None:
    """The sweep's sections (:func:`check_sweep`), every job's run config and the report's baseline against the
    values the jobs give (:func:`check_baseline`), then the tuning sweep of ``tune.lr`` the same way."""
    check_sweep(config)
    jobs = checked_jobs(config)
    check_run_folders(jobs)
    check_baseline(config, jobs, earlier_runs(Path(config.hydra.sweep.dir)))
    tuning = tuning_sweep(config)
    if tuning is not None:
        width = OmegaConf.select(config, "tune.width")
        where = f"in the tuning sweep of tune.lr{f' at tune.width={width}' if width is not None else ''}"
        try:
            check_sweep(tuning)
            checked_jobs(tuning)
        except ConfigError as error:
            raise ConfigError(error.field, error.value, f"{error.allowed}; {where}") from None


def checked_jobs(config: DictConfig) -> list[Job]:
    """The sweep's jobs, each run config checked (zoo.lab.planning.jobs: a grid of many combinations of parts on the
    first run of each value); none under a sweeper that does not say."""
    launched = sweep_jobs(config) or []
    forget_composed(config)  # only what this check composes is known to compose now
    if not launched:
        return []
    is_group = group_finder(config)  # Hydra's repository of config groups, read once for the check
    selected = checked_selection(config, launched, is_group)
    if len(selected) < len(launched):
        log.info("checking %d of the %d runs' configs before any run: the first run of each value", len(selected),
                 len(launched))  # fmt: skip
    jobs = list(job_configs(config, selected, is_group))
    check_jobs(config, jobs, launched)
    return jobs


def check_run_folders(jobs: Sequence[Job]) -> None:
    """Two jobs of different run configs (as a run compares them: zoo.lab.records.config) named to one run folder (its
    name leaves out the sweep file and the runtime keys): a ConfigError naming the key left out, before any run (the
    second run would be refused there after the first trained)."""
    first_in: dict[str, Job] = {}
    for job in jobs:
        folder = run_folder_name(job.overrides)
        first = first_in.setdefault(folder, job)
        if first is job:
            continue
        differ = config_differences(with_task_vocab(first.config), with_task_vocab(job.config))
        if differ:
            apart = [o for o in job.overrides if o not in first.overrides]
            key = apart[0].partition("=")[0].lstrip("+~") if apart else "hydra.sweep.subdir"
            shown = " ".join(o for o in first.overrides if o not in job.overrides)
            raise ConfigError(key, parse_overrides(apart).get(key, folder), f"the runs {shown} and {' '.join(apart)} "
                              f"differ ({differences_text(differ, 2)}) but share the run folder {folder}, whose name "
                              f"leaves out {key}: sweep each in a sweep of its own")  # fmt: skip


def tuning_sweep(config: DictConfig) -> DictConfig | None:
    """The tuning sweep's config as its own process will compose it (zoo.lab.planning.tuning); None without
    ``tune.lr``."""
    rates, seeds = tune_options(OmegaConf.to_container(config.tune, resolve=True) if "tune" in config else None)
    if rates is None:
        return None
    argv = search_argv(config, Path(config.hydra.sweep.dir) / TUNE_DIR, rates, seeds)
    loader = GlobalHydra.instance().config_loader()
    return loader.load_configuration(config.hydra.job.config_name, [a for a in argv if a != "-m"], RunMode.MULTIRUN)


def earlier_runs(sweep_dir: Path) -> list[RunRecord]:
    """The records of the runs a sweep folder already holds (a sweep run again into it reports them too)."""
    records = (read_record(path.parent) for path in sorted(sweep_dir.glob("*/summary.json")))
    return [record for record in records if record is not None]


def check_baseline(config: DictConfig, jobs: Sequence[Job], earlier: Sequence[RunRecord] = ()) -> None:
    """``report.baseline``: each axis one the report will have (a key whose value differs between the runs, the
    jobs' and ``earlier`` runs' in the folder) and each value one of its values; a ConfigError names the swept
    axes and their values."""
    section = OmegaConf.to_container(config.report, resolve=True) if "report" in config else None
    baseline = report_options(section)[0]
    if not baseline or not jobs:
        return
    runs = [(parse_overrides(j.overrides), j.choices, j.config) for j in jobs]
    runs += [(parse_overrides(r.overrides or []), r.choices or {}, r.config or {}) for r in earlier]
    keys = [*dict.fromkeys(k for overrides, _, _ in runs for k in overrides if k not in NOT_AXES), *baseline]
    values = {key: list(dict.fromkeys(setting(key, *run) for run in runs)) for key in keys}
    swept = "; ".join(f"{key}: {', '.join(seen)}" for key, seen in values.items() if len(seen) > 1) or "none"
    for axis, value in baseline.items():
        if len(values[axis]) < 2:
            why = f"{axis} is not a swept axis ({values[axis][0]} in every run); swept: {swept}"
            raise ConfigError("report.baseline", f"{axis}={value}", why)
        if value not in values[axis]:
            why = f"one of {axis}'s values: {', '.join(values[axis])} (swept: {swept})"
            raise ConfigError("report.baseline", f"{axis}={value}", why)


class SweepCheck(Callback):
    """Hydra callback, first of all: refuse a sweep whose report, tuning, ladder or any run's config could not
    work, before any run (:func:`check_before_any_run`), in one line on stderr."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_before_any_run(config)
        except ConfigError as error:
            sys.exit(f"zoo-sweep: refused before any run: {error}")
