"""``ladder.steps``: a scaling ladder's shorter budgets, as WSD decays branched from each run's checkpoints.

``zoo-sweep ladder`` (sweeps/ladder.yaml) trains every variant at each width to the longest budget
(``train.steps``, ``schedule=wsd``, a checkpoint where each shorter budget's decay starts). When the sweep's
runs end, :class:`LadderCallback` trains, for every finished run and every budget of ``ladder.steps``, a
branch: the run's own config with ``train.steps`` that budget, continued from the run's checkpoint at the
step where that budget's decay starts (``train.branch.step=decay``: the stable phase is the same whatever the
total, Hägele et al. 2024), into ``<sweep dir>/budgets/``. Each branch is an ordinary run (folder, summary,
lock; skipped when done, so a ladder resumes); the branches train as many at a time as the sweep's runs did
(a process pool). The tuning runs (``tune/``) are branched too, into ``tune/budgets/``: the report checks the
rate tuned at the longest budget against each shorter budget's best. The report then answers the ladder
(zoo.lab.studies.ladder.study).

Before any run, a ladder that could not be fitted or branched is refused by name
(zoo.lab.planning.sweep.check_ladder).
"""

from __future__ import annotations

import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from zoo.lab.planning.options import ladder_options

log = logging.getLogger("zoo.lab.training.ladder_runs")

#: The branches' folder inside the sweep folder.
BUDGETS_DIR = "budgets"


def branch_config(parent: dict[str, Any], folder: Path, budget: int) -> dict[str, Any]:
    """A branch's config: its parent run's (at the rate the parent was tuned to, not tuned again), with
    ``train.steps`` the budget, from the parent's checkpoint where the budget's decay starts."""
    train = {**parent["train"], "steps": budget, "branch": {"from": str(folder), "step": "decay"}}
    return {**parent, "train": train, "tune": {**(parent.get("tune") or {}), "lr": None}}


def branch_name(parent: str, budget: int) -> str:
    """The branch's folder name: its parent run's, with ``train.steps`` the budget."""
    parts = [p for p in parent.split(",") if not p.startswith("train.steps=")]
    return ",".join(sorted([*parts, f"train.steps={budget}"]))


def branch_jobs(config: DictConfig) -> int:
    """How many branches train at a time: the sweep's ``hydra.launcher.n_jobs`` under joblib (zoo-sweep sets it to
    as many runs as the cores hold, zoo.lab.commands.sweep.parallel_jobs), else the cores over ``threads``."""
    from zoo.lab.cores import usable_cores

    launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
    if "joblib" in launcher:
        n = int(OmegaConf.select(config, "hydra.launcher.n_jobs", default=1) or 1)
        return usable_cores() if n < 0 else max(1, n)
    threads = OmegaConf.select(config, "threads", default=None)
    return max(1, usable_cores() // (int(threads) if threads else usable_cores()))


def branch_jobs_of(sweep: Path, budgets: list[int]) -> list[tuple[dict[str, Any], Path, dict[str, Any]]]:
    """Every branch to train: (its config, its folder, run_record's options), for each finished run of the
    sweep and of its tuning sweep (``tune/``: each rate's decays, so the report checks the rate per budget)."""
    from zoo.lab.planning.options import TUNE_DIR
    from zoo.lab.studies.variants import collect

    jobs = []
    for root in (sweep, sweep / TUNE_DIR):
        if not root.is_dir():
            continue
        for parent in (r for r in collect(root) if r.path.parent == root and r.status == "ok"):
            for budget in budgets:
                overrides = [o for o in parent.record.overrides or [] if not o.startswith("train.steps=")]
                options = {"overrides": [*overrides, f"train.steps={budget}"], "choices": parent.record.choices}
                config = branch_config(parent.record.config, parent.path, budget)  # type: ignore[arg-type]
                jobs.append((config, root / BUDGETS_DIR / branch_name(parent.path.name, budget), options))
    return jobs


def train_branch(config: dict[str, Any], out: Path, options: dict[str, Any], jobs: int) -> str:
    """One branch, in a worker process of the pool: its run's status."""
    from zoo.lab.training.run import run_record

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    return run_record(config, out, multirun=True, parallel_jobs=jobs, **options).status


class LadderCallback(Callback):
    """Hydra callback: when the sweep's runs end, branch each one's shorter budgets (``ladder.steps``), and each
    tuning run's, as many at a time as the sweep ran its runs (:func:`branch_jobs`)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        budgets, _ = ladder_options(OmegaConf.to_container(config.ladder, resolve=True), int(config.train.steps))
        if not budgets:
            return
        sweep = Path(config.hydra.sweep.dir)
        jobs, n = branch_jobs_of(sweep, budgets), branch_jobs(config)
        log.info("ladder: %d branches (budgets %s), %d at a time, into %s/", len(jobs), budgets, n, BUDGETS_DIR)
        if n == 1:
            for job in jobs:
                train_branch(*job, 1)
            return
        context = multiprocessing.get_context("spawn")  # torch's threads do not survive a fork
        with ProcessPoolExecutor(max_workers=n, mp_context=context) as pool:
            for status in pool.map(train_branch, *zip(*jobs, strict=True), [n] * len(jobs)):
                if status != "ok":
                    log.warning("ladder: a branch ended %s (its summary.json says why)", status)
