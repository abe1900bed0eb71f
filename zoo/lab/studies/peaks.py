"""The largest values a run's probes recorded over training (``train.probe_every``: ``probe`` records in
``metrics.jsonl``), per variant over seeds and against the baseline, paired by seed.

Per run, the peak of each key of :data:`PEAKS` is its largest value over every probe record (and, for a
per-layer list, over the layers; a mixer without logits records None and is skipped). Attention logits
that grow do so by orders of magnitude, so the logit peak is summarized on a log scale: its geometric
mean over seeds with the interval of the mean log10, and each variant's log10 peak minus the
baseline's; so is the residual stream's largest absolute value (``resid_max``). The output log-partition
is a logarithm already, and the attention share on the first position (``attn_first``) a fraction: their
means, intervals and differences as they are. Runs recorded before a key existed have no peak of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.lab.records.metrics import read_metrics
from zoo.lab.studies.runset import Variant
from zoo.lab.studies.stats import Comparison, compare, mean_interval

#: Probe keys with a peak: whether it is compared on a log10 scale (the residual stream's largest value, like the
#: logits, can grow by orders of magnitude; the attention share on the first position is a fraction).
PEAKS = {"attn_logit_max": True, "log_z": False, "attn_first": False, "resid_max": True}


def run_peaks(path: Path) -> dict[str, float]:
    """``{key: the largest value over the run's probe records}`` for each key of :data:`PEAKS` it recorded."""
    seen: dict[str, list[float]] = {}
    for record in read_metrics(path):
        if record.get("kind") != "probe":
            continue
        for key in PEAKS:
            value = record.get(key)
            items = value if isinstance(value, list) else [value]
            finite = [float(x) for x in items if isinstance(x, (int, float)) and math.isfinite(x)]
            seen.setdefault(key, []).extend(finite)
    return {key: max(values) for key, values in seen.items() if values}


@dataclass
class Peak:
    """One variant's peaks of one probe key: per seed, and compared with the baseline's (on the key's scale)."""

    key: str
    per_seed: dict[Any, float]
    comparison: Comparison | None = None

    @property
    def log(self) -> bool:
        return PEAKS[self.key]

    def scaled(self) -> dict[Any, float]:
        """Per seed, on the scale it is compared on (log10 for attention logits: a seed whose peak is not
        positive, which no softmax attention that learns records, is left out)."""
        if not self.log:
            return dict(self.per_seed)
        return {s: math.log10(v) for s, v in self.per_seed.items() if v > 0}

    def summary(self) -> tuple[float | None, float | None, float | None]:
        """Mean over seeds (geometric on a log scale) and its 95% interval (none for one seed)."""
        values = list(self.scaled().values())
        if not values:
            return None, None, None
        interval = mean_interval(values) or (values[0], None, None)
        back = (lambda x: 10**x) if self.log else (lambda x: x)
        return tuple(None if x is None else back(x) for x in interval)  # type: ignore[return-value]


def variant_peaks(
    variants: Sequence[Variant], baseline: tuple[str, ...], test: str
) -> dict[tuple[str, ...], dict[str, Peak]]:
    """Each variant's peaks (the ok runs' probe records), each compared with the ``baseline`` variant's, paired
    by seed under ``test`` (the report's)."""
    out: dict[tuple[str, ...], dict[str, Peak]] = {}
    for variant in variants:
        runs = {r.seed: run_peaks(r.path) for r in variant.ok}
        for key in PEAKS:
            per_seed = {s: p[key] for s, p in runs.items() if key in p}
            if per_seed:
                out.setdefault(variant.key, {})[key] = Peak(key, per_seed)
    base = out.get(baseline, {})
    for key_, peaks in out.items():
        for key, peak in peaks.items():
            if key_ != baseline and key in base:
                peak.comparison = compare(peak.scaled(), base[key].scaled(), "min", test=test)
    return out
