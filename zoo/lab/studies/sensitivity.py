"""Learning-rate sensitivity (Wortsman et al. 2023) from a sweep's tuning runs (``tune.lr``, ``<sweep dir>/tune/``).

With ``tune.lr`` a grid and ``tune.seeds`` several seeds, every variant trains at every rate on each seed.
Per variant and seed, the sensitivity is the mean over the grid of ``min(metric at the rate, metric at
initialization)`` less the best of those values (a run that diverged, failed or is missing counts at
initialization); for a higher-is-better metric, mirrored: the best of ``max(...)`` less their mean. It is 0
for a variant that reaches its best at every rate, and larger the more the rate matters. The metric at
initialization is each run's summary ``initial`` (its step-0 validation, the same for every rate of a seed);
a seed whose runs lack it has no sensitivity, and the study says so. Per variant: the best rate, the metric
at each rate (mean and 95% interval over seeds), the sensitivity's mean over seeds with its interval, and its
difference from the baseline's, paired by seed (lower is better, whatever the metric's direction). A variant is
read on one grid, :func:`rate_grid`: the rates ``tune.lr`` searched for it, as its runs record them; tuning runs
at other rates (an earlier sweep's into the same folder) are left out, and the study keeps them to say so.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from zoo.lab.studies.runset import Run, Variant, grid_edge
from zoo.lab.studies.stats import Comparison, compare, difference_range, mean_interval


def clipped(value: float | None, initial: float, mode: str) -> float:
    """A run's metric counted no worse than at initialization (``None``, a diverged or failed run: the initial)."""
    if value is None:
        return initial
    return min(value, initial) if mode == "min" else max(value, initial)


def seed_sensitivity(values: Sequence[float | None], initial: float, mode: str) -> float:
    """One seed's sensitivity over a grid: ``values`` its metric at each rate (None: diverged or failed)."""
    counted = [clipped(v, initial, mode) for v in values]
    mean = statistics.fmean(counted)
    return mean - min(counted) if mode == "min" else max(counted) - mean


