"""Is variant A better than B? Paired differences over seeds, their intervals and verdicts.

Runs with the same seed share their initial weights and data order, so the difference between two
variants is measured per seed and the interval is taken over those differences: it is much narrower
than the two variants' spreads suggest when the seeds move both the same way. The interval over the
per-seed differences is one of :data:`TESTS`: Student t, the exact sign-flip permutation test
(inverted into an interval) or a percentile bootstrap; ``auto`` takes the permutation test for a
bounded metric (accuracy, exact match: a run recalls or it does not) and t otherwise. Differences
pooled over other axes are averaged per seed first (the seed is the independent unit, not the pair).
Where runs do not pair (different seeds), Welch's interval over the two groups is used and labelled
unpaired. Fewer than :data:`MIN_PAIRS` seeds (or per side, unpaired): no interval, the verdict is
``too few seeds``. No interval extends past what the metric can take (accuracy in [0, 1]: a
difference in [-1, 1]); one that would is clipped and says so. The distributions come from
``scipy.stats``.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from zoo.core.errors import ConfigError
from zoo.lab.planning.options import TESTS


def sps():  # noqa: ANN201  (the module)
    """``scipy.stats``, imported on first use: a training process imports this module through the tuning and
    report code it shares with sweeps and never computes a statistic (the import costs it a second)."""
    from scipy import stats

    return stats


#: Fewer pairs than this (or, unpaired, fewer runs on either side) give no interval.
MIN_PAIRS = 3
#: Confidence of every interval.
CONFIDENCE = 0.95

#: Up to this many seeds the permutation test enumerates every sign pattern (2^n); above, a random sample.
EXACT_MAX = 13
#: Random sign patterns (above :data:`EXACT_MAX` seeds) and bootstrap resamples; drawn from a fixed seed.
RESAMPLES = 9999
#: What a metric can take (by its name less ``val_`` and a length suffix ``_4x``): its differences are clipped
#: to ``[low - high, high - low]``.
METRIC_RANGES = {"accuracy": (0.0, 1.0), "exact_match": (0.0, 1.0)}
#: Metrics with a success threshold: a run passes at or above it. MQAR: a run that recalls scores 0.999-1.000,
#: one on the guessing plateau 0.34-0.40 (docs/results.md, section 5); transduce: nine sequences in ten right.
PASS_AT = {"accuracy": 0.9, "exact_match": 0.9}

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
    units: int = 0  # independent units the interval is over: paired seeds (unpaired: both sides' seeds)
    method: str = "t"  # t | permutation | bootstrap (unpaired: always Welch's t)
    exact: bool = True  # permutation: every sign pattern enumerated
    clipped: bool = False  # the interval was cut to the metric's feasible range

    @property
    def test(self) -> str:
        if self.low is None:
            return ""
        if not self.paired:
            return "Welch (unpaired)"
        if self.method == "permutation":
            return "paired sign-flip permutation" + (" (exact)" if self.exact else f" ({RESAMPLES} random patterns)")
        return "paired bootstrap (percentile)" if self.method == "bootstrap" else "paired t"


def t_interval(diffs: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float, float]:
    """Mean of ``diffs``, Student t interval over them and the two-sided p-value of mean 0."""
    n = len(diffs)
    mean = statistics.fmean(diffs)
    sd = statistics.stdev(diffs)
    se = sd / math.sqrt(n)
    if se == 0:  # every pair differs by the same amount: the interval is that point
        return mean, mean, mean, (1.0 if mean == 0 else 0.0)
    half = sps().t.ppf(0.5 + confidence / 2, n - 1) * se
    p = 2 * sps().t.sf(abs(mean) / se, n - 1)
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
    half = sps().t.ppf(0.5 + confidence / 2, df) * se
    p = 2 * sps().t.sf(abs(mean) / se, df)
    return mean, mean - half, mean + half, float(p)


def permutation_interval(
    diffs: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float, float, float, bool]:
    """Mean of ``diffs``, the sign-flip permutation interval, its two-sided p-value of mean 0, and whether exact.

    Under "no difference" each per-seed difference is as likely negative as positive; the p-value is
    ``scipy.stats.permutation_test``'s over every sign pattern (up to :data:`EXACT_MAX` seeds). The interval
    is the test inverted: the shifts d for which the test of ``diffs - d`` keeps its null, whose ends are
    order statistics of the means of the subsets of ``diffs`` (Hartigan 1969). It is unbounded (infinite
    ends) when 2^n patterns cannot reach the confidence (fewer than 6 seeds at 95%).
    """
    x = np.asarray(diffs, dtype=float)
    n = len(x)
    exact = n <= EXACT_MAX
    rng = np.random.default_rng(0)
    result = sps().permutation_test((x,), np.mean, permutation_type="samples", vectorized=True,
                                  n_resamples=RESAMPLES, rng=rng)  # fmt: skip
    if exact:  # every nonempty subset: its members' mean
        signs = (np.arange(1, 2**n)[:, None] >> np.arange(n)) & 1
    else:  # random subsets (each member in or out with probability 1/2), the empty one redrawn as no subset
        signs = rng.integers(0, 2, size=(RESAMPLES, n))
        signs = signs[signs.any(axis=1)]
    means = np.sort(signs @ x / signs.sum(axis=1))
    k = math.ceil((1 - confidence) / 2 * (len(means) + 1)) - 1  # the k-th smallest and largest subset means
    low, high = (float(means[k - 1]), float(means[-k])) if k >= 1 else (-math.inf, math.inf)
    return float(x.mean()), low, high, float(result.pvalue), exact


def bootstrap_interval(diffs: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float, float]:
    """Mean of ``diffs``, its percentile bootstrap interval (``scipy.stats.bootstrap``) and the bootstrap p-value
    of mean 0 (twice the share of resampled means on the far side of 0)."""
    x = np.asarray(diffs, dtype=float)
    if np.all(x == x[0]):  # every pair differs by the same amount: the interval is that point
        return float(x[0]), float(x[0]), float(x[0]), (1.0 if x[0] == 0 else 0.0)
    result = sps().bootstrap((x,), np.mean, confidence_level=confidence, n_resamples=RESAMPLES, method="percentile",
                           vectorized=True, rng=np.random.default_rng(0))  # fmt: skip
    means = result.bootstrap_distribution
    p = min(1.0, 2 * min(float(np.mean(means <= 0)), float(np.mean(means >= 0))))
    return float(x.mean()), float(result.confidence_interval.low), float(result.confidence_interval.high), p


def base_metric(metric: str) -> str:
    """``val_accuracy_4x`` -> ``accuracy``: the metric's kind, less the split prefix and the length suffix."""
    return re.sub(r"_\d+x$", "", metric.removeprefix("val_").removeprefix("train_"))


