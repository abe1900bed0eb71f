"""A scaling ladder's fit: each variant's loss against training compute, and its compute multiplier.

A ladder trains every variant at several widths and budgets on several seeds (``zoo-sweep ladder``,
docs/sweeps.md#ladders). Per variant, each (width, budget) cell's loss is averaged over the seeds and the
runs' training FLOPs are the compute. On the compute-optimal envelope (the cells that reach a lower loss
than every cell of less compute) the loss follows

    L(C) = E + A (C / C0)^-alpha

with C0 the ladder's geometric-mean compute (so A is on the loss's own scale) and the floor E shared by every
variant (the loss no amount of compute removes: the data's, whatever the architecture, Hoffmann et al.'s E);
fitted jointly by least squares on log L with a Huber loss (``scipy.optimize.least_squares``) from a grid of
starting points, the best converged fit kept (Hoffmann et al. 2022's approach 3, as Besiroglu et al. 2024
re-examine it). A floor per variant, fitted on the few cells of its envelope, sits close to its last cells
and leaves a better variant's loss below the baseline's floor, a multiplier no compute could give.

The **compute multiplier** of a variant at compute C is the compute the baseline's law needs to reach the
variant's loss at C, over C: above 1 the variant is worth that much more compute than the baseline, below 1
less. It is read at the largest compute the variant trained and at ``extrapolate`` times it. Its interval:
each seed's runs refitted (the variant's and the baseline's of the same seed), the per-seed log multipliers
under the report's test (a t interval, a permutation or a bootstrap over the seeds), exponentiated; the same
for the exponents' difference ``alpha - alpha_baseline`` (above 0: the variant's loss falls faster, the gap
grows with compute). A ladder too small to fit (fewer than 3 widths or 3 budgets, an envelope of fewer than
3 cells) or a fit that does not converge raises :class:`LadderError`, naming it, instead of giving a number.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from zoo.lab.studies.runset import Run
from zoo.lab.studies.stats import MIN_PAIRS, NOISE, TOO_FEW, paired_test

#: The fewest widths and budgets a ladder needs, and envelope cells a law is fitted on (three parameters).
MIN_RUNGS = 3
#: The Huber loss's threshold on the residual of log L (0.1%: a cell further off counts linearly).
HUBER = 1e-3
#: Starting points: fractions of the least loss for E, and exponents.
START_E = (0.0, 0.5, 0.8, 0.95)
START_ALPHA = (0.05, 0.2, 0.5, 1.0)


class LadderError(ValueError):
    """A ladder that cannot be fitted, with the reason (shown in the report instead of a number)."""


@dataclass(frozen=True)
class Cell:
    """A (width, budget) rung: its training compute (FLOPs) and loss, one seed's or the mean over seeds."""

    width: int
    steps: int
    compute: float
    loss: float


@dataclass
class PowerLaw:
    """``L(C) = E + A (C / c0)^-alpha`` and the cells it was fitted on, with their log residuals."""

    E: float
    A: float
    alpha: float
    c0: float
    cells: list[Cell] = field(default_factory=list)
    residuals: list[float] = field(default_factory=list)  # log L fitted minus log L measured, per cell

    def loss(self, compute: float) -> float:
        return self.E + self.A * (compute / self.c0) ** -self.alpha

    def compute_for(self, loss: float) -> float:
        """The compute at which this law reaches ``loss`` (inf when it is at or below the law's floor E)."""
        return self.c0 * (self.A / (loss - self.E)) ** (1 / self.alpha) if loss > self.E else math.inf


def envelope(cells: Sequence[Cell]) -> list[Cell]:
    """The compute-optimal cells: in order of compute, each with a lower loss than every cell of less compute."""
    kept: list[Cell] = []
    for cell in sorted(cells, key=lambda c: (c.compute, c.loss)):
        if not kept or cell.loss < kept[-1].loss:
            kept.append(cell)
    return kept


