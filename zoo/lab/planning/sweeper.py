"""The sweeper every zoo sweep runs under (conf/config.yaml ``hydra.sweeper``): Hydra's basic sweeper, the
product of the swept values, unless the sweep names its variants (zoo.lab.planning.named), then each variant x
the other swept keys; those sweeps leave ``variants.json`` in the sweep folder (:data:`VARIANTS_FILE`: the
variants and the run folder each one trains into), which names the report's rows even for a run the sweep
skipped because a grid run of the same config had finished in that folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.types import Override
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from zoo.lab.files import write_json_atomic
from zoo.lab.planning.named import config_variants, named_jobs, variant_folders

#: The named variants of the sweep last run into a folder: ``{"variants": {name: [override]}, "folders": {folder:
#: name}}`` (zoo.lab.studies.named reads it back, checked).
VARIANTS_FILE = "variants.json"


def sweep_job_lists(config: Any, overrides: list[Override]) -> list[list[str]]:
    """A sweep's jobs in launch order: its named variants' (:func:`named_jobs`), else Hydra's product."""
    named = config_variants(config)
    if named is None:
        return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
    return named_jobs(named, overrides)


class VariantSweeper(Sweeper):
    """Hydra's basic sweeper (the one its plugin scan loaded), launching a sweep's named variants when it has them
    (:func:`register_sweeper`)."""

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper as Loaded

        self.basic = Loaded(max_batch_size, params)
        self.basic.split_arguments = self.split_arguments  # type: ignore[method-assign]

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
            folder.mkdir(parents=True, exist_ok=True)
            write_json_atomic(folder / VARIANTS_FILE, {"variants": named, "folders": variant_folders(jobs)})
        return list(BasicSweeper.split_overrides_to_chunks(jobs, max_batch_size))


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
