"""A sweep's runs grouped into variants: the data the report's tables and plots are drawn from.

A *run* is a folder with a ``summary.json``; a *variant* is the runs that share every swept value
but the seed; a :class:`Report` holds them sorted best first by the headline metric.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo.core.registry import AXES
from zoo.lab.records import SUMMARY, read_summary

#: Override keys that never define a variant: seeds are averaged over, the sweep file names the folder.
NOT_AXES = {"seed", "sweeps"}


@dataclass
class Run:
    """One run folder: its summary and its overrides as ``{key: value}``."""

    path: Path
    summary: dict[str, Any]
    overrides: dict[str, str]

    @property
    def status(self) -> str:
        return str(self.summary.get("status", "unknown"))

    @property
    def seed(self) -> Any:
        return (self.summary.get("config") or {}).get("seed", self.overrides.get("seed"))

    def value(self, key: str) -> str:
        """The run's setting for a swept key: its override, its group choice, or its config value."""
        if key in self.overrides:
            return self.overrides[key]
        choices = self.summary.get("choices") or {}
        if key in choices:
            return str(choices[key])
        node: Any = self.summary.get("config") or {}
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return "" if node is None else str(node)


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
            value = (run.summary.get("final") or {}).get(metric)
            if isinstance(value, (int, float)) and math.isfinite(value):
                out.append(float(value))
        return out

    def mean_std(self, metric: str) -> tuple[float | None, float | None]:
        values = self.values(metric)
        if not values:
            return None, None
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None

    def mean_of(self, key: str) -> float | None:
        values = [r.summary.get(key) for r in self.ok if isinstance(r.summary.get(key), (int, float))]
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
            total = (run.summary.get("parameters") or {}).get("total")
            if total is not None:
                return int(total)
        return None

    def errors(self) -> list[str]:
        return [
            f"{r.summary.get('status')}: {r.summary.get('error') or r.summary.get('reason') or 'no summary'}"
            for r in self.runs
            if r.status != "ok"
        ]


@dataclass
class Report:
    """A sweep's runs grouped into variants, sorted best first by ``metric``."""

    root: Path
    axes: list[str]
    variants: list[Variant]
    metric: str
    mode: str
    extra: list[str]  # other validation metrics shown beside the headline (e.g. other lengths)

    @property
    def runs(self) -> list[Run]:
        return [r for v in self.variants for r in v.runs]

    def label(self, variant: Variant) -> str:
        return " ".join(f"{a}={v}" for a, v in zip(self.axes, variant.key, strict=True)) or "default"


def parse_overrides(overrides: Sequence[str]) -> dict[str, str]:
    """``["+sweeps=quick", "norm=rmsnorm"]`` -> ``{"sweeps": "quick", "norm": "rmsnorm"}``."""
    out = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep:
            out[key.lstrip("+~")] = value
    return out


def collect(root: Path) -> list[Run]:
    """Every run under ``root`` that has a summary, in folder order."""
    runs = []
    for path in sorted(root.rglob(SUMMARY)):
        summary = read_summary(path.parent)
        if summary is not None:
            runs.append(Run(path.parent, summary, parse_overrides(summary.get("overrides") or [])))
    return runs


def build_report(root: Path) -> Report:
    runs = collect(root)
    if not runs:
        raise FileNotFoundError(f"no {SUMMARY} under {root}: is this a sweep or run folder?")
    first = [*AXES, "preset", "task"]  # block axes first, in the block's order; then the rest by name
    keys = sorted(
        {k for r in runs for k in r.overrides} - NOT_AXES,
        key=lambda k: (k not in first, first.index(k) if k in first else 0, k),
    )
    axes = [k for k in keys if len({r.value(k) for r in runs}) > 1]
    groups: dict[tuple[str, ...], Variant] = {}
    for run in runs:
        key = tuple(run.value(a) for a in axes)
        groups.setdefault(key, Variant(key)).runs.append(run)
    metrics = Counter((r.summary.get("metric") or {}).get("name") for r in runs if r.summary.get("metric"))
    metric = metrics.most_common(1)[0][0] if metrics else "val_loss"
    modes = [
        (r.summary.get("metric") or {}).get("mode")
        for r in runs
        if (r.summary.get("metric") or {}).get("name") == metric
    ]
    mode = modes[0] if modes else "min"
    family = metric.rsplit("_", 1)[0] if metric.endswith("x") and metric[-2:-1].isdigit() else metric
    finals = sorted({k for r in runs for k in (r.summary.get("final") or {})})
    extra = [k for k in finals if k != metric and (k == family or k.startswith(f"{family}_"))]

    def order(variant: Variant) -> tuple[int, float]:
        mean, _ = variant.mean_std(metric)
        if mean is None:
            return (1, 0.0)
        return (0, mean if mode == "min" else -mean)

    variants = sorted(groups.values(), key=order)
    return Report(root, axes, variants, metric, mode, extra)