def fit_laws(cells: dict[Any, Sequence[Cell]], c0: float, label: str) -> dict[Any, PowerLaw]:
    """Each variant's law fitted on its envelope, the floor E shared by all (see the module docstring);
    :class:`LadderError` when an envelope has fewer than :data:`MIN_RUNGS` cells or no start converges."""
    fronts = {key: envelope(c) for key, c in cells.items()}
    for key, front in fronts.items():
        if len(front) < MIN_RUNGS:
            name = " ".join(map(str, key)) if isinstance(key, tuple) else str(key)
            where = f"{label}: {name}" if len(fronts) > 1 else label
            raise LadderError(f"{where}: {len(front)} cells on the compute-optimal envelope, a fit needs at least "
                              f"{MIN_RUNGS} (more widths or budgets, or budgets where wider models win)")  # fmt: skip
    keys = list(fronts)
    xs = [np.array([c.compute / c0 for c in fronts[k]]) for k in keys]
    ys = [np.log([c.loss for c in fronts[k]]) for k in keys]
    low = float(min(c.loss for f in fronts.values() for c in f))

    def residuals(p: np.ndarray) -> np.ndarray:
        return np.concatenate([np.log(p[0] + np.exp(p[1 + 2 * i]) * x ** -p[2 + 2 * i]) - y
                               for i, (x, y) in enumerate(zip(xs, ys, strict=True))])  # fmt: skip

    lower = [0.0] + [-30.0, 1e-3] * len(keys)
    upper = [low * (1 - 1e-6)] + [30.0, 5.0] * len(keys)
    best = None
    for e0 in START_E:
        for a0 in START_ALPHA:
            start = np.array([e0 * low] + [math.log(max(low * (1 - e0), 1e-6)), a0] * len(keys))
            fit = least_squares(residuals, start, bounds=(lower, upper), loss="huber", f_scale=HUBER)
            if fit.success and np.all(np.isfinite(fit.x)) and (best is None or fit.cost < best.cost):
                best = fit
    if best is None:
        raise LadderError(f"{label}: the fit did not converge from any of {len(START_E) * len(START_ALPHA)} starts")
    p, r = [float(v) for v in best.x], [float(v) for v in residuals(best.x)]
    out, at = {}, 0
    for i, key in enumerate(keys):
        n = len(fronts[key])
        out[key] = PowerLaw(p[0], math.exp(p[1 + 2 * i]), p[2 + 2 * i], c0, list(fronts[key]), r[at : at + n])
        at += n
    return out


def fit_law(cells: Sequence[Cell], c0: float, label: str) -> PowerLaw:
    """One variant's law on its own (:func:`fit_laws` with one variant: its own floor E)."""
    return fit_laws({label: cells}, c0, label)[label]


def multiplier(variant: PowerLaw, baseline: PowerLaw, compute: float) -> float:
    """The baseline's compute to reach the variant's loss at ``compute``, over ``compute`` (inf: never)."""
    return baseline.compute_for(variant.loss(compute)) / compute


def ladder_cells(runs: Sequence[Run], metric: str) -> dict[Any, list[Cell]]:
    """``{seed: its cells}`` of a variant's finished runs: width ``block.d_model``, budget ``train.steps``, the
    run's training FLOPs (a branch's count its source's steps) and its final ``metric``."""
    out: dict[Any, list[Cell]] = {}
    for run in runs:
        value, flops = run.record.final_value(metric), run.record.flops
        config = run.record.config or {}
        width, steps = (config.get("block") or {}).get("d_model"), (config.get("train") or {}).get("steps")
        ok = isinstance(value, (int, float)) and math.isfinite(value) and isinstance(flops, (int, float))
        if run.status == "ok" and ok and flops > 0 and width and steps:
            out.setdefault(run.seed, []).append(Cell(int(width), int(steps), float(flops), float(value)))
    return out


def mean_cells(per_seed: dict[Any, list[Cell]]) -> list[Cell]:
    """Each (width, budget) cell averaged over the seeds that ran it (compute and loss)."""
    groups: dict[tuple[int, int], list[Cell]] = {}
    for cells in per_seed.values():
        for c in cells:
            groups.setdefault((c.width, c.steps), []).append(c)
    return [Cell(w, s, statistics.fmean(c.compute for c in g), statistics.fmean(c.loss for c in g))
            for (w, s), g in sorted(groups.items())]  # fmt: skip


def check_rungs(per_seed: dict[Any, list[Cell]], label: str) -> None:
    """:class:`LadderError` for a variant with fewer than :data:`MIN_RUNGS` widths or budgets."""
    cells = [c for cs in per_seed.values() for c in cs]
    widths, budgets = sorted({c.width for c in cells}), sorted({c.steps for c in cells})
    for name, found in (("widths (block.d_model)", widths), ("budgets (train.steps)", budgets)):
        if len(found) < MIN_RUNGS:
            shown = ", ".join(map(str, found)) or "none"
            raise LadderError(f"{label}: {len(found)} {name} finished ({shown}); a ladder needs at least {MIN_RUNGS}")


@dataclass
class Interval:
    """A per-seed quantity's mean with its interval under the report's test, and the verdict."""

    mean: float | None
    low: float | None
    high: float | None
    verdict: str
    seeds: int


def seed_interval(values: Sequence[float], test: str, log: bool, center: float, words: tuple[str, str]) -> Interval:
    """The per-seed ``values``' mean and interval under ``test`` (on a log scale when ``log``, back-transformed);
    the verdict ``words[0]`` when the interval lies above ``center``, ``words[1]`` below, else within noise."""
    usable = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if len(usable) < len(values):
        return Interval(None, None, None, "out of range (a seed's loss lies beyond the baseline's fitted floor)",
                        len(values))  # fmt: skip
    if len(usable) < MIN_PAIRS:
        return Interval(None, None, None, TOO_FEW, len(values))
    mean, low, high, _, _ = paired_test([math.log(v) if log else v for v in usable], test)
    back = math.exp if log else (lambda v: v)
    mean, low, high = float(back(mean)), float(back(low)), float(back(high))
    verdict = words[0] if low > center else words[1] if high < center else NOISE
    return Interval(mean, low, high, verdict, len(values))


