"""A ladder variant's readings judged together: one simultaneous band over all of them, and its p-value.

A variant is read several ways on the same bootstrap draws (zoo.lab.studies.ladder.iso): its iso-loss
multiplier at two losses and its paired loss difference at several costs. Each read at 95% on its own, a
variant equal to the baseline would find one of them off its null far more often than 5% of the time.
:func:`band` widens every reading's interval by the same amount instead, until :data:`CONFIDENCE` of the draws
lie inside all of them at once (a simultaneous percentile band, the max-type correction over correlated
readings): each interval is its draws' percentiles at one shared tail ``alpha_band``, which is 5% for one
reading and shrinks as the readings disagree. The intervals are then widened about their medians by
sqrt(n / (n - 1)) for n seeds, as a single reading's are (iso.log_interval). A claim's p-value is the
fraction of draws at least as far out, in that sense, as the null readings the claim needs out of the band
(:meth:`Band.p_value`): the one a ladder's verdicts are corrected with over its variants (Holm,
zoo.lab.studies.stats.holm)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from zoo.lab.studies.stats import CONFIDENCE


@dataclass
class Band:
    """Per reading, its interval (nan: too few draws have it) and how far out its null lies (:func:`tails`;
    ``below``: the null above the draws' median, the reading significantly below it); the shared tail, and
    each draw's most extreme reading's tail (what a p-value is counted against)."""

    low: np.ndarray
    high: np.ndarray
    alpha: float  # each interval's two tails together, before widening
    null_tail: np.ndarray
    below: np.ndarray
    extremes: np.ndarray

    def p_value(self, tail: float) -> float:
        """The fraction of draws whose most extreme reading lies at least as far out as ``tail`` (a null's
        :func:`tails`), counting the data as one: the band's p-value for a claim that needs that null out."""
        if not self.extremes.size or not math.isfinite(tail):
            return math.nan if not self.extremes.size else 1.0
        return float((1 + np.count_nonzero(self.extremes <= tail)) / (1 + len(self.extremes)))


def tails(draws: np.ndarray, values: np.ndarray) -> np.ndarray:
    """How far out each of ``values[row, reading]`` lies among its reading's ``draws[:, reading]``: twice the
    smaller fraction of the draws at or beyond it on either side (1 at the median; nan: no value or no draws)."""
    out = np.full(values.shape, math.nan)
    for j in range(draws.shape[1]):
        ok = np.sort(draws[np.isfinite(draws[:, j]), j])
        if not len(ok):
            continue
        below = np.searchsorted(ok, values[:, j], side="right") / len(ok)
        above = 1 - np.searchsorted(ok, values[:, j], side="left") / len(ok)
        out[:, j] = np.where(np.isfinite(values[:, j]), np.minimum(1.0, 2 * np.minimum(below, above)), math.nan)
    return out


def band(draws: np.ndarray, null: np.ndarray, seeds: int, confidence: float = CONFIDENCE) -> Band:
    """The simultaneous band of ``draws[draw, reading]`` (each reading on a scale where the draws spread
    evenly: log multipliers, loss differences) over ``seeds`` seeds, and where ``null[reading]`` lies in it.
    A reading fewer than half the draws have gets no interval and no part in the band."""
    draws = np.asarray(draws, float)
    used = np.isfinite(draws).mean(axis=0) >= 0.5
    nan = np.full(draws.shape[1], math.nan)
    if not used.any() or seeds < 2:
        return Band(nan, nan.copy(), math.nan, nan.copy(), np.zeros(len(nan), bool), np.array([]))
    sub = draws[:, used]
    extremes = np.min(np.where(np.isnan(t := tails(sub, sub)), 1.0, t), axis=1)  # each draw's most extreme reading
    alpha = float(np.quantile(extremes, 1 - confidence))
    center = np.nanmedian(sub, axis=0)
    lo, hi = np.nanpercentile(sub, [50 * alpha, 100 - 50 * alpha], axis=0)
    widen = math.sqrt(seeds / (seeds - 1))
    low, high, null_tail, below = nan.copy(), nan.copy(), nan.copy(), np.zeros(len(nan), bool)
    low[used], high[used] = center - widen * (center - lo), center + widen * (hi - center)
    unwidened = center + (np.asarray(null, float)[used] - center) / widen
    null_tail[used], below[used] = tails(sub, unwidened[None])[0], unwidened > center
    return Band(low, high, alpha, null_tail, below, extremes)
