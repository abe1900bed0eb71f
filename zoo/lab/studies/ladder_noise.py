"""What a ladder's measurements carry besides the variants: the noise by source, and the machine's other work.

:func:`noise` splits a curve's runs, ``value[replicate, cell]``, into the cell's mean, the replicate's offset
(shared by its runs: its seed) and each run's own, and gives the two sources' standard deviations, each free
of the other (a two-way analysis of variance without interaction: the offsets' variance less the runs' share of
it). Read on the losses it is the noise a synthetic ladder should be drawn with; on the log of the training
times it is how far one run's time says what its cell costs. :func:`shared_timings` counts the runs that
trained while the machine's load average exceeded its cores (summary.json's ``load``): their times measure the
other work as much as the run, and no cost claim is read from them."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from zoo.lab.studies.runset import Run


@dataclass(frozen=True)
class Noise:
    """The sources' standard deviations (nan: not identified), pooled over ``curves`` curves."""

    seed: float  # a replicate's offset, shared by its runs
    run: float  # a run's own
    curves: int = 1


def sums(value: np.ndarray) -> tuple[float, int, float, int, int] | None:
    """(offsets' sum of squares, its degrees of freedom, the runs' own, theirs, cells) of a complete
    ``value[replicate, cell]`` (the cells every replicate ran), or None under 2 replicates or cells."""
    full = value[:, np.isfinite(value).all(axis=0)]
    n, k = full.shape
    if n < 2 or k < 2:
        return None
    cell, offset = full.mean(axis=0), full.mean(axis=1, keepdims=True) - full.mean()
    residual = full - cell - offset
    return float(k * (offset**2).sum()), n - 1, float((residual**2).sum()), (n - 1) * (k - 1), k


def noise(values: Iterable[np.ndarray]) -> Noise:
    """The seed's and the run's standard deviations, pooled over curves ``values`` (each ``[replicate, cell]``)."""
    parts = [p for p in (sums(v) for v in values) if p is not None]
    if not parts:
        return Noise(math.nan, math.nan, 0)
    run_ss, run_df = sum(p[2] for p in parts), sum(p[3] for p in parts)
    run_var = run_ss / run_df if run_df else math.nan
    seed_var = [(p[0] / p[1] - run_var) / p[4] for p in parts]
    return Noise(math.sqrt(max(0.0, float(np.mean(seed_var)))), math.sqrt(run_var), len(parts))


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
