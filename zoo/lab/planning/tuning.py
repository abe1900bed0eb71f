"""The tuning sweep of ``tune.lr`` (zoo.lab.studies.tune): its command line, the sweep's own with each rate on
the tune seeds, into ``<sweep dir>/tune/``. Built here, below the sweep's checks, so that the tuning sweep is
checked with the sweep before any run (zoo.lab.planning.sweep.SweepCheck)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from zoo.lab.planning.options import report_baseline, report_interaction

#: The width key ``tune.width`` fixes in the tuning sweep.
WIDTH = "block.d_model"


def search_argv(config: DictConfig, tune_dir: Path, rates: list[float], seeds: list[int]) -> list[str]:
    """The command line of the tuning sweep: the sweep's own, each rate on the tune seeds, into ``tune_dir``.
    Under ``tune.width`` the tuning runs train at that width alone, and their report leaves the width out of its
    baseline and interactions (:func:`fixed_width_report`)."""
    width = (config.get("tune") or {}).get("width")
    drop = ("tune.", "tune=", "seed=", "data_seed=", "train.lr=", "ladder.", "ladder=",
            *((f"{WIDTH}=", "report.baseline=", "report.interaction=") if width else ()))  # fmt: skip
    task = [o for o in config.hydra.overrides.task if not o.lstrip("+~").startswith(drop)]
    hydra = [o for o in config.hydra.overrides.hydra if not o.startswith(("hydra.sweep.dir=", "hydra.mode="))]
    report = OmegaConf.to_container(config.report, resolve=True) if "report" in config else None
    return [
        "-m",
        *task,
        *((f"{WIDTH}={width}", *fixed_width_report(report)) if width else ()),  # every width takes this width's rate
        "tune.lr=null",
        "ladder.steps=null",  # a ladder's budgets are its runs', not its tuning runs'
        f"seed={','.join(str(s) for s in seeds)}",
        f"train.lr={','.join(repr(r) for r in rates)}",
        *hydra,
        f"hydra.sweep.dir={tune_dir}",
    ]


def fixed_width_report(report: Any) -> list[str]:
    """The tuning sweep's ``report.baseline`` and ``report.interaction`` overrides under ``tune.width``: the
    sweep's, less the width, which the tuning sweep does not sweep."""
    section = dict(report or {})
    baseline = {k: v for k, v in (report_baseline(section.get("baseline")) or {}).items() if k != WIDTH}
    pairs = [pair for pair in report_interaction(section.get("interaction")) or [] if WIDTH not in pair]
    shown_baseline = ",".join(f"{k}={v}" for k, v in baseline.items())
    return [
        f"report.baseline='{shown_baseline}'" if baseline else "report.baseline=null",
        f"report.interaction=[{','.join(f'[{a},{b}]' for a, b in pairs)}]" if pairs else "report.interaction=null",
    ]
