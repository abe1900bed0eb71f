"""Reaching a target (``report.target``): per run, the step, the FLOPs and the training seconds at which its
validation metric first reaches the target, read linearly between the two evaluations that bracket the
crossing (optionally on an EMA of the evaluations, ``report.target_ema``); per variant, modded-nanogpt's pass
rule: ``(target - mean final metric) x sqrt(n) > report.margin`` (the sign turned for a metric where higher is
better). A run that never reaches the target is counted as such, never dropped; fewer than
:data:`MIN_RUNS` runs with a final value get no verdict.

The rule's error rate: with n runs whose final metrics are independent draws of spread sigma about a true mean
at the target, ``(target - mean) x sqrt(n) / sigma`` is a standard normal draw (for normal noise), so a margin
of ``z x sigma`` passes such a variant with probability ``1 - Phi(z)`` (1.645 sigma: 5%). The rule fixes the
margin, not the rate: the rate it controls depends on the sigma the margin was set for.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from zoo.lab.records.metrics import read_metrics
from zoo.lab.studies.runset import Run, Variant

#: The fewest runs with a final value a variant needs for a pass or fail.
MIN_RUNS = 2


@dataclass(frozen=True)
class Crossing:
    """Where one run's curve first reaches the target: its step, FLOPs and training seconds (None: never)."""

    step: float | None
    flops: float | None = None
    seconds: float | None = None


@dataclass
class TargetResult:
    """A variant against the target: each run's crossing, the mean final metric, the rule's score and verdict."""

    crossings: list[Crossing]
    finals: list[float]
    score: float | None  # (target - mean) x sqrt(n), signed so that larger is better
    verdict: str  # pass | fail | too few runs
    reason: str

    @property
    def reached(self) -> list[Crossing]:
        return [c for c in self.crossings if c.step is not None]

    def mean_of(self, name: str) -> float | None:
        """The mean ``step``, ``flops`` or ``seconds`` to the target over the runs that reached it."""
        values = [getattr(c, name) for c in self.reached if getattr(c, name) is not None]
        return statistics.fmean(values) if values else None


@dataclass
class TargetStudy:
    """``report.target``'s answer for every variant of a report (by variant key)."""

    target: float
    margin: float
    ema: float
    metric: str
    results: dict[tuple[str, ...], TargetResult] = field(default_factory=dict)


def better_or_equal(value: float, target: float, mode: str) -> bool:
    return value <= target if mode == "min" else value >= target


def smoothed(values: Sequence[float], ema: float) -> list[float]:
    """``values`` read through an exponential moving average of weight ``ema`` on the past (bias-corrected, as
    Adam's moments are); ``ema`` 0: the values as they are."""
    out, mean = [], 0.0
    for i, value in enumerate(values, 1):
        mean = ema * mean + (1 - ema) * value
        out.append(mean / (1 - ema**i) if ema > 0 else value)
    return out


def crossing_step(curve: Sequence[tuple[float, float]], target: float, mode: str) -> float | None:
    """The first step at which ``curve`` (``(step, value)`` in step order) reaches ``target``: linear in step
    between the last evaluation short of it and the first that reaches it; None when none does."""
    for i, (step, value) in enumerate(curve):
        if not better_or_equal(value, target, mode):
            continue
        if i == 0:
            return float(step)
        before, was = curve[i - 1]
        return before + (target - was) * (step - before) / (value - was)
    return None


def at_step(points: Sequence[tuple[float, float]], step: float) -> float | None:
    """``points`` (``(step, value)``, in step order) read linearly at ``step``; None outside them."""
    for (s0, v0), (s1, v1) in itertools.pairwise(points):
        if s0 <= step <= s1:
            return v0 if s1 == s0 else v0 + (v1 - v0) * (step - s0) / (s1 - s0)
    return points[0][1] if points and points[0][0] == step else None