def finite(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def rate_of(run: Run) -> float | None:
    """The run's peak learning rate (``train.lr``), or None when it has none that reads as a number."""
    try:
        return float(run.value("train.lr"))
    except ValueError:
        return None


def final_of(run: Run, metric: str) -> float | None:
    """The run's final ``metric``, when it finished ok with a finite value (otherwise None: counted at init)."""
    return finite(run.record.final_value(metric)) if run.status == "ok" else None


def initial_of(run: Run, metric: str) -> float | None:
    """The run's ``metric`` at initialization (summary ``initial``), or None when it did not record one."""
    initial = run.record.initial
    return finite(initial.get(metric)) if initial is not None else None


@dataclass
class RatePoint:
    """One variant at one rate: each seed's final metric (finished ok runs only) and the runs it had."""

    rate: float
    values: dict[Any, float]
    runs: int

    def interval(self) -> tuple[float, float, float] | None:
        """Mean over seeds and its 95% t interval (the mean alone for one seed; None for none)."""
        values = list(self.values.values())
        if not values:
            return None
        return mean_interval(values) or (values[0], values[0], values[0])


@dataclass
class LrCurve:
    """One variant of the sweep across the grid: its points, best rate and per-seed sensitivity."""

    key: tuple[str, ...]
    points: list[RatePoint]
    best_lr: float | None
    per_seed: dict[Any, float]
    missing: list[Any]  # tune seeds without a metric at initialization: no sensitivity for them
    initial: dict[Any, float] = field(default_factory=dict)  # each seed's metric at initialization
    comparison: Comparison | None = None
    edge: str | None = None  # "lowest" or "highest": the best rate is that end of the grid

    def sensitivity(self) -> tuple[float, float | None, float | None] | None:
        """Mean over seeds and its 95% t interval, its low end clipped at 0 (a sensitivity is never negative;
        :attr:`clipped` says when); no interval for one seed; None without any."""
        values = list(self.per_seed.values())
        if not values:
            return None
        interval = mean_interval(values)
        return (interval[0], max(interval[1], 0.0), interval[2]) if interval else (values[0], None, None)

    @property
    def clipped(self) -> bool:
        """Whether the sensitivity's t interval reached below 0 and was cut there."""
        interval = mean_interval(list(self.per_seed.values())) if len(self.per_seed) > 1 else None
        return interval is not None and interval[1] < 0


@dataclass
class LrStudy:
    """The tuning runs of a sweep, per variant of the sweep: the metric across the rate grid and the sensitivity."""

    metric: str
    mode: str
    rates: list[float]
    seeds: list[Any]
    curves: dict[tuple[str, ...], LrCurve] = field(default_factory=dict)
    outside: list[Run] = field(default_factory=list)  # tuning runs at rates outside their variant's grid: left out

    @property
    def computed(self) -> bool:
        """Whether some variant has a sensitivity (its runs recorded their metric at initialization)."""
        return any(c.per_seed for c in self.curves.values())


def best_rate(points: Sequence[RatePoint], seeds: Sequence[Any], mode: str) -> float | None:
    """The rate with the best mean over the seeds among those where every seed finished ok (as ``tune.lr``
    chooses: a rate where a run diverged or failed is never the best), or None."""
    means = {p.rate: statistics.fmean(p.values.values()) for p in points if seeds and set(seeds) <= set(p.values)}
    if not means:
        return None
    return (min if mode == "min" else max)(means, key=means.__getitem__)


def seed_initial(runs: Sequence[Run], seed: Any, metric: str) -> float | None:
    """The seed's metric at initialization: the first of its runs that recorded it (every rate starts there)."""
    return next((x for r in runs if r.seed == seed and (x := initial_of(r, metric)) is not None), None)


def rate_grid(variant: Variant, tried: Sequence[float]) -> list[float]:
    """The one grid a variant's rates are read on (its tuned rate, its best rate, their edge marks, its
    sensitivity): the rates ``tune.lr`` searched for it as its runs record them, else ``tried`` (every rate of
    its tuning runs: runs that record no search)."""
    return variant.tuned_grid or sorted(tried)


def build_curve(key: tuple[str, ...], runs: Sequence[Run], grid: Sequence[float], study: LrStudy) -> LrCurve:
    """A variant's curve over its ``grid`` from its tuning runs (any seed): a run missing from the grid counts at
    init."""
    m, mode = study.metric, study.mode
    cell = {(rate_of(r), r.seed): r for r in runs}
    points = [RatePoint(rate, {}, 0) for rate in grid]
    for point in points:
        for seed in study.seeds:
            run = cell.get((point.rate, seed))
            value = final_of(run, m) if run is not None else None
            point.runs += run is not None
            if value is not None:
                point.values[seed] = value
    found = {s: seed_initial(runs, s, m) for s in study.seeds}
    initial = {s: x for s, x in found.items() if x is not None}
    per_seed = {s: seed_sensitivity([p.values.get(s) for p in points], initial[s], mode) for s in initial}
    missing = [s for s in study.seeds if s not in initial]
    best = best_rate(points, study.seeds, mode)
    return LrCurve(key, points, best, per_seed, missing, initial, edge=grid_edge(best, grid))


def seed_order(seed: Any) -> tuple[int, Any]:
    return (0, seed) if isinstance(seed, (int, float)) else (1, str(seed))


def lr_study(
    variants: Sequence[Variant],
    baseline: tuple[str, ...],
    test: str,
    axes: Sequence[str],
    metric: str,
    mode: str,
    tuning: Sequence[Run],
) -> LrStudy:
    """A sweep's ``variants`` (keyed by their values of ``axes``) across the rates of its tuning runs
    (``tuning``: the runs under ``<sweep dir>/tune``) on ``metric``, each variant's sensitivity compared with
    the ``baseline`` variant's, paired by seed under ``test`` (the report's)."""
    runs = [r for r in tuning if rate_of(r) is not None]
    tried = sorted({rate_of(r) for r in runs})  # type: ignore[type-var]
    by_key: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        by_key.setdefault(tuple(run.value(a) for a in axes), []).append(run)
    grids = {v.key: rate_grid(v, tried) for v in variants if v.key in by_key}
    kept = {key: [r for r in by_key[key] if rate_of(r) in grid] for key, grid in grids.items()}
    seeds = {r.seed for rs in kept.values() for r in rs} or {r.seed for r in runs}
    rates = sorted({rate for grid in grids.values() for rate in grid}) or tried
    study = LrStudy(metric, mode, rates, sorted(seeds, key=seed_order))
    study.outside = [r for key in grids for r in by_key[key] if rate_of(r) not in grids[key]]
    for key, grid in grids.items():
        study.curves[key] = build_curve(key, kept[key], grid, study)
    base = study.curves.get(baseline)
    if base is not None and base.per_seed:
        for curve in study.curves.values():
            if curve.key != baseline and curve.per_seed:
                curve.comparison = compare(curve.per_seed, base.per_seed, "min", test=test,
                                           bounds=difference_range(metric))  # fmt: skip
    return study
