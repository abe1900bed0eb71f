"""Run folders as the report reads them: a :class:`Run` (a folder's record and overrides) and a
:class:`Variant` (the runs of one setting of the swept keys, one per seed). The studies over them
(zoo.lab.studies.variants, zoo.lab.studies.peaks, zoo.lab.studies.sensitivity) build on these."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo.lab.records.settings import UNSET, setting
from zoo.lab.records.summary import RunRecord

__all__ = ["UNSET", "UNUSED", "Run", "Variant", "grid_edge"]

#: A run's value for an axis that its parts do not use.
UNUSED = "unused"


def grid_edge(rate: float | None, grid: Any) -> str | None:
    """``"lowest"`` or ``"highest"`` when ``rate`` is that end of ``grid`` (two rates or more), else None: a best
    rate at the edge of its grid may not be the best at all (the curve was seen on one side of it only)."""
    rates = sorted({float(r) for r in grid})
    if rate is None or len(rates) < 2:
        return None
    return "lowest" if math.isclose(rate, rates[0]) else "highest" if math.isclose(rate, rates[-1]) else None


@dataclass
class Run:
    """One run folder: its record (summary.json) and its overrides as ``{key: value}``."""

    path: Path
    record: RunRecord
    overrides: dict[str, str]
    folded: dict[str, list[str]] = field(default_factory=dict)  # an axis -> the options of its part read with it

    @property
    def status(self) -> str:
        return self.record.status

    @property
    def seed(self) -> Any:
        """The run's replicate: its ``seed``, or ``"<seed> (data <data_seed>)"`` when its data order has a seed of
        its own (runs recorded before ``data_seed`` read as their seed)."""
        seed = (self.record.config or {}).get("seed", self.overrides.get("seed"))
        data = (self.record.config or {}).get("data_seed", self.overrides.get("data_seed"))
        return seed if data is None else f"{seed} (data {data})"

    def value(self, key: str) -> str:
        """The run's setting for a swept key: its override, its group choice, or its config value;
        ``unused`` for an axis its parts do not use (a norm-free placement's ``norm``); ``unset`` for one its
        config leaves null or does not have. An axis with options folded into it (:attr:`folded`) reads them
        beside its value where the run has them: ``hyper sinkhorn_iters=20``."""
        if key in (self.record.unused_axes or ()):
            return UNUSED
        value = setting(key, self.overrides, self.record.choices or {}, self.record.config or {})
        options = ((o, setting(o, self.overrides, {}, self.record.config or {})) for o in self.folded.get(key, ()))
        return " ".join([value, *(f"{o.rpartition('.')[2]}={v}" for o, v in options if v != UNSET)])


@dataclass
class Variant:
    """The runs of one setting of the swept keys (one per seed)."""

    key: tuple[str, ...]
    runs: list[Run] = field(default_factory=list)

    @property
    def ok(self) -> list[Run]:
        return [r for r in self.runs if r.status == "ok"]

    def values(self, metric: str) -> list[float]:
        out = []
        for run in self.ok:
            value = run.record.final_value(metric)
            if isinstance(value, (int, float)) and math.isfinite(value):
                out.append(float(value))
        return out

    def mean_std(self, metric: str) -> tuple[float | None, float | None]:
        values = self.values(metric)
        if not values:
            return None, None
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None

    def mean_of(self, key: str) -> float | None:
        values = [r.record.value(key) for r in self.ok if isinstance(r.record.value(key), (int, float))]
        return statistics.fmean(values) if values else None

    @property
    def status(self) -> str:
        counts = Counter(r.status for r in self.runs)
        if set(counts) == {"ok"}:
            return "ok"
        return ", ".join(f"{n} {status}" for status, n in counts.most_common())

    @property
    def parameters(self) -> int | None:
        for run in self.runs:
            total = (run.record.parameters or {}).get("total")
            if total is not None:
                return int(total)
        return None

    def by_seed(self, metric: str) -> dict[Any, float]:
        """``{seed: final metric}`` over the ok runs with a finite value (what pairs with another variant)."""
        out = {}
        for run in self.ok:
            value = run.record.final_value(metric)
            if isinstance(value, (int, float)) and math.isfinite(value):
                out[run.seed] = float(value)
        return out

    @property
    def tune(self) -> dict[str, Any] | None:
        """``tune.lr``'s choice for this variant (summary ``tune``: lr, searched...), None without tuning."""
        return next((r.record.tune for r in self.runs if r.record.tune and r.record.tune.get("lr")), None)

    @property
    def tuned_lr(self) -> float | None:
        """The learning rate ``tune.lr`` chose for this variant (None without tuning)."""
        return tune["lr"] if (tune := self.tune) else None

    @property
    def tuned_grid(self) -> list[float]:
        """The rates ``tune.lr`` searched for this variant (summary ``tune.searched``), empty without tuning."""
        return sorted({float(rate) for rate in (self.tune or {}).get("searched") or {}})

    @property
    def budget(self) -> dict[str, Any] | None:
        """What ``train.budget`` set (kind, value, steps), from the first run that has it."""
        return next((r.record.budget for r in self.runs if r.record.budget), None)

    def errors(self) -> list[str]:
        return [
            f"{r.status}: {r.record.error or r.record.reason or 'no summary'}" for r in self.runs if r.status != "ok"
        ]
