"""``ladder.steps``: a scaling ladder's shorter budgets, as WSD decays branched from each run's checkpoints.

``zoo-sweep ladder`` (sweeps/ladder.yaml) trains every variant at each width to the longest budget
(``train.steps``, ``schedule=wsd``, a checkpoint where each shorter budget's decay starts). When the sweep's
runs end, :class:`LadderCallback` trains, for every finished run and every budget of ``ladder.steps``, a
branch: the run's own config with ``train.steps`` that budget, continued from the run's checkpoint at the
step where that budget's decay starts (``train.branch.step=decay``: the stable phase is the same whatever the
total, Hägele et al. 2024), into ``<sweep dir>/budgets/``. Each branch is an ordinary run (folder, summary,
lock; skipped when done, so a ladder resumes); the report then fits the ladder (zoo.lab.studies.ladder).

Before any run, a ladder that could not be fitted or branched is refused by name
(zoo.lab.planning.sweep.check_ladder).
"""

from __future__ import annotations

import logging
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


class LadderCallback(Callback):
    """Hydra callback: when the sweep's runs end, branch each one's shorter budgets (``ladder.steps``)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        budgets, _ = ladder_options(OmegaConf.to_container(config.ladder, resolve=True), int(config.train.steps))
        if not budgets:
            return
        from zoo.lab.studies.variants import collect
        from zoo.lab.training.run import run_record

        sweep = Path(config.hydra.sweep.dir)
        parents = [r for r in collect(sweep) if r.path.parent == sweep and r.status == "ok"]
        log.info("ladder: %d runs x budgets %s, branched into %s", len(parents), budgets, sweep / BUDGETS_DIR)
        for parent in parents:
            for budget in budgets:
                overrides = [o for o in parent.record.overrides or [] if not o.startswith("train.steps=")]
                out = sweep / BUDGETS_DIR / branch_name(parent.path.name, budget)
                run_record(branch_config(parent.record.config, parent.path, budget), out,  # type: ignore[arg-type]
                           overrides=[*overrides, f"train.steps={budget}"], choices=parent.record.choices,
                           multirun=True)  # fmt: skip