def difference_range(metric: str) -> tuple[float, float] | None:
    """What a difference of ``metric`` can take (``[-1, 1]`` for an accuracy), or None when unbounded."""
    bounds = METRIC_RANGES.get(base_metric(metric))
    return None if bounds is None else (bounds[0] - bounds[1], bounds[1] - bounds[0])


def pass_threshold(metric: str, mode: str) -> float | None:
    """The value at or above which a run of ``metric`` succeeds (recall, exact match), or None."""
    return PASS_AT.get(base_metric(metric)) if mode == "max" else None


def chosen_test(test: str, metric: str) -> str:
    """``report.test`` resolved for ``metric``: ``auto`` is ``permutation`` for a bounded metric, else ``t``."""
    if test not in TESTS:
        raise ConfigError("report.test", test, f"one of {', '.join(TESTS)}")
    if test != "auto":
        return test
    return "permutation" if difference_range(metric) is not None else "t"


def paired_test(
    diffs: Sequence[float], test: str, confidence: float = CONFIDENCE
) -> tuple[float, float, float, float, bool]:
    """``(mean, low, high, p, exact)`` of the per-seed differences under ``test`` (t, permutation, bootstrap)."""
    if test == "permutation":
        return permutation_interval(diffs, confidence)
    if test == "bootstrap":
        return (*bootstrap_interval(diffs, confidence), True)
    return (*t_interval(diffs, confidence), True)


