"""``zoo-train``: train one configuration (``-m``: a sweep of them) and record the run.

    zoo-train norm=rmsnorm attn=gqa task=bytes train.steps=500
    zoo-train -m norm=layernorm,rmsnorm attn=mha,gqa,mqa seed=0,1,2
    torchrun --nproc_per_node=2 -m zoo.train train.steps=200      # DDP; rank 0 writes

Each run folder gets ``metrics.jsonl`` and ``summary.json`` (status ``ok``, ``diverged``,
``incompatible`` (parts the compatibility map refuses to combine, with the reason) or ``failed``).
A failed run is recorded and never stops a sweep; one run's bad config is one ``zoo-train: ...`` line on
stderr, exit status 1 and no run folder. A run whose summary already says ``ok`` for the same config is
skipped, so re-running a sweep into its folder resumes it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from zoo.assembly.config_tree import CONF_DIR
from zoo.core.errors import ConfigError
from zoo.core.registry import AXES
from zoo.lab.commands.argv import exit_on_bad_overrides, quoted_lists, quoted_mappings
from zoo.lab.cores import dist_env
from zoo.lab.files import write_atomic
from zoo.lab.keys import run_folder_name
from zoo.lab.planning.options import TUNE_DIR
from zoo.lab.planning.sweeper import register_sweeper
from zoo.lab.records.exit_status import exit_if_a_run_failed, note_refused

OmegaConf.register_new_resolver("zoo_dirname", run_folder_name, replace=True)


def hydra_job(cfg: DictConfig) -> str:
    """The Hydra task function: one run in Hydra's output folder. Returns the run's status."""
    from zoo.lab.training.run import run_record  # torch: only once Hydra has a job to run (not for --help)

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    order = [*AXES, "preset", "task"]
    choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra/")}
    choices = dict(sorted(choices.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
    launcher = OmegaConf.select(hc, "launcher._target_", default="") or ""
    parallel = 1  # jobs sharing this machine's cores, for threads=null
    if "joblib" in launcher:
        n_jobs = OmegaConf.select(hc, "launcher.n_jobs", default=1) or 1
        parallel = (os.cpu_count() or 1) if n_jobs < 0 else n_jobs
    elif "LocalLauncher" in launcher:  # submitit_local starts every job at once
        parallel = os.cpu_count() or 1
    out_dir = Path(hc.runtime.output_dir)
    fresh = not any(out_dir.iterdir()) if out_dir.is_dir() else True
    try:
        record = run_record(
            cfg,
            out_dir,
            overrides=list(hc.overrides.task),
            choices=choices,
            parallel_jobs=parallel,
            multirun=multirun,
            job=hc.job.num if multirun else None,
            tune_dir=Path(hc.sweep.dir) / TUNE_DIR if multirun else None,
            on_write=lambda: write_hydra_record(out_dir, cfg),
            raise_config_errors=not multirun,  # a sweep records a run's config error and trains the others
        )
    except ConfigError as error:  # one run's config refused: as a misspelt key is (zoo/lab/commands/argv.py)
        exit_refused(error, out_dir if fresh else None)
    if record.status == "refused" and multirun:
        note_refused(Path(hc.sweep.dir), out_dir, str(record.error))
    if record.status in ("failed", "incompatible", "locked", "refused") and not multirun:
        raise SystemExit(1)  # a single run: fail the command (a sweep carries on)
    return record.status


def exit_refused(error: ConfigError, made: Path | None) -> NoReturn:
    """Exit 1 with ``zoo-train: <error>`` (one line on stderr, from rank 0), leaving nothing behind: ``made``,
    the run folder Hydra made for the run, is removed with the folders above it that it leaves empty, up to
    the working folder (``runs/train/``)."""
    if dist_env()[0] == 0:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
            here = Path.cwd().resolve()
            for folder in made.resolve().parents:
                if folder == here or here not in folder.parents or any(folder.iterdir()):
                    break
                folder.rmdir()
        print(f"zoo-train: {error}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def write_hydra_record(out_dir: Path, cfg: DictConfig) -> None:
    """Hydra's record of the job in ``out_dir/.hydra`` (config, Hydra's config, overrides), written by zoo
    once the run may write its folder (Hydra's own writing is off: conf/config.yaml's output_subdir)."""
    hc = HydraConfig.get()
    record = {"config.yaml": cfg, "hydra.yaml": OmegaConf.create({"hydra": hc}), "overrides.yaml": hc.overrides.task}
    for name, node in record.items():
        write_atomic(out_dir / ".hydra" / name, OmegaConf.to_yaml(node))


_hydra_main = hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(hydra_job)


def main() -> None:
    """Console entry point. Under torchrun, ranks other than 0 write nothing (no run folder, no log file)."""
    sys.argv[1:] = quoted_mappings(sys.argv[1:])  # variants={base: [], rope: [pos=rotary]} as Hydra reads it
    sys.argv[1:] = quoted_lists(sys.argv[1:])  # block.out_conv=attn,mlp: one value, not Hydra's ambiguous sweep
    exit_on_bad_overrides("zoo-train")  # a misspelt key or option: zoo's error, before Hydra's "use +..."
    rank = dist_env()[0]
    if rank > 0:
        sys.argv += [
            f"hydra.run.dir={tempfile.gettempdir()}",
            "hydra.output_subdir=null",
            "hydra/job_logging=stdout",
            "hydra.job_logging.root.level=WARNING",
        ]
    register_sweeper()
    _hydra_main()
    exit_if_a_run_failed()  # after a sweep (zoo-train -m, zoo-sweep): exit 1 when a run failed


if __name__ == "__main__":
    main()
