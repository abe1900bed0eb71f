"""Is variant A better than B? Paired differences over seeds, Student t intervals and verdicts.

Runs with the same seed share their initial weights and data order, so the difference between two
variants is measured per seed and the interval is taken over those differences (a paired t
interval): it is much narrower than the two variants' spreads suggest when the seeds move both the
same way. Where runs do not pair (different seeds), Welch's interval over the two groups is used and
labelled unpaired. Fewer than :data:`MIN_PAIRS` pairs (or runs per side, unpaired): no interval, the
verdict is ``too few seeds``. The distributions come from ``scipy.stats``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from scipy import stats as sps

#: Fewer pairs than this (or, unpaired, fewer runs on either side) give no interval.
MIN_PAIRS = 3
#: Confidence of every interval.
CONFIDENCE = 0.95
#: ``report.correction``: none (each interval at 95%) or holm (family-wise over a report's comparisons).
CORRECTIONS = ("none", "holm")

BETTER, WORSE, NOISE, TOO_FEW = "better", "worse", "within noise", "too few seeds"


@dataclass
class Comparison:
    """``variant - baseline`` for one metric: mean difference, its interval, the verdict."""

    delta_mean: float | None
    low: float | None
    high: float | None
    verdict: str
    pairs: int  # seeds (and other-axis values) both sides ran; 0 when unpaired
    paired: bool
    n_variant: int
    n_baseline: int
    p_value: float | None = None
    p_adjusted: float | None = None  # Holm's, when the report applies it

    @property
    def test(self) -> str:
        if self.low is None:
            return ""
        return "paired t" if self.paired else "Welch (unpaired)"


def t_interval(diffs: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float, float]:
    """Mean of ``diffs``, Student t interval over them and the two-sided p-value of mean 0."""
    n = len(diffs)
    mean = statistics.fmean(diffs)
    sd = statistics.stdev(diffs)
    se = sd / math.sqrt(n)
    if se == 0:  # every pair differs by the same amount: the interval is that point
        return mean, mean, mean, (1.0 if mean == 0 else 0.0)
    half = sps.t.ppf(0.5 + confidence / 2, n - 1) * se
    p = 2 * sps.t.sf(abs(mean) / se, n - 1)
    return mean, mean - half, mean + half, float(p)


def welch_interval(
    a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float, float, float]:
    """mean(a) - mean(b), Welch's t interval (Welch-Satterthwaite degrees of freedom) and its p-value."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    mean = statistics.fmean(a) - statistics.fmean(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return mean, mean, mean, (1.0 if mean == 0 else 0.0)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = sps.t.ppf(0.5 + confidence / 2, df) * se
    p = 2 * sps.t.sf(abs(mean) / se, df)
    return mean, mean - half, mean + half, float(p)


def verdict_of(low: float, high: float, mode: str) -> str:
    """``better`` / ``worse`` when the interval of ``variant - baseline`` excludes 0, in the metric's direction."""
    if low > 0:
        return WORSE if mode == "min" else BETTER
    if high < 0:
        return BETTER if mode == "min" else WORSE
    return NOISE


def compare(
    variant: Mapping[Hashable, float],
    baseline: Mapping[Hashable, float],
    mode: str,
    confidence: float = CONFIDENCE,
) -> Comparison:
    """``variant - baseline``; each maps a pairing key (seed, other axes' values) to a run's final metric.

    Paired over the keys both have when there are at least :data:`MIN_PAIRS`; otherwise Welch's
    unpaired interval when both sides have that many runs; otherwise ``too few seeds``.
    """
    common = [k for k in variant if k in baseline]
    n_v, n_b = len(variant), len(baseline)
    if len(common) >= MIN_PAIRS:
        mean, low, high, p = t_interval([variant[k] - baseline[k] for k in common], confidence)
        return Comparison(mean, low, high, verdict_of(low, high, mode), len(common), True, n_v, n_b, p)
    if n_v >= MIN_PAIRS and n_b >= MIN_PAIRS:
        mean, low, high, p = welch_interval(list(variant.values()), list(baseline.values()), confidence)
        return Comparison(mean, low, high, verdict_of(low, high, mode), len(common), False, n_v, n_b, p)
    mean = None
    if common:
        mean = statistics.fmean(variant[k] - baseline[k] for k in common)
    elif variant and baseline:
        mean = statistics.fmean(variant.values()) - statistics.fmean(baseline.values())
    return Comparison(mean, None, None, TOO_FEW, len(common), bool(common), n_v, n_b)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error), in the input's order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def apply_holm(comparisons: Sequence[Comparison], mode: str, confidence: float = CONFIDENCE) -> None:
    """Adjust the p-values of the comparisons that have an interval; their verdicts follow the adjusted ones."""
    tested = [c for c in comparisons if c.p_value is not None]
    for c, p in zip(tested, holm([c.p_value for c in tested]), strict=True):  # type: ignore[misc]
        c.p_adjusted = p
        if p >= 1 - confidence:
            c.verdict = NOISE
        else:
            assert c.delta_mean is not None
            c.verdict = verdict_of(c.delta_mean, c.delta_mean, mode) if c.delta_mean != 0 else NOISE


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float] | None:
    """Mean of ``values`` and its Student t interval (None under two values)."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    half = sps.t.ppf(0.5 + confidence / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half
