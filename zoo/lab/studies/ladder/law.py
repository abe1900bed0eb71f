"""A ladder's law, the secondary answer: ``L(C) = E + A (C / C0)^-alpha`` fitted per pair, and how far it holds.

The law is fitted on the two envelopes of one pair only, the variant's and the baseline's (never the whole
sweep: a pair's answer must not move with its companions), by least squares on log L with a Huber loss
(``scipy.optimize.least_squares``) from a grid of starting points, the best converged fit kept (Hoffmann et
al. 2022's functional form fitted as Besiroglu et al. 2024 do). It is L(C) on the envelope, not approach 3's
L(N, D) on every run: a ladder's few widths and budgets per seed do not pin five parameters per curve, the
envelope is what the primary answer (zoo.lab.studies.ladder.iso) reads too, and L(C) is read at a compute,
as the multiplier is. C0 is the pair's geometric-mean compute, so A is on the loss's own scale.

Two floors: the pair's shared floor E (the data's loss, whatever the block) and each curve's own. Where the
law's answers under the two differ by more than its interval, the answer is the floor's, not the data's
(``floor-dependent``). The held-out check (OLMo's practice, Bhagia et al. 2024) refits the pair without its
largest width and reads each curve's error on the cells it left out, beside the effect it predicts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import least_squares

#: The fewest envelope cells a law is fitted on (three parameters per curve).
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
    """A (width, budget) rung: its training compute (FLOPs), loss and training time (s; nan: not recorded),
    one seed's or the mean over seeds."""

    width: int
    steps: int
    compute: float
    loss: float
    time: float = math.nan


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


def fit_laws(cells: dict[Any, Sequence[Cell]], c0: float, label: str,
             start: Sequence[float] | None = None) -> dict[Any, PowerLaw]:  # fmt: skip
    """Each curve's law fitted on its envelope, the floor E shared by all of ``cells`` (one curve: its own);
    :class:`LadderError` when an envelope has fewer than :data:`MIN_RUNGS` cells or no start converges.
    ``start``: one starting point (a fit's parameters) instead of the grid."""
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

    def jacobian(p: np.ndarray) -> np.ndarray:
        rows = []
        for i, x in enumerate(xs):
            term = np.exp(p[1 + 2 * i]) * x ** -p[2 + 2 * i]
            block = np.zeros((len(x), len(p)))
            block[:, 0] = 1 / (p[0] + term)
            block[:, 1 + 2 * i], block[:, 2 + 2 * i] = term * block[:, 0], -term * np.log(x) * block[:, 0]
            rows.append(block)
        return np.concatenate(rows)

    lower, upper = [0.0] + [-30.0, 1e-3] * len(keys), [low * (1 - 1e-6)] + [30.0, 5.0] * len(keys)
    starts = [np.clip(np.array(start, float), np.array(lower) + 1e-9, np.array(upper) - 1e-9)] if start else [
        np.array([e0 * low] + [math.log(max(low * (1 - e0), 1e-6)), a0] * len(keys))
        for e0 in START_E for a0 in START_ALPHA]  # fmt: skip
    best = None
    for x0 in starts:
        fit = least_squares(residuals, x0, jac=jacobian, bounds=(lower, upper), loss="huber", f_scale=HUBER)
        if fit.success and np.all(np.isfinite(fit.x)) and (best is None or fit.cost < best.cost):
            best = fit
    if best is None:
        raise LadderError(f"{label}: the fit did not converge from any of {len(starts)} starts")
    p, r = [float(v) for v in best.x], [float(v) for v in residuals(best.x)]
    out, at = {}, 0
    for i, key in enumerate(keys):
        n = len(fronts[key])
        out[key] = PowerLaw(p[0], math.exp(p[1 + 2 * i]), p[2 + 2 * i], c0, list(fronts[key]), r[at : at + n])
        at += n
    return out


def fit_law(cells: Sequence[Cell], c0: float, label: str) -> PowerLaw:
    """One curve's law on its own (:func:`fit_laws` with one curve: its own floor E)."""
    return fit_laws({label: cells}, c0, label)[label]


def parameters(base: PowerLaw, var: PowerLaw) -> list[float]:
    """A shared-floor pair fit's parameters, as :func:`fit_laws` takes them for ``start``."""
    return [base.E, math.log(base.A), base.alpha, math.log(var.A), var.alpha]


def multiplier(variant: PowerLaw, baseline: PowerLaw, compute: float) -> float:
    """The baseline's compute to reach the variant's loss at ``compute``, over ``compute`` (inf: never)."""
    return baseline.compute_for(variant.loss(compute)) / compute


@dataclass
class HeldOut:
    """The pair refitted without its largest width: each curve's RMS error (log L) on that width's envelope
    cells, and how far beyond the refit's largest compute those cells lie (the reach it tested)."""

    width: int
    base_error: float
    var_error: float
    reach: float

    @property
    def error(self) -> float:
        return max(self.base_error, self.var_error)


def held_out(base: Sequence[Cell], var: Sequence[Cell], c0: float, start: Sequence[float]) -> HeldOut | None:
    """:class:`HeldOut` for the pair (cells: seed means; ``start``: the full fit's parameters); None when the
    refit has too few cells to fit."""
    width = max(c.width for c in [*base, *var])
    try:
        laws = fit_laws({"b": [c for c in base if c.width < width], "v": [c for c in var if c.width < width]},
                        c0, "held out", start)  # fmt: skip
    except LadderError:
        return None
    errors, reach = [], 1.0
    for key, cells in (("b", base), ("v", var)):
        front = envelope(cells)
        out = [c for c in front if c.width == width] or [max((c for c in cells if c.width == width),
                                                             key=lambda c: c.compute)]  # fmt: skip
        errors.append(math.sqrt(sum(math.log(laws[key].loss(c.compute) / c.loss) ** 2 for c in out) / len(out)))
        kept = max(c.compute for c in cells if c.width < width)
        reach = max(reach, max(c.compute for c in out) / kept)
    return HeldOut(width, errors[0], errors[1], reach)
