"""A sweep's jobs as Hydra's basic sweeper launches them, each one's run config checked before any run.

:func:`sweep_jobs` lists the jobs (the product of the sweep file's ``hydra.sweeper.params`` and the command
line's values, as ``BasicSweeper.split_arguments`` makes it); :func:`job_configs` composes each job's config, once
per choice of config groups (a job's other overrides are then set on a copy, as Hydra sets them after composing);
:func:`check_jobs` checks each as its run will (:func:`zoo.lab.planning.plan.plan_run`, tensor-free). A combination
of parts the compatibility map refuses is a result of the grid (its run records it), not a mistake.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from zoo.core.errors import ConfigError, IncompatibleParts
from zoo.core.options import check_type
from zoo.lab.keys import REPLICATES
from zoo.lab.planning.branch import resolve_branch
from zoo.lab.planning.named import SWEEPER_NAME, VARIANT, sweep_job_lists
from zoo.lab.planning.plan import plan_run
from zoo.lab.planning.run_model import with_task_vocab
from zoo.lab.records.settings import UNSET, parse_overrides, setting

#: Launchers whose jobs run on this machine: a job's ``device`` is checked against it (another launcher's jobs
#: run elsewhere, a SLURM node with GPUs launched from a login node without).
HERE = ("BasicLauncher", "JoblibLauncher", "LocalLauncher")


@dataclass(frozen=True)
class Job:
    """One job of a sweep: its overrides (as Hydra names its run), its run config (resolved) and its group
    choices."""

    overrides: tuple[str, ...]
    config: dict[str, Any]
    choices: dict[str, str]

    def setting(self, key: str) -> str:
        """The job's setting of ``key`` as its run's report will read it (zoo.lab.records.settings)."""
        return setting(key, parse_overrides(self.overrides), self.choices, self.config)


def sweep_jobs(config: DictConfig) -> list[list[str]] | None:
    """Each job's overrides, in launch order (a sweep's named variants: zoo.lab.planning.named); None under another
    sweeper than Hydra's basic one or zoo's (whose jobs are not known before it runs)."""
    target = str(OmegaConf.select(config, "hydra.sweeper._target_", default="") or "")
    if not target.endswith((BasicSweeper.__name__, SWEEPER_NAME)):
        return None
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    lines = [f"{key}={value}" for key, value in params.items()] + list(config.hydra.overrides.task)
    parsed = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader()).parse_overrides(lines)
    return sweep_job_lists(config, parsed)


def job_configs(
    config: DictConfig, jobs: Sequence[Sequence[str]], is_group: Callable[[str], bool] | None = None
) -> Iterator[Job]:
    """Each job's run config, as Hydra composes it: once per choice of config groups (an override is a group's
    choice where Hydra finds that group, as it decides), the job's other overrides set on a copy (a mistake Hydra
    refuses, an interpolation that does not resolve: a ConfigError naming it). Each job so composed is one of
    :func:`composed_jobs`, unless a seed of it is set otherwise than as a plain ``key=value`` of a key the config
    has (the seeds are set on top, not as Hydra sets them). ``is_group``: the sweep's :func:`group_finder`, if the
    caller has it."""
    loader = GlobalHydra.instance().config_loader()
    parser = OverridesParser.create(config_loader=loader)
    is_group = is_group or group_finder(config)
    done = _COMPOSED.setdefault(sweep_key(config), set())
    composed: dict[tuple[str, ...], tuple[DictConfig, dict[str, str]]] = {}
    variants: dict[tuple[str, ...], dict[str, Any]] = {}
    for job in jobs:
        parsed = parser.parse_overrides(list(job))
        seeds = [o for o in parsed if o.key_or_group in REPLICATES]
        rest = [o for o in parsed if o.key_or_group not in REPLICATES]
        chosen = tuple(o.input_line for o in rest if is_group(o.key_or_group))
        try:
            if chosen not in composed:
                composed[chosen] = without_hydra(loader.load_sweep_config(config, list(chosen)))
            base, choices = composed[chosen]
            variant = tuple(o.input_line for o in rest)
            if variant not in variants:  # a variant's seeds share its config but for the seeds, set on top
                cfg = copy.deepcopy(base)
                ConfigLoaderImpl._apply_overrides_to_config([o for o in rest if not is_group(o.key_or_group)], cfg)
                variants[variant] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
        except (HydraException, OmegaConfBaseException) as error:
            raise ConfigError("the run", " ".join(job), f"does not compose: {error}".replace("\n", " ")) from None
        if all(o.type == OverrideType.CHANGE and o.key_or_group in base for o in seeds):
            done.add(tuple(job))
        yield Job(tuple(job), {**variants[variant], **{o.key_or_group: o.value() for o in seeds}}, choices)


#: The jobs :func:`job_configs` composed, by sweep (:func:`sweep_key`), in this process.
_COMPOSED: dict[tuple[str, ...], set[tuple[str, ...]]] = {}


def composed_jobs(config: DictConfig) -> set[tuple[str, ...]]:
    """The jobs of ``config``'s sweep whose run config :func:`job_configs` composed in this process since its last
    :func:`forget_composed`, as Hydra composes it: Hydra's sweeper composes each job again before launching it, only
    to see that it composes (zoo.lab.planning.sweeper leaves these out)."""
    return _COMPOSED.get(sweep_key(config), set())


def forget_composed(config: DictConfig) -> None:
    """Forget the jobs of ``config``'s sweep composed so far (a new check starts: its option files may have changed
    since the last one)."""
    _COMPOSED.pop(sweep_key(config), None)


def sweep_key(config: DictConfig) -> tuple[str, ...]:
    """A sweep's config as its command line made it: the config's name, then Hydra's overrides and the task's."""
    overrides = config.hydra.overrides
    return (str(config.hydra.job.config_name), *overrides.hydra, "|", *overrides.task)


def group_finder(config: DictConfig) -> Callable[[str], bool]:
    """Whether an override's key names a config group, as Hydra decides when it composes a job of ``config``'s
    sweep (a group under the search path the sweep's Hydra overrides give, chosen by the sweep's config or not)."""
    loader = GlobalHydra.instance().config_loader()
    name, overrides = config.hydra.job.config_name, list(config.hydra.overrides.hydra)
    _, repository = loader._parse_overrides_and_create_caching_repo(name, overrides)  # type: ignore[attr-defined]
    return functools.cache(repository.group_exists)


def without_hydra(config: DictConfig) -> tuple[DictConfig, dict[str, str]]:
    """A job's composed config less Hydra's node, and its group choices (not Hydra's own)."""
    choices = {k: str(v) for k, v in config.hydra.runtime.choices.items() if not k.startswith("hydra/")}
    with open_dict(config):
        del config["hydra"]
    return config, choices


def launched_world(config: DictConfig) -> tuple[int, bool]:
    """(processes per job, whether its jobs run on this machine) under the sweep's launcher: a submitit job's
    tasks (``tasks_per_node`` x ``nodes``), else one."""
    launcher = OmegaConf.select(config, "hydra.launcher") or {}
    target = str(launcher.get("_target_", ""))
    world = int(launcher.get("tasks_per_node") or 1) * int(launcher.get("nodes") or 1) if "submitit" in target else 1
    return world, target.rsplit(".", 1)[-1] in HERE


def check_jobs(config: DictConfig, jobs: Sequence[Job], launched: Sequence[Sequence[str]] | None = None) -> None:
    """Check each job's run config as its run will before any tensor work (the tuning of ``tune.lr`` aside: its
    rate is a learning rate like any other): the first mistake is a ConfigError naming the field, the bad value,
    what is allowed and the runs it refuses among those ``launched`` (default: ``jobs``; :func:`culprit`)."""
    world, here = launched_world(config)
    planned: set[str] = set()  # the configs checked, less their seeds (a variant's seeds are checked once)
    for job in jobs:
        variant = json.dumps({k: v for k, v in job.config.items() if k not in REPLICATES}, sort_keys=True, default=str)
        try:
            if variant in planned:
                check_seeds(job.config)
                continue
            planned.add(variant)
            plan_run(with_task_vocab(resolve_branch(job.config)), job.choices, job.overrides, world=world, here=here)
        except IncompatibleParts:
            continue  # a combination the grid holds and the compatibility map refuses: its run records why
        except ConfigError as error:
            which = culprit(job, error.field, launched if launched is not None else [j.overrides for j in jobs])
            raise ConfigError(error.field, error.value, f"{error.allowed} ({which})") from None


def check_seeds(config: dict[str, Any]) -> None:
    """A job's seeds, as :func:`zoo.lab.planning.train_config.check_run_config` checks them."""
    check_type("seed", config.get("seed", 0), int)
    check_type("data_seed", config.get("data_seed"), int | None)


def culprit(job: Job, field: str, launched: Sequence[Sequence[str]]) -> str:
    """Which of the sweep's runs (``launched``: each one's overrides) a mistake in ``field`` refuses: ``the 12 runs
    with block.attn.gate=head`` (the job's override of that field or of the group that set it, or ``every run``; a
    named variant's: ``variant -gate's block.attn.gate=nne``), else the first run refused."""
    for override in job.overrides:
        key = override.partition("=")[0].lstrip("+~")
        if any(field == k or field.startswith((f"{k}.", f"{k}[")) for k in (key, f"block.{key}")):
            if (name := job.setting(VARIANT)) != UNSET and key != VARIANT:
                return f"variant {name}'s {override}"
            count = sum(override in other for other in launched)
            if count == len(launched):
                return "every run"
            return f"the {count} run{'s' if count > 1 else ''} with {override}"
    swept = swept_keys(launched)
    shown = " ".join(o for o in job.overrides if o.partition("=")[0].lstrip("+~") in swept)
    return f"first refused: the run {shown}" if shown else "every run"


def swept_keys(launched: Sequence[Sequence[str]]) -> set[str]:
    """The keys the jobs' overrides give more than one value (``+`` and ``~`` stripped)."""
    values: dict[str, set[str]] = {}
    for overrides in launched:
        for key, value in parse_overrides(overrides).items():
            values.setdefault(key, set()).add(value)
    return {key for key, seen in values.items() if len(seen) > 1}


#: The most choices of config groups a sweep's check composes one by one (each takes Hydra a composition, as long
#: as a run's start): a grid of more (``sweeps/card.yaml``'s every combination of parts) is checked on the first
#: run of each of its values (:func:`covering`), its other combinations by their own runs.
MAX_COMPOSED = 64


def checked_selection(
    config: DictConfig, launched: Sequence[Sequence[str]], is_group: Callable[[str], bool] | None = None
) -> list[Sequence[str]]:
    """The jobs a sweep's check composes: every one, unless they choose more than :data:`MAX_COMPOSED` different
    config groups, then :func:`covering`'s (``is_group``: the sweep's :func:`group_finder`, if the caller has it)."""
    is_group = is_group or group_finder(config)
    chosen = {tuple(o for o in job if is_group(o.partition("=")[0].lstrip("+~"))) for job in launched}
    return list(launched) if len(chosen) <= MAX_COMPOSED else covering(launched)


def covering(launched: Sequence[Sequence[str]]) -> list[Sequence[str]]:
    """The first job (in launch order) of each override value: every value of every swept key, each once."""
    seen: set[str] = set()
    kept = []
    for job in launched:
        if not seen.issuperset(job):
            kept.append(job)
            seen.update(job)
    return kept