def clip(low: float, high: float, bounds: tuple[float, float] | None) -> tuple[float, float, bool]:
    """``[low, high]`` cut to ``bounds``; and whether it was cut."""
    if bounds is None or (low >= bounds[0] and high <= bounds[1]):
        return low, high, False
    return max(low, bounds[0]), min(high, bounds[1]), True


def verdict_of(low: float, high: float, mode: str) -> str:
    """``better`` / ``worse`` when the interval of ``variant - baseline`` excludes 0, in the metric's direction."""
    if low > 0:
        return WORSE if mode == "min" else BETTER
    if high < 0:
        return BETTER if mode == "min" else WORSE
    return NOISE


def unit_means(values: Mapping[Hashable, float], unit: Callable[[Hashable], Hashable]) -> dict[Hashable, float]:
    """``{unit: mean of the values whose key is in it}`` (a seed's mean over the other axes' values)."""
    groups: dict[Hashable, list[float]] = {}
    for key, value in values.items():
        groups.setdefault(unit(key), []).append(value)
    return {u: statistics.fmean(v) for u, v in groups.items()}


def compare(
    variant: Mapping[Hashable, float],
    baseline: Mapping[Hashable, float],
    mode: str,
    confidence: float = CONFIDENCE,
    test: str = "t",
    bounds: tuple[float, float] | None = None,
    unit: Callable[[Hashable], Hashable] | None = None,
) -> Comparison:
    """``variant - baseline``; each maps a pairing key (seed, other axes' values) to a run's final metric.

    The pairs' differences are averaged per ``unit`` (of a key: its seed; None: each key its own unit),
    and ``test`` (t, permutation, bootstrap) is taken over those means when there are at least
    :data:`MIN_PAIRS`; otherwise Welch's unpaired interval over each side's unit means when both sides
    have that many; otherwise ``too few seeds``. The interval is clipped to ``bounds`` (the difference's
    feasible range).
    """
    unit = unit or (lambda key: key)
    common = [k for k in variant if k in baseline]
    n_v, n_b = len(variant), len(baseline)
    diffs = unit_means({k: variant[k] - baseline[k] for k in common}, unit)
    if len(diffs) >= MIN_PAIRS:
        mean, low, high, p, exact = paired_test(list(diffs.values()), test, confidence)
        low, high, cut = clip(low, high, bounds)
        return Comparison(mean, low, high, verdict_of(low, high, mode), len(common), True, n_v, n_b, p,
                          units=len(diffs), method=test, exact=exact, clipped=cut)  # fmt: skip
    a, b = unit_means(variant, unit), unit_means(baseline, unit)
    if len(a) >= MIN_PAIRS and len(b) >= MIN_PAIRS:
        mean, low, high, p = welch_interval(list(a.values()), list(b.values()), confidence)
        low, high, cut = clip(low, high, bounds)
        return Comparison(mean, low, high, verdict_of(low, high, mode), len(common), False, n_v, n_b, p,
                          units=len(a) + len(b), clipped=cut)  # fmt: skip
    mean = None
    if diffs:
        mean = statistics.fmean(diffs.values())
    elif variant and baseline:
        mean = statistics.fmean(a.values()) - statistics.fmean(b.values())
    return Comparison(mean, None, None, TOO_FEW, len(common), bool(common), n_v, n_b, units=len(diffs), method=test)


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
    half = sps().t.ppf(0.5 + confidence / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half
