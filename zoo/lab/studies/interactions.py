"""Interactions between two swept axes: whether one axis's effect depends on the other's value.

For values ``a`` of axis A and ``b`` of axis B (each against its axis's baseline value ``a0``, ``b0``), the
interaction is the difference of differences ``(y[a, b] - y[a0, b]) - (y[a, b0] - y[a0, b0])``: A's effect
where B is ``b`` less A's effect where B is its baseline. It is formed within each seed (and each value of
any other swept axis), averaged per seed, and its interval is taken over the seeds under the report's test,
as for every other comparison. An interval that excludes 0 says that A's effect depends on B: the pooled
effect of either axis then averages over effects that differ, and the report says so beside it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zoo.lab.studies.runset import Run
from zoo.lab.studies.stats import Comparison, compare, difference_range

#: An interaction's verdict when its interval excludes 0, and when it does not.
INTERACTS, PARALLEL = "interaction", "within noise"


@dataclass(frozen=True)
class Interaction:
    """``(y[a, b] - y[a0, b]) - (y[a, b0] - y[a0, b0])`` over the seeds, for axes ``(A, B)``."""

    axes: tuple[str, str]
    values: tuple[str, str]  # (a, b)
    baselines: tuple[str, str]  # (a0, b0)
    comparison: Comparison

    @property
    def verdict(self) -> str:
        """``interaction`` when the interval excludes 0, else the comparison's (within noise, too few seeds)."""
        c = self.comparison
        if c.low is None or c.high is None:
            return c.verdict
        return INTERACTS if c.low > 0 or c.high < 0 else PARALLEL

    @property
    def name(self) -> str:
        return f"{self.axes[0]}×{self.axes[1]}"

    def text(self) -> str:
        """``(swiglu − gelu at optim=muon) − (swiglu − gelu at optim=adamw)``."""
        (a, b), (a0, b0), axis_b = self.values, self.baselines, self.axes[1]
        return f"({a} − {a0} at {axis_b}={b}) − ({a} − {a0} at {axis_b}={b0})"


def interaction_pairs(axes: Sequence[str], named: Sequence[Sequence[str]] | None) -> list[tuple[str, str]]:
    """The pairs of axes whose interactions a report states: those named (``report.interaction``), else
    the two axes of a two-axis sweep; none for one axis, or for more than two unless named."""
    if named:
        return [(str(a), str(b)) for a, b in named if a in axes and b in axes and a != b]
    return [(axes[0], axes[1])] if len(axes) == 2 else []


def cells(runs: Sequence[Run], axes: Sequence[str], pair: tuple[str, str], metric: str) -> dict[Any, dict]:
    """``{(seed, other axes' values): {(a, b): y}}`` over the runs that finished ok with a finite ``metric``."""
    others = [x for x in axes if x not in pair]
    out: dict[Any, dict] = {}
    for run in runs:
        value = run.record.final_value(metric) if run.status == "ok" else None
        if isinstance(value, (int, float)) and math.isfinite(value):
            key = (run.seed, tuple(run.value(x) for x in others))
            out.setdefault(key, {})[(run.value(pair[0]), run.value(pair[1]))] = float(value)
    return out


def axis_interactions(
    runs: Sequence[Run], axes: Sequence[str], baseline: tuple[str, ...], metric: str, test: str,
    named: Sequence[Sequence[str]] | None = None,
) -> list[Interaction]:  # fmt: skip
    """Every interaction of :func:`interaction_pairs`: each non-baseline value of one axis against each
    of the other's, in the order the values were swept."""
    found = []
    low, high = difference_range(metric) or (None, None)
    bounds = (2 * low, 2 * high) if low is not None and high is not None else None  # a difference of differences
    for pair in interaction_pairs(axes, named):
        a0, b0 = (baseline[axes.index(axis)] for axis in pair)
        table = cells(runs, axes, pair, metric)
        seen = [[], []]
        for run in runs:
            for i, axis in enumerate(pair):
                if run.value(axis) not in seen[i]:
                    seen[i].append(run.value(axis))
        for a in (v for v in seen[0] if v != a0):
            for b in (v for v in seen[1] if v != b0):
                at_b = {k: c[(a, b)] - c[(a0, b)] for k, c in table.items() if {(a, b), (a0, b)} <= c.keys()}
                at_b0 = {k: c[(a, b0)] - c[(a0, b0)] for k, c in table.items() if {(a, b0), (a0, b0)} <= c.keys()}
                c = compare(at_b, at_b0, "min", test=test, bounds=bounds, unit=lambda key: key[0])
                found.append(Interaction(pair, (a, b), (a0, b0), c))
    return found
