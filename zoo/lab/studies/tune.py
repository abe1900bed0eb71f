"""``tune.lr=[1e-3,3e-3,1e-2]``: a learning rate per variant, chosen on validation before the seeds run.

A single shared rate favours whichever variant it happens to suit. With ``tune.lr`` set, a sweep
first trains every variant at every listed rate on ``tune.seeds`` (seed 0 by default) into
``<sweep dir>/tune/`` (a sweep of its own, with its own report), then runs its grid as usual: each
run takes the rate that gave its variant the best validation metric (the headline metric, averaged
over the tune seeds; a rate where a run diverged or failed is never chosen). Each run's summary
records the choice under ``tune``; the sweep's report shows the rate per variant and draws ``lr.png``.
With ``tune.width`` the tuning runs train at that ``block.d_model`` only and every width takes its rate
(under ``param=mup`` the rate tuned at one width transfers: a ladder tunes at its base width).
"""

from __future__ import annotations

import copy
import logging
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from zoo.core.errors import ConfigError
from zoo.lab.planning.options import TUNE_DIR, tune_options
from zoo.lab.planning.tuning import search_argv
from zoo.lab.records.config import config_hash
from zoo.lab.studies.runset import grid_edge
from zoo.lab.studies.variants import collect

log = logging.getLogger("zoo.lab.studies.tune")

def variant_hash(config: dict[str, Any], any_width: bool = False) -> str:
    """What a run computes, less its seeds (``seed``, ``data_seed``) and learning rate (and its width,
    ``any_width``: ``tune.width``): the same for a variant's tune runs and its runs."""
    config = copy.deepcopy(config)
    config.pop("seed", None)
    config.pop("data_seed", None)
    if isinstance(config.get("train"), dict):
        config["train"].pop("lr", None)
    if any_width and isinstance(config.get("block"), dict):
        config["block"].pop("d_model", None)
    return config_hash(config)


def choose_lr(config: dict[str, Any], tune_dir: Path) -> dict[str, Any]:
    """The rate that gave this config's variant its best validation metric in ``tune_dir``.

    Returns ``{"lr", "metric", "mode", "searched": {rate: mean metric or None}, "seeds"}``.
    """
    rates, seeds = tune_options(config.get("tune"))
    width = (config.get("tune") or {}).get("width")
    key = variant_hash(config, any_width=width is not None)
    results: dict[float, list[float | None]] = {}
    metric, mode = None, "min"
    runs = collect(tune_dir) if tune_dir.is_dir() else []
    for run in runs:
        cfg = run.record.config
        if cfg is None or variant_hash(cfg, any_width=width is not None) != key:
            continue
        rate = float((cfg.get("train") or {}).get("lr"))
        if rates is not None and rate not in rates:
            continue
        info = run.record.metric or {}
        metric, mode = info.get("name", metric), info.get("mode", mode)
        value = info.get("value") if run.status == "ok" else None
        ok = isinstance(value, (int, float)) and math.isfinite(value)
        results.setdefault(rate, []).append(float(value) if ok else None)
    searched = {
        rate: (statistics.fmean(v) if all(x is not None for x in v) else None)  # type: ignore[arg-type]
        for rate, v in sorted(results.items())
    }
    finished = {rate: v for rate, v in searched.items() if v is not None}
    if not finished:
        raise ConfigError(
            "tune.lr", rates, f"no tuning run of this variant finished ok under {tune_dir} (see its report.md)"
        )
    best = (min if mode == "min" else max)(finished, key=finished.__getitem__)
    if edge := grid_edge(best, searched):
        log.warning("tune.lr chose %g, the %s rate of its grid %s: the best may lie beyond it; widen tune.lr",
                    best, edge, sorted(searched))  # fmt: skip
    return {"lr": best, "metric": metric, "mode": mode, "searched": searched, "seeds": seeds}


class TuneCallback(Callback):
    """Hydra callback: before a sweep with ``tune.lr`` launches its runs, run the tuning sweep."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        section = OmegaConf.to_container(config.tune, resolve=True) if "tune" in config else None
        rates, seeds = tune_options(section)
        if rates is None:
            return
        tune_dir = Path(config.hydra.sweep.dir) / TUNE_DIR
        argv = search_argv(config, tune_dir, rates, seeds)
        log.info("tuning the learning rate: every variant at %s on seed %s, into %s", rates, seeds, tune_dir)
        done = subprocess.run([sys.executable, "-m", "zoo.train", *argv], check=False)
        if done.returncode != 0:
            log.warning("a tuning run failed (%s/report.md); its variant runs at its best finished rate", tune_dir)
