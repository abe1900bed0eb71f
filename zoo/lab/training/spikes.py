"""Instability: the steps where a run's training loss or gradient norm spiked (summary.json's ``spikes``).

Judged on every step, not on the logged curve: the trainer hands each step's loss (averaged over ranks) and
gradient norm (before clipping) to :func:`update` at each log step, and the state it keeps is bounded (the
last :data:`WINDOW` values of each series), so it rides in checkpoints. On the log of each series (a loss
jump and a gradient-norm jump read as ratios), a step's value x is a spike when

    x > level + Z * noise   and   x > level + log(1 + REL[series])

where ``level`` is the median of the :data:`LEVEL` steps before it (where the curve is now, even while it
falls fast) and ``noise`` the step-to-step scatter of the :data:`WINDOW` steps before it: the mean absolute
difference between consecutive steps without its :data:`TRIM` largest, x sqrt(pi) / 2 (a Gaussian
scatter's standard deviation, slightly under; a trend or an earlier spike does not inflate it).

A step is judged once its series has :data:`MIN_HISTORY` earlier values; a run too short for that has no
score: ``count`` is None and ``reason`` says why (the report reads "not measurable", never 0). ``spikes``
records ``count``, ``steps``, ``by`` (the steps of each series) and ``judged`` (steps judged);
``diverged`` (the loss past ``train.diverge_factor`` x its first value) is judged apart.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

#: The earlier steps whose step-to-step scatter is the noise a step is judged against.
WINDOW = 30
#: The largest step-to-step differences left out of the noise (an earlier spike makes two).
TRIM = 2
#: The latest earlier steps whose median is the level a step is judged against.
LEVEL = 5
#: Fewer earlier values than this: not judged (the first steps of a run).
MIN_HISTORY = 10
#: How many noise units above the level a spike lies at least.
Z = 7.0
#: ... and by at least this fraction of the level: a loss 10% up, a gradient norm doubled (its step-to-step
#: scatter is wider; a healthy run's norm moves 1.3-1.9x for a step at the end of warmup, docs/runs.md).
REL = {"loss": 0.1, "grad_norm": 1.0}
#: The series judged, in the order :func:`update` takes their values.
SERIES = ("loss", "grad_norm")


def is_spike(value: float, history: Sequence[float], series: str = "loss") -> bool:
    """Whether ``value`` (a log of ``series``) spikes against ``history``, the finite logs of the steps before it
    (in order)."""
    if len(history) < MIN_HISTORY:
        return False
    recent = history[-WINDOW:]
    level = statistics.median(recent[-LEVEL:])
    steps = sorted(abs(b - a) for a, b in zip(recent, recent[1:], strict=False))[:-TRIM]
    noise = statistics.fmean(steps) * math.sqrt(math.pi) / 2
    return value > level + Z * noise and value > level + math.log1p(REL[series])


def log_of(value: float | None) -> float | None:
    """The log of a positive finite value; None for anything else (unknown, NaN, a loss at or below 0)."""
    ok = isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    return math.log(value) if ok else None  # type: ignore[arg-type]


def update(state: dict[str, Any], steps: Sequence[Sequence[float | None]]) -> None:
    """Judge ``steps`` (rows ``[step, loss, grad_norm]`` in step order, None where unknown) against the
    ``state`` (:func:`new_state`'s, updated in place) and add them to it."""
    for row in steps:
        step, judged = int(row[0]), False  # type: ignore[arg-type]
        for name, raw in zip(SERIES, row[1:], strict=True):
            value, history = log_of(raw), state["history"][name]
            if value is None:
                continue
            judged |= len(history) >= MIN_HISTORY
            if is_spike(value, history, name):
                state["by"][name].append(step)
                if step not in state["steps"]:
                    state["steps"].append(step)
            history.append(value)
            del history[:-WINDOW]
        state["judged"] += judged


def new_state() -> dict[str, Any]:
    """The detector's state before the first step: plain values, as a checkpoint's ``state.json`` holds it."""
    return {"history": {name: [] for name in SERIES}, "steps": [], "by": {name: [] for name in SERIES}, "judged": 0}


def result(state: dict[str, Any]) -> dict[str, Any]:
    """summary.json's ``spikes``: ``count``, ``steps`` and ``judged``; ``count`` None with a ``reason`` when no
    step could be judged."""
    if not state["judged"]:
        reason = f"not measurable: no step had {MIN_HISTORY} earlier steps with a finite loss or gradient norm"
        return {"count": None, "steps": [], "judged": 0, "reason": reason}
    by = {name: sorted(steps) for name, steps in state["by"].items()}
    return {"count": len(state["steps"]), "steps": sorted(state["steps"]), "by": by, "judged": state["judged"]}
