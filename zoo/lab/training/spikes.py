"""Instability: the steps where a run's training loss or gradient norm spiked (summary.json's ``spikes``).

The series are what the trainer logs every ``train.log_every`` steps: the mean training loss since the
last log step and the largest gradient norm (before clipping) among those steps. A logged value x at a
log step is a spike when, against the :data:`WINDOW` logged values before it (at least
:data:`MIN_HISTORY` of them),

    x > mean + Z * std   and   x > (1 + REL) * mean

(mean and population std of that window): far outside the recent noise, and by a margin that matters.
A smooth series, falling or rising at its usual pace, has none; a loss that jumps after one bad update
has one at the log step that saw the jump. ``spikes`` records the count and the steps (either series);
``diverged`` (the loss past ``train.diverge_factor`` x its first value) is judged apart, as before.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

#: Logged values each one is judged against (the log steps before it).
WINDOW = 20
#: Fewer earlier values than this: not judged (the first log steps of a run).
MIN_HISTORY = 5
#: How many standard deviations above the window's mean a spike lies at least.
Z = 6.0
#: ... and by at least this fraction of the mean (a near-constant window's tiny wobble is no spike).
REL = 0.1


def spike_indices(values: Sequence[float | None]) -> list[int]:
    """The indices of ``values`` that spike against the :data:`WINDOW` finite values before them."""
    out = []
    for i, x in enumerate(values):
        history = [v for v in values[max(0, i - WINDOW) : i] if v is not None and math.isfinite(v)]
        if x is None or not math.isfinite(x) or len(history) < MIN_HISTORY:
            continue
        mean, std = statistics.fmean(history), statistics.pstdev(history)
        if x > mean + Z * std and x > (1 + REL) * mean:
            out.append(i)
    return out


def spikes(curve: Sequence[Sequence[float | None]]) -> dict[str, object]:
    """``{"count", "steps"}`` of a run's curve: rows ``[step, loss, grad_norm_max]`` in step order (None
    where a value is unknown); a step counts once when both of its values spike."""
    steps = [int(row[0]) for row in curve]  # type: ignore[arg-type]
    found = {steps[i] for column in (1, 2) for i in spike_indices([row[column] for row in curve])}
    return {"count": len(found), "steps": sorted(found)}