def training_seconds(records: Sequence[dict[str, Any]]) -> list[tuple[float, float]]:
    """``(step, training seconds so far)`` at each logged step, from the ``train`` records' tokens and rates
    (each record's ``tokens_per_s`` is its interval's), starting at ``(0, 0)``."""
    points, seconds, tokens = [(0.0, 0.0)], 0.0, 0
    for r in records:
        if r.get("kind") != "train" or not r.get("tokens_per_s"):
            continue
        seconds += (r["tokens"] - tokens) / r["tokens_per_s"]
        tokens = r["tokens"]
        points.append((float(r["step"]), seconds))
    return points


def run_crossing(records: Sequence[dict[str, Any]], metric: str, target: float, mode: str, ema: float,
                 flops_per_token: float | None) -> tuple[Crossing, float | None]:  # fmt: skip
    """One run's crossing of ``target`` and its final value on the curve read (the last evaluation's, smoothed
    with ``ema``), from its ``metrics.jsonl`` records."""
    evals = [r for r in records if r.get("kind") == "val" and isinstance(r.get(metric), (int, float))]
    evals = [r for r in evals if math.isfinite(r[metric])]
    if not evals:
        return Crossing(None), None
    first = 1 if evals[0]["step"] == 0 else 0  # the initial weights' evaluation is read as it is
    values = [r[metric] for r in evals[:first]] + smoothed([r[metric] for r in evals[first:]], ema)
    step = crossing_step([(r["step"], v) for r, v in zip(evals, values, strict=True)], target, mode)
    if step is None:
        return Crossing(None), values[-1]
    tokens = at_step([(r["step"], r["tokens"]) for r in evals], step)
    flops = tokens * flops_per_token if tokens is not None and flops_per_token else None
    return Crossing(step, flops, at_step(training_seconds(records), step)), values[-1]


def pass_rule(finals: Sequence[float], target: float, margin: float, mode: str) -> tuple[float | None, str, str]:
    """modded-nanogpt's rule on a variant's final values: its score ``(target - mean) x sqrt(n)`` (signed so
    that larger is better), its verdict (``pass``, ``fail``, ``too few runs``) and the reason, in words."""
    n = len(finals)
    if n < MIN_RUNS:
        return None, "too few runs", f"{n} run{'s' if n != 1 else ''} with a final value: the rule needs {MIN_RUNS}"
    mean = statistics.fmean(finals)
    score = ((target - mean) if mode == "min" else (mean - target)) * math.sqrt(n)
    verdict = "pass" if score > margin else "fail"
    sign = ">" if score > margin else "<="
    gap = "target - mean" if mode == "min" else "mean - target"
    return score, verdict, f"({gap}) x sqrt({n}) = {score:.4g} {sign} margin {margin:g}"


def variant_target(variant: Variant, metric: str, mode: str, target: float, margin: float, ema: float) -> TargetResult:
    """A variant's runs against the target: every run's crossing (a failed run: never reached), the rule."""
    crossings, finals = [], []
    for run in variant.runs:
        crossing, final = crossing_of(run, metric, mode, target, ema)
        crossings.append(crossing)
        if run.status == "ok" and final is not None:
            finals.append(final)
    score, verdict, reason = pass_rule(finals, target, margin, mode)
    return TargetResult(crossings, finals, score, verdict, reason)


def crossing_of(run: Run, metric: str, mode: str, target: float, ema: float) -> tuple[Crossing, float | None]:
    if run.status != "ok":
        return Crossing(None), None
    return run_crossing(read_metrics(run.path), metric, target, mode, ema, run.record.flops_per_token)


def target_study(variants: Sequence[Variant], metric: str, mode: str, options: dict[str, float]) -> TargetStudy:
    """``report.target`` (``options``: target, margin, target_ema) for each of ``variants``."""
    study = TargetStudy(options["target"], options["margin"], options["target_ema"], metric)
    for variant in variants:
        study.results[variant.key] = variant_target(variant, metric, mode, study.target, study.margin, study.ema)
    return study
