"""What a ladder's measurements carry besides the variants: the noise by source, and the machine's other work.

:func:`noise` splits a curve's runs, ``value[replicate, cell]``, into the cell's mean, the replicate's offset
(shared by its runs: its seed) and each run's own, and gives the two sources' standard deviations, each free
of the other (a two-way analysis of variance without interaction: the offsets' variance less the runs' share of
it), the run's own per budget too. Read on the losses it is the noise a planted ladder is drawn with
(zoo.lab.studies.ladder.planted); on the log of the training times it is how far one run's time says what its
cell costs. :func:`shared_timings` counts the runs that
trained while the machine's load average exceeded its cores (summary.json's ``load``): their times measure the
other work as much as the run, and no cost claim is read from them."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from zoo.lab.studies.ladder.iso import Grid
from zoo.lab.studies.runset import Run


@dataclass(frozen=True)
class Noise:
    """The sources' standard deviations (nan: not identified), pooled over ``curves`` curves; the run's own
    also per budget (the noise of a short run is not a long one's)."""

    seed: float  # a replicate's offset, shared by its runs
    run: float  # a run's own
    curves: int = 1
    by_budget: dict[int, float] = field(default_factory=dict)


def parts(grid: Grid, values: np.ndarray) -> tuple[float, int, int, dict[int, tuple[float, float]]] | None:
    """(offsets' sum of squares, its degrees of freedom, cells, {budget: (the runs' own sum of squares, their
    degrees of freedom)}) of ``values[replicate, cell]`` on the cells every replicate ran, or None under 2
    replicates or cells. A cell's residuals carry (n - 1)(k - 1) / k of its n runs' degrees of freedom."""
    kept = np.isfinite(values).all(axis=0)
    full, cells = values[:, kept], [c for c, k in zip(grid.cells, kept, strict=True) if k]
    n, k = full.shape
    if n < 2 or k < 2:
        return None
    offset = full.mean(axis=1, keepdims=True) - full.mean()
    residual = full - full.mean(axis=0) - offset
    budgets: dict[int, tuple[float, float]] = {}
    for (_, steps), column in zip(cells, residual.T, strict=True):
        ss, df = budgets.get(steps, (0.0, 0.0))
        budgets[steps] = (ss + float((column**2).sum()), df + (n - 1) * (k - 1) / k)
    return float(k * (offset**2).sum()), n - 1, k, budgets


def noise(grids: Iterable[Grid], log_cost: bool = False) -> Noise:
    """The seed's and the run's standard deviations of the curves' losses (or, ``log_cost``, of their runs'
    log costs), pooled over ``grids``."""
    found = [p for g in grids if (p := parts(g, np.log(g.cost) if log_cost else g.loss)) is not None]
    if not found:
        return Noise(math.nan, math.nan, 0)
    budgets: dict[int, list[float]] = {}
    for p in found:
        for steps, (ss, df) in p[3].items():
            budgets.setdefault(steps, [0.0, 0.0])
            budgets[steps][0] += ss
            budgets[steps][1] += df
    run_var = sum(ss for ss, _ in budgets.values()) / sum(df for _, df in budgets.values())
    seed_var = float(np.mean([(p[0] / p[1] - run_var) / p[2] for p in found]))
    by_budget = {b: math.sqrt(ss / df) for b, (ss, df) in sorted(budgets.items())}
    return Noise(math.sqrt(max(0.0, seed_var)), math.sqrt(run_var), len(found), by_budget)


def shared(run: Run) -> bool | None:
    """Whether the machine's load average exceeded its cores at the run's loop's start or end (None: no load
    recorded, a run older than the field)."""
    load = run.record.value("load") or {}
    cores, seen = load.get("machine_cores"), [v for v in (load.get("start"), load.get("end")) if v is not None]
    if not isinstance(cores, int) or not seen:
        return None
    return max(seen) > cores


def shared_timings(runs: Sequence[Run]) -> tuple[int, int, int]:
    """(runs whose timings other work shared, runs with a load recorded, runs)."""
    found = [shared(r) for r in runs]
    return sum(1 for s in found if s), sum(1 for s in found if s is not None), len(found)