#: The keys a ladder varies within a variant: the width, the budget and the branch a budget came from.
def is_rung_key(key: str) -> bool:
    return key in ("block.d_model", "train.steps") or key.startswith("train.branch.")


@dataclass
class LadderRow:
    """One variant on the ladder: its law (seed means) and each seed's, and against the baseline's."""

    key: tuple[str, ...]
    fit: PowerLaw
    seed_fits: dict[Any, PowerLaw]
    compute: float  # the largest compute it trained (a cell's mean over seeds)
    multiplier: Interval | None = None  # None for the baseline
    multiplier_far: Interval | None = None  # at LadderStudy.extrapolate x compute
    alpha_delta: Interval | None = None


@dataclass
class LadderStudy:
    """Every variant's row, keyed by its values of ``axes`` (the sweep's axes but the rungs'), or the error."""

    metric: str
    axes: list[str]
    baseline: tuple[str, ...]
    extrapolate: float
    rows: dict[tuple[str, ...], LadderRow] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def fit_rows(per_variant: dict[tuple[str, ...], dict[Any, list[Cell]]], c0: float) -> dict[tuple[str, ...], LadderRow]:
    """Every variant's law on the seed means and on each seed, the floor E shared within each fit."""
    means = {key: mean_cells(per_seed) for key, per_seed in per_variant.items()}
    fits = fit_laws(means, c0, "the ladder")
    seeds = sorted({s for per_seed in per_variant.values() for s in per_seed}, key=str)
    by_seed = {s: fit_laws({k: v[s] for k, v in per_variant.items() if s in v}, c0, f"seed {s}") for s in seeds}
    return {key: LadderRow(key, fits[key], {s: f[key] for s, f in by_seed.items() if key in f},
                           max(c.compute for c in means[key])) for key in per_variant}  # fmt: skip


def compare_rows(row: LadderRow, base: LadderRow, test: str, extrapolate: float) -> None:
    """The row's multiplier (at its largest compute and ``extrapolate`` x it) and exponent difference against
    ``base``, each seed's law against the baseline's of the same seed."""
    seeds = [s for s in row.seed_fits if s in base.seed_fits]
    words = ("better", "worse")
    for name, at in (("multiplier", row.compute), ("multiplier_far", row.compute * extrapolate)):
        values = [multiplier(row.seed_fits[s], base.seed_fits[s], at) for s in seeds]
        setattr(row, name, seed_interval(values, test, log=True, center=1.0, words=words))
    deltas = [row.seed_fits[s].alpha - base.seed_fits[s].alpha for s in seeds]
    row.alpha_delta = seed_interval(deltas, test, log=False, center=0.0, words=("steeper", "shallower"))


def ladder_study(
    runs: Sequence[Run], axes: Sequence[str], baseline: dict[str, str], metric: str, mode: str, test: str,
    extrapolate: float = 10.0,
) -> LadderStudy:  # fmt: skip
    """The ladder's laws and multipliers: ``runs`` grouped by their values of ``axes`` less the rungs' keys,
    each against the ``baseline`` variant (its values of those axes), on ``metric`` under ``test``."""
    variant_axes = [a for a in axes if not is_rung_key(a)]
    base_key = tuple(baseline.get(a, "") for a in variant_axes)
    study = LadderStudy(metric, variant_axes, base_key, extrapolate)
    if mode != "min":
        study.errors.append(f"{metric}: a ladder fits a loss (lower is better), not a {mode}-is-better metric")
        return study
    groups: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        groups.setdefault(tuple(run.value(a) for a in variant_axes), []).append(run)
    computes = [r.record.flops for r in runs if isinstance(r.record.flops, (int, float)) and r.record.flops > 0]
    if not computes:
        study.errors.append("no run recorded its training FLOPs (summary flops)")
        return study
    c0 = math.exp(statistics.fmean(math.log(c) for c in computes))
    per_variant = {}
    for key, group in groups.items():
        label = " ".join(f"{a}={v}" for a, v in zip(variant_axes, key, strict=True)) or "the ladder"
        try:
            cells = ladder_cells(group, metric)
            check_rungs(cells, label)  # a variant too small for a fit is named and left out of it
            per_variant[key] = cells
        except LadderError as error:
            study.errors.append(str(error))
    try:
        study.rows = fit_rows(per_variant, c0) if per_variant else {}
    except LadderError as error:
        study.errors.append(str(error))
    base = study.rows.get(base_key)
    if base is None:
        study.errors.append("the baseline variant has no fit: no multiplier is given")
        return study
    for key, row in study.rows.items():
        if key != base_key:
            compare_rows(row, base, test, extrapolate)
    return study
