"""The sweeper every zoo sweep runs under (conf/config.yaml ``hydra.sweeper``): Hydra's basic sweeper, the
product of the swept values, unless the sweep names its variants (zoo.lab.planning.named), then each variant x
the other swept keys; those sweeps leave ``variants.json`` in the sweep folder (:data:`VARIANTS_FILE`: the
variants and the run folder each one trains into), which names the report's rows even for a run the sweep
skipped because a grid run of the same config had finished in that folder."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.types import Override
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from zoo.lab.files import write_json_atomic
from zoo.lab.keys import run_folder_name
from zoo.lab.planning.named import config_variants, sweep_job_lists, variant_folders
from zoo.lab.records.config import config_hash
from zoo.lab.records.summary import SUMMARY, read_record

#: The named variants of the sweep last run into a folder: ``{"variants": {name: [override]}, "folders": {folder:
#: name}}`` (zoo.lab.studies.named reads it back, checked).
VARIANTS_FILE = "variants.json"


class VariantSweeper(Sweeper):
    """Hydra's basic sweeper (the one its plugin scan loaded), launching a sweep's named variants when it has them
    (:func:`register_sweeper`)."""

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper as Loaded

        self.basic = Loaded(max_batch_size, params)
        self.basic.split_arguments = self.split_arguments  # type: ignore[method-assign]
        self.basic.validate_batch_is_legal = self.validate_batch_is_legal  # type: ignore[method-assign]

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.basic.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        return self.basic.sweep(arguments)

    def split_arguments(self, overrides: list[Override], max_batch_size: int | None) -> list[list[list[str]]]:
        config = self.basic.config
        jobs = sweep_job_lists(config, overrides)
        named = config_variants(config)
        if named is not None:
            folder = Path(config.hydra.sweep.dir)
            jobs = into_finished_folders(config, jobs, folder)
            folder.mkdir(parents=True, exist_ok=True)
            write_json_atomic(folder / VARIANTS_FILE, {"variants": named, "folders": variant_folders(jobs)})
        return list(BasicSweeper.split_overrides_to_chunks(jobs, max_batch_size))

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """Hydra's check that each job of ``batch`` composes before it is launched (a composition each, as long as a
        run's start), less the jobs whose config the sweep's check before any run composed as Hydra does
        (zoo.lab.planning.jobs.composed_jobs)."""
        from zoo.lab.planning.jobs import composed_jobs  # imported by the check before any run already

        done = composed_jobs(self.basic.config)
        Sweeper.validate_batch_is_legal(self.basic, [job for job in batch if tuple(job) not in done])


#: The override that sends a job into a folder other than the one its overrides name.
SUBDIR = "hydra.sweep.subdir"


def into_finished_folders(config: Any, jobs: list[list[str]], sweep_dir: Path) -> list[list[str]]:
    """``jobs``, each one whose config (its hash, zoo.lab.records.config) is that of a run finished in another
    folder of ``sweep_dir`` sent there (``hydra.sweep.subdir=<folder>``), where it is skipped: a named variant equal
    to a grid run given other overrides (``base: []`` and ``pos=none``) trains once. A job whose own folder holds a
    run already stays there."""
    finished = finished_runs(sweep_dir)
    if not finished:
        return jobs
    from zoo.lab.planning.jobs import job_configs  # (torch) only once a finished run is there
    from zoo.lab.planning.run_model import with_task_vocab

    sent = []
    for job in job_configs(config, jobs):
        own = run_folder_name(job.overrides)
        target = finished.get(config_hash(with_task_vocab(job.config)))
        moved = target is not None and target != own and not (sweep_dir / own / SUMMARY).exists()
        sent.append([*job.overrides, f"{SUBDIR}='{target}'"] if moved else list(job.overrides))  # quoted: = and ,
    return sent


def finished_runs(sweep_dir: Path) -> dict[str, str]:
    """``{config hash: folder name}`` of the runs finished (``ok``) in ``sweep_dir``'s folders, each record read
    back checked (one that does not read is no finished run)."""
    found = {}
    for summary in sorted(sweep_dir.glob(f"*/{SUMMARY}")) if sweep_dir.is_dir() else []:
        record = read_record(summary.parent)
        if record is not None and record.status == "ok" and record.config_hash:
            found.setdefault(record.config_hash, summary.parent.name)
    return found


#: Where Hydra finds the sweeper: it instantiates plugins from its ``hydra_plugins`` namespace only, so the class is
#: registered there under this name (conf/config.yaml's ``hydra.sweeper._target_``) rather than installed as a
#: package of its own.
SWEEPER_TARGET = "hydra_plugins.zoo.VariantSweeper"


def register_sweeper() -> None:
    """Register :class:`VariantSweeper` with Hydra as :data:`SWEEPER_TARGET` (before a command line runs Hydra)."""
    import sys
    import types

    import hydra_plugins
    from hydra.core.plugins import Plugins

    name = SWEEPER_TARGET.rpartition(".")[0]
    module = sys.modules.setdefault(name, types.ModuleType(name))
    module.VariantSweeper = VariantSweeper  # type: ignore[attr-defined]
    setattr(hydra_plugins, name.rpartition(".")[2], module)
    VariantSweeper.__module__ = name
    Plugins.instance().register(VariantSweeper)
