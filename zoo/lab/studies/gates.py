"""What the gates (``report.gates``, zoo/lab/planning/gates.py) read of a report: :class:`ReportEvidence` per variant,
and each variant's gate answers.

Equal cost between sizes (``better_at_every_size``): for each seed, the variant's run and the baseline's at the same
size are read at the cost the cheaper of the two reached: training seconds (summary ``train_time_s``, evaluation
excluded, spread evenly over the run's steps), FLOPs (summary ``flops`` over its steps) or steps; each run's metric
is its validation curve (metrics.jsonl) interpolated linearly between evaluations at that step. The per-seed values
are then compared as the report compares (:func:`zoo.lab.studies.stats.compare`, the report's test).
"""

from __future__ import annotations

import math
from typing import Any

from zoo.lab.planning.gates import Finding, GateResult, evaluate, gate_options
from zoo.lab.records.metrics import read_metrics
from zoo.lab.studies.runset import Run, Variant
from zoo.lab.studies.stats import Comparison, compare, difference_range
from zoo.lab.studies.variants import Report


def finding(c: Comparison | None) -> Finding | None:
    """A comparison as a gate reads it: its verdict and ``Δ -0.0510 [-0.0920, -0.0100]`` (the mean alone without
    an interval)."""
    if c is None:
        return None
    if c.delta_mean is None:
        return Finding(c.verdict, "no difference measured")
    if c.low is None or c.high is None:
        return Finding(c.verdict, f"Δ {c.delta_mean:+.4f}")
    return Finding(c.verdict, f"Δ {c.delta_mean:+.4f} [{c.low:+.4f}, {c.high:+.4f}]")


def cost_per_step(run: Run, at: str) -> float | None:
    """What one step of ``run`` cost in ``at`` (time: seconds of training; flops; steps: 1), None unrecorded."""
    steps = run.record.steps
    if at == "steps":
        return 1.0
    total = run.record.train_time_s if at == "time" else run.record.flops
    if not isinstance(total, (int, float)) or not isinstance(steps, int) or steps <= 0 or not total > 0:
        return None
    return float(total) / steps


def value_at_step(run: Run, metric: str, step: float) -> float | None:
    """``metric`` on ``run``'s validation curve at ``step``, linear between the evaluations around it."""
    points = sorted((float(r["step"]), float(r[metric])) for r in read_metrics(run.path)
                    if r.get("kind") == "val" and isinstance(r.get(metric), (int, float)))  # fmt: skip
    if not points or step > points[-1][0] + 1e-9:
        return None
    for (s0, v0), (s1, v1) in zip(points, points[1:], strict=False):
        if s0 <= step <= s1:
            return v0 if s1 == s0 else v0 + (v1 - v0) * (step - s0) / (s1 - s0)
    return points[0][1] if step <= points[0][0] else points[-1][1]


def at_equal_cost(variant: Variant, base: Variant, metric: str, at: str) -> tuple[dict[Any, float], dict[Any, float]]:
    """Per seed both ran ok: the variant's and the baseline's ``metric`` at the cost the cheaper run reached."""
    ours, theirs = {r.seed: r for r in variant.ok}, {r.seed: r for r in base.ok}
    left, right = {}, {}
    for seed in ours.keys() & theirs.keys():
        a, b = ours[seed], theirs[seed]
        per_a, per_b = cost_per_step(a, at), cost_per_step(b, at)
        if per_a is None or per_b is None:
            continue
        cap = min(per_a * (a.record.steps or 0), per_b * (b.record.steps or 0))
        va, vb = value_at_step(a, metric, cap / per_a), value_at_step(b, metric, cap / per_b)
        if va is not None and vb is not None and math.isfinite(va) and math.isfinite(vb):
            left[seed], right[seed] = va, vb
    return left, right


def size_order(value: str) -> tuple[int, float, str]:
    """Sizes in numeric order (``64`` before ``128``), any that are not numbers after them by name."""
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


class ReportEvidence:
    """One variant of ``report`` as the gate rules read it (zoo.lab.planning.gates.Evidence)."""

    def __init__(self, report: Report, variant: Variant) -> None:
        self.report, self.variant, self.metric = report, variant, report.metric

    def comparison(self) -> Finding | None:
        return finding(self.report.comparisons.get(self.variant.key))

    def at_sizes(self, axis: str, at: str) -> dict[str, Finding] | None:
        r = self.report
        if axis not in r.axes:
            return None
        i = r.axes.index(axis)
        if self.variant.key[:i] + self.variant.key[i + 1 :] == r.baseline[:i] + r.baseline[i + 1 :]:
            return {}  # differs from the baseline in the size alone: nothing but the size to compare
        sizes = sorted({run.value(axis) for run in r.runs}, key=size_order)
        found = {}
        for size in sizes:
            ours = r.variant((*self.variant.key[:i], size, *self.variant.key[i + 1 :]))
            base = r.variant((*r.baseline[:i], size, *r.baseline[i + 1 :]))
            if ours is None or base is None:
                found[size] = Finding("not run", "the variant or the baseline has no run at this size")
                continue
            left, right = at_equal_cost(ours, base, r.metric, at)
            c = compare(left, right, r.mode, test=r.test, bounds=difference_range(r.metric))
            found[size] = finding(c) or Finding("not run", "")
        return found

    def ladder(self) -> Finding | None:
        study = self.report.ladder
        if study is None:
            return None
        key = tuple(self.variant.key[self.report.axes.index(a)] for a in study.axes)
        row = study.rows.get(key)
        a = row.answer if row is not None else None
        if a is None:
            return None
        text = f"compute multiplier {a.multiplier:.3g} [{a.low:.3g}, {a.high:.3g}]"
        if math.isfinite(a.time):
            text += f", in wall time {a.time:.3g} [{a.time_low:.3g}, {a.time_high:.3g}]"
        return Finding(a.verdict, text)


    def target(self) -> Finding | None:
        study = self.report.target
        result = study.results.get(self.variant.key) if study is not None else None
        if result is None:
            return None
        return Finding(result.verdict, result.reason)


def report_gates(report: Report, raw: Any = None) -> dict[tuple[str, ...], list[GateResult]]:
    """Each variant but the baseline's gate answers under ``raw`` (``report.gates``; None: the runs' own)."""
    gates = gate_options(raw if raw is not None else launched_gates(report))
    if not gates:
        return {}
    return {v.key: evaluate(gates, ReportEvidence(report, v)) for v in report.variants if v.key != report.baseline}


def launched_gates(report: Report) -> Any:
    """``report.gates`` as the runs were launched with it (the first run that names some)."""
    for run in report.runs:
        named = ((run.record.config or {}).get("report") or {}).get("gates")
        if named:
            return named
    return None
