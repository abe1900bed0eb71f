"""The variants table as one list of :class:`Column` (:data:`COLUMNS`): each column a header in Markdown,
in CSV or both, and how its cell is read from a variant; the cell texts (intervals, verdicts, rates)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.lab.reports.gates import gates_cell
from zoo.lab.reports.target import TARGET_COLUMNS, target_cell
from zoo.lab.studies.peaks import PEAKS, Peak
from zoo.lab.studies.runset import Variant, grid_edge
from zoo.lab.studies.sensitivity import LrCurve
from zoo.lab.studies.stats import (
    CONFIDENCE,
    TOO_FEW,
    Comparison,
    pass_threshold,
)
from zoo.lab.studies.variants import Report


def fmt(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def interval_text(c: Comparison | None) -> str:
    """``-0.0510 [-0.0920, -0.0100]`` (``unpaired`` when Welch's, ``clipped`` when cut to the metric's range);
    without an interval, the mean alone."""
    if c is None or c.delta_mean is None:
        return ""
    if c.low is None or c.high is None:
        return f"{c.delta_mean:+.4f}"
    marks = ("" if c.paired else " unpaired") + (" clipped" if c.clipped else "")
    return f"{c.delta_mean:+.4f} [{c.low:+.4f}, {c.high:+.4f}]" + marks


def verdict_text(c: Comparison | None) -> str:
    if c is None:
        return ""
    if c.verdict == TOO_FEW:
        if c.paired and c.units != c.pairs:  # pooled over other axes: the seeds are what count
            return f"{TOO_FEW} ({c.units} seeds, {c.pairs} pairs)"
        return f"{TOO_FEW} ({c.pairs} pairs)" if c.paired or not (c.n_variant and c.n_baseline) else TOO_FEW
    return c.verdict


def flops_text(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


def active_params(variant: Any) -> int | None:
    """Parameters one token uses (``active_parameters`` in a run's summary; less than the total for a
    mixture of experts)."""
    return next((int(r.record.active_parameters) for r in variant.runs if r.record.active_parameters), None)


def sparse(report: Report) -> bool:
    """Whether some variant uses fewer parameters per token than it holds (the report then shows both)."""
    return any(active_params(v) not in (None, v.parameters) for v in report.variants)


def relative_to(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() or "."


def pass_text(variant: Any, report: Report, threshold: float | None) -> str:
    """``2/3`` (runs at or above the metric's success threshold, of the runs with a value), or empty."""
    values = variant.values(report.metric)
    if threshold is None or not values:
        return ""
    return f"{sum(v >= threshold for v in values)}/{len(values)}"


#: A cell: (report, variant, key) -> value; ``key`` is the column's key for a family of columns (``each``).
Cell = Callable[[Report, Variant, str], Any]


def plain(value: Any) -> str:
    return "" if value is None else str(value)


@dataclass(frozen=True)
class Column:
    """One column of the variants table: its Markdown header and its report.csv name (None: not in that
    file; ``{m}`` the metric, ``{key}`` the family's key, ``{threshold}``, ``{baseline}``, ``{ci}``), the
    cell's value (what report.csv writes) and its Markdown text (default: the value), and when Markdown
    shows it (report.csv always has every column: other tools read them). ``each``: one column per key."""

    header: str | None
    csv: str | None
    value: Cell
    text: Cell | None = None
    when: Callable[[Report], bool] = lambda report: True
    each: Callable[[Report], Sequence[str]] | None = None

    def expand(self, report: Report) -> list[tuple[Column, str]]:
        return [(self, key) for key in (self.each(report) if self.each is not None else [""])]

    def markdown(self, report: Report, variant: Variant, key: str) -> str:
        return (self.text or (lambda r, v, k: plain(self.value(r, v, k))))(report, variant, key)


def header_fields(report: Report, key: str) -> dict[str, Any]:
    return {"m": report.metric, "key": key, "threshold": pass_threshold(report.metric, report.mode),
            "baseline": report.baseline_label, "ci": CONFIDENCE}  # fmt: skip


def markdown_columns(report: Report) -> list[tuple[Column, str]]:
    return [pair for c in COLUMNS if c.header is not None and c.when(report) for pair in c.expand(report)]


def csv_columns(report: Report) -> list[tuple[Column, str]]:
    return [pair for c in COLUMNS if c.csv is not None for pair in c.expand(report)]


#: What a peak's verdict says (lower is not "better" for a logit in itself: it is what stays bounded).
PEAK_VERDICTS = {"better": "lower", "worse": "higher"}


#: report.csv's names of the probes' peaks (zoo/lab/studies/peaks.py).
PEAK_NAMES = {"attn_logit_max": "attn_logit_peak", "log_z": "log_z_peak", "attn_first": "attn_first_peak",
              "resid_max": "resid_max_peak"}  # fmt: skip
#: The report's headers of the probes' peaks.
PEAK_HEADERS = {"attn_logit_max": "max attn logit", "log_z": "max log Z", "attn_first": "max attn on first",
                "resid_max": "max abs residual"}  # fmt: skip


def peak_of(report: Report, variant: Variant, key: str) -> Peak | None:
    return report.peaks.get(variant.key, {}).get(key)


def peak_text(peak: Peak | None) -> str:
    """``1.2e+04 [3.1e+03, 4.6e+04]``: the mean over seeds (geometric for a logit) and its interval."""
    if peak is None:
        return ""
    mean, low, high = peak.summary()
    if mean is None:
        return ""
    return f"{mean:.4g}" + (f" [{low:.4g}, {high:.4g}]" if low is not None and high is not None else "")


def peak_delta_text(report: Report, variant: Variant, key: str) -> str:
    if (peak := peak_of(report, variant, key)) is None:
        return ""
    if is_baseline(report, variant):
        return "baseline"
    c = peak.comparison
    verdict = "" if c is None else PEAK_VERDICTS.get(c.verdict, verdict_text(c))
    return " ".join(x for x in (interval_text(c), verdict) if x)


def peak_columns(report: Report) -> list[str]:
    """report.csv's peak columns: each key's mean and interval, its difference from the baseline's (log10 for
    the attention logit and the residual peak) with its interval, and the verdict."""
    out = []
    for key, log in PEAKS.items():
        name, delta = PEAK_NAMES[key], "log10_delta" if log else "delta"
        out += [name, f"{name}_ci_low", f"{name}_ci_high", f"{name}_{delta}", f"{name}_{delta}_ci_low",
                f"{name}_{delta}_ci_high", f"{name}_verdict"]  # fmt: skip
    return out


def peak_cell(report: Report, variant: Variant, column: str) -> Any:
    key = next(k for k, name in PEAK_NAMES.items() if column.startswith(name + "_") or column == name)
    peak = peak_of(report, variant, key)
    if peak is None:
        return None
    rest = column.removeprefix(PEAK_NAMES[key]).lstrip("_")
    if rest in ("", "ci_low", "ci_high"):
        return peak.summary()[["", "ci_low", "ci_high"].index(rest)]
    if rest == "verdict":
        return "baseline" if is_baseline(report, variant) else (peak.comparison.verdict if peak.comparison else None)
    c = peak.comparison
    if c is None:
        return None
    return {"delta": c.delta_mean, "delta_ci_low": c.low, "delta_ci_high": c.high}[rest.removeprefix("log10_")]


#: report.csv's statistics columns (stable names: other tools read them).
STAT_COLUMNS = ["delta_mean", "delta_ci_low", "delta_ci_high", "verdict", "baseline", "pairs", "test", "p_value",
                "p_adjusted"]  # fmt: skip


def stat_cells(c: Comparison | None, baseline: str, is_baseline: bool = False) -> list[Any]:
    if is_baseline:
        return ["", "", "", "baseline", baseline, "", "", "", ""]
    if c is None:
        return [""] * len(STAT_COLUMNS)
    return [c.delta_mean, c.low, c.high, c.verdict, baseline, c.pairs, c.test, c.p_value, c.p_adjusted]


def comparison(report: Report, variant: Variant) -> Comparison | None:
    return report.comparisons.get(variant.key)


def is_baseline(report: Report, variant: Variant) -> bool:
    return variant.key == report.baseline


def mean_text(report: Report, variant: Variant, key: str) -> str:
    """``2.6000 ± 0.1414`` (the headline metric over seeds), or the mean alone, or empty."""
    mean, std = variant.mean_std(report.metric)
    return "" if mean is None else fmt(mean) + (f" ± {std:.4f}" if std is not None else "")


def formatted(value: Callable[[Variant], float | None], spec: str = ",") -> Cell:
    """A Markdown cell showing ``value(variant)`` in ``spec`` (default ``1,234``), empty when None."""
    return lambda r, v, k: "" if (x := value(v)) is None else format(x, spec)


def mean_column(header: str, key: str, spec: str) -> Column:
    """The mean over seeds of the summaries' ``key``: the number in report.csv, shown in ``spec``."""
    return Column(header, key, lambda r, v, k: v.mean_of(key), formatted(lambda v: v.mean_of(key), spec))


def stat_value(report: Report, variant: Variant, key: str) -> Any:
    cells = stat_cells(comparison(report, variant), report.baseline_label, is_baseline(report, variant))
    return cells[STAT_COLUMNS.index(key)]


def threshold_of(report: Report) -> float | None:
    return pass_threshold(report.metric, report.mode)


def budget_text(variant: Variant) -> str:
    return f"{variant.budget['value']:g} {variant.budget['kind']}" if variant.budget else ""


def flops_per_token(variant: Variant) -> Any:
    return next((r.record.flops_per_token for r in variant.runs if r.record.flops_per_token), None)


def tuned(report: Report) -> bool:
    return any(v.tuned_lr is not None for v in report.variants)


def budgeted(report: Report) -> bool:
    return any(v.budget is not None for v in report.variants)


def lr_curve(report: Report, variant: Variant) -> LrCurve | None:
    """The variant's tuning runs across the rate grid (zoo/lab/studies/sensitivity.py), or None without tune.lr runs."""
    return report.lr.curves.get(variant.key) if report.lr is not None else None


def studied(report: Report) -> bool:
    return report.lr is not None and bool(report.lr.curves)


def sensitive(report: Report) -> bool:
    return report.lr is not None and report.lr.computed


def best_lr(report: Report, variant: Variant) -> float | None:
    return c.best_lr if (c := lr_curve(report, variant)) else None


def fmt_rate(rate: float | None, edge: str | None = None) -> str:
    """``0.003``, or ``0.001 (edge: lowest)`` for a rate at an end of its grid (the best may lie beyond it)."""
    return "" if rate is None else f"{rate:.3g}" + (f" (edge: {edge})" if edge else "")


def best_edge(report: Report, variant: Variant) -> str | None:
    return c.edge if (c := lr_curve(report, variant)) else None


def lr_grid(report: Report, variant: Variant) -> list[float]:
    """The rates the variant's tuned and best rates were chosen among (its learning-rate curve's, read on
    :func:`zoo.lab.studies.sensitivity.rate_grid`; the rates ``tune.lr`` searched without tuning runs to read)."""
    return [p.rate for p in c.points] if (c := lr_curve(report, variant)) else variant.tuned_grid


def tuned_edge(report: Report, variant: Variant) -> str | None:
    """``"lowest"`` or ``"highest"`` when the variant's tuned rate is that end of its grid (:func:`lr_grid`)."""
    return grid_edge(variant.tuned_lr, lr_grid(report, variant))


def sensitivity(report: Report, variant: Variant, i: int) -> float | None:
    """The variant's learning-rate sensitivity: mean over seeds (``i`` 0), its interval's low (1) or high (2)."""
    values = c.sensitivity() if (c := lr_curve(report, variant)) else None
    return values[i] if values else None


def sensitivity_text(report: Report, variant: Variant, key: str) -> str:
    """``0.1234 [0.1000, 0.1468]`` (mean over seeds and its interval), the mean alone for one seed, or empty."""
    mean, low, high = (sensitivity(report, variant, i) for i in range(3))
    clipped = " clipped" if (c := lr_curve(report, variant)) and c.clipped else ""
    return fmt(mean) + (f" [{low:.4f}, {high:.4f}]{clipped}" if low is not None and high is not None else "")


def lr_delta_text(report: Report, variant: Variant) -> str:
    """The variant's sensitivity minus the baseline's with its paired interval and the verdict, or ``baseline``."""
    if is_baseline(report, variant):
        return "baseline" if sensitivity(report, variant, 0) is not None else ""
    c = lr_curve(report, variant)
    return " ".join(x for x in (interval_text(c.comparison), verdict_text(c.comparison)) if x) if c else ""


#: report.csv's columns of the sensitivity against the baseline's (``lr_sensitivity_delta`` ...).
LR_DELTA_COLUMNS = ["delta", "delta_ci_low", "delta_ci_high", "verdict"]


def lr_delta_cell(report: Report, variant: Variant, key: str) -> Any:
    if is_baseline(report, variant):
        return "baseline" if key == "verdict" and sensitivity(report, variant, 0) is not None else None
    c = comparison_of_lr(report, variant)
    if c is None:
        return None
    return {"delta": c.delta_mean, "delta_ci_low": c.low, "delta_ci_high": c.high, "verdict": c.verdict}[key]


def comparison_of_lr(report: Report, variant: Variant) -> Comparison | None:
    return c.comparison if (c := lr_curve(report, variant)) else None


#: A run's spike score when the run recorded one it could not compute: too short, or judged on the logged
#: curve only (runs from before the score judged every step).
NOT_MEASURABLE = "not measurable"


def run_spikes(record: Any) -> int | str | None:
    """A run's spike count (summary ``spikes``): the count, :data:`NOT_MEASURABLE`, or None (no score)."""
    score = record.spikes
    if score is None:
        return None
    count, judged = score.get("count"), score.get("judged")
    measured = isinstance(count, int) and not isinstance(count, bool) and isinstance(judged, int) and judged > 0
    return count if measured else NOT_MEASURABLE


def spike_counts(variant: Variant) -> list[int]:
    """Each run's loss and gradient-norm spikes, over the runs whose score could be measured."""
    return [c for r in variant.runs if isinstance(c := run_spikes(r.record), int)]


def unmeasured(variant: Variant) -> int:
    return sum(run_spikes(r.record) == NOT_MEASURABLE for r in variant.runs)


def spikes_mean(variant: Variant) -> float | None:
    counts = spike_counts(variant)
    return statistics.fmean(counts) if counts else None


def spiked_runs(variant: Variant) -> str:
    """``1/3``: the runs with a spike, of those that measured the score; ``not measurable`` when none could."""
    counts = spike_counts(variant)
    if not counts:
        return NOT_MEASURABLE if unmeasured(variant) else ""
    return f"{sum(c > 0 for c in counts)}/{len(counts)}"


def spikes_text(report: Report, variant: Variant, key: str) -> str:
    mean, missing = spikes_mean(variant), unmeasured(variant)
    if mean is None:
        return NOT_MEASURABLE if missing else ""
    return f"{mean:.2g}; {spiked_runs(variant)}" + (f" ({missing} {NOT_MEASURABLE})" if missing else "")


def spiky(report: Report) -> bool:
    """Whether some run recorded its spike score (summary ``spikes``), measurable or not."""
    return any(run_spikes(r.record) is not None for v in report.variants for r in v.runs)


#: report.csv's interaction columns: filled on the rows of a variant away from both axes' baselines.
INTERACTION_COLUMNS = ["name", "delta", "ci_low", "ci_high", "verdict"]


def interaction_cell(report: Report, variant: Variant, key: str) -> Any:
    """The interaction (zoo.lab.studies.interactions) whose two values ``variant`` holds: its pair's name,
    the difference of differences, its interval and verdict; empty for any other variant."""
    found = next((i for i in report.interactions
                  if tuple(variant.key[report.axes.index(a)] for a in i.axes) == i.values), None)  # fmt: skip
    if found is None:
        return None
    c = found.comparison
    return {"name": found.name, "delta": c.delta_mean, "ci_low": c.low, "ci_high": c.high,
            "verdict": found.verdict}[key]  # fmt: skip


#: The variants table, in order: each column of report.md and report.csv is one entry (a column in both
#: files, or in one: their orders differ where the Markdown groups the comparison before the timings).
COLUMNS: list[Column] = [
    Column("#", None, lambda r, v, k: next(i for i, x in enumerate(r.variants, 1) if x is v)),
    Column("{key}", "{key}", lambda r, v, k: v.key[r.axes.index(k)], each=lambda r: r.axes),
    Column("seeds", "runs", lambda r, v, k: len(v.runs)),
    Column(None, "ok", lambda r, v, k: len(v.ok)),
    Column("params", "parameters", lambda r, v, k: v.parameters, formatted(lambda v: v.parameters)),
    Column("active params", None, lambda r, v, k: active_params(v), formatted(active_params), when=sparse),
    Column(None, "metric", lambda r, v, k: r.metric),
    Column("{m} (mean ± std)", "{m}_mean", lambda r, v, k: v.mean_std(r.metric)[0], mean_text),
    Column(None, "{m}_std", lambda r, v, k: v.mean_std(r.metric)[1]),
    Column(
        "pass (≥ {threshold:g})",
        None,
        lambda r, v, k: pass_text(v, r, threshold_of(r)),
        when=lambda r: threshold_of(r) is not None,
    ),  # fmt: skip
    Column(
        "Δ vs {baseline} [{ci:.0%} CI]",
        None,
        lambda r, v, k: "baseline" if is_baseline(r, v) else interval_text(comparison(r, v)),
    ),  # fmt: skip
    Column("verdict", None, lambda r, v, k: "" if is_baseline(r, v) else verdict_text(comparison(r, v))),
    Column("gates", None, lambda r, v, k: gates_cell(r, v.key), when=lambda r: bool(r.gates)),
    Column("{key}", None, lambda r, v, k: fmt(v.mean_std(k)[0]), each=lambda r: r.extra),
    Column(
        None,
        "{key}_mean",
        lambda r, v, k: v.mean_std(k)[0],
        each=lambda r: [
            k for k in sorted({k for run in r.runs for k in (run.record.final or {})}) if k != r.metric
        ],
    ),  # fmt: skip
    Column("lr (tuned)", None, lambda r, v, k: v.tuned_lr, lambda r, v, k: fmt_rate(v.tuned_lr, tuned_edge(r, v)),
           when=tuned),  # fmt: skip
    Column("best lr", None, lambda r, v, k: best_lr(r, v), lambda r, v, k: fmt_rate(best_lr(r, v), best_edge(r, v)),
           when=studied),  # fmt: skip
    Column(
        "lr sensitivity [{ci:.0%} CI]", None, lambda r, v, k: sensitivity(r, v, 0), sensitivity_text, when=sensitive
    ),  # fmt: skip
    Column("Δ lr sensitivity vs {baseline}", None, lambda r, v, k: lr_delta_text(r, v), when=sensitive),
    Column("spikes (mean; runs)", None, lambda r, v, k: spikes_mean(v), spikes_text, when=spiky),
    Column("steps", None, lambda r, v, k: f"{v.mean_of('steps') or 0:,.0f}", when=budgeted),
    Column("FLOPs", None, lambda r, v, k: flops_text(v.mean_of("flops")), when=budgeted),
    mean_column("tokens/s", "tokens_per_s", ",.0f"),
    mean_column("wall s", "wall_time_s", ".1f"),
    Column(None, "flops_per_token", lambda r, v, k: flops_per_token(v)),
    Column("status", "status", lambda r, v, k: v.status),
    Column(None, "{key}", stat_value, each=lambda r: STAT_COLUMNS),
    Column(None, "lr", lambda r, v, k: v.tuned_lr),
    Column(None, "lr_edge", lambda r, v, k: tuned_edge(r, v)),
    Column(None, "steps", lambda r, v, k: v.mean_of("steps")),
    Column(None, "flops", lambda r, v, k: v.mean_of("flops")),
    Column(None, "budget", lambda r, v, k: budget_text(v)),
    Column(None, "pass", lambda r, v, k: pass_text(v, r, threshold_of(r))),
    Column(None, "pass_threshold", lambda r, v, k: threshold_of(r)),
    Column(None, "clipped", lambda r, v, k: clipped_cell(comparison(r, v))),
    Column(None, "best_lr", lambda r, v, k: best_lr(r, v)),
    Column(None, "best_lr_edge", lambda r, v, k: best_edge(r, v)),
    Column(None, "lr_sensitivity", lambda r, v, k: sensitivity(r, v, 0)),
    Column(None, "lr_sensitivity_ci_low", lambda r, v, k: sensitivity(r, v, 1)),
    Column(None, "lr_sensitivity_ci_high", lambda r, v, k: sensitivity(r, v, 2)),
    Column(None, "lr_sensitivity_clipped", lambda r, v, k: str(c.clipped).lower() if (c := lr_curve(r, v)) and
           sensitivity(r, v, 1) is not None else None),  # fmt: skip
    Column(None, "lr_sensitivity_seeds", lambda r, v, k: len(c.per_seed) if (c := lr_curve(r, v)) else None),
    Column(None, "lr_sensitivity_{key}", lr_delta_cell, each=lambda r: LR_DELTA_COLUMNS),
    Column(None, "{key}", peak_cell, each=peak_columns),
    Column(None, "spikes", lambda r, v, k: spikes_mean(v)),
    Column(None, "spiked_runs", lambda r, v, k: spiked_runs(v)),
    Column(None, "interaction_{key}", lambda r, v, k: interaction_cell(r, v, k), each=lambda r: INTERACTION_COLUMNS),
    Column(None, "{key}", target_cell, each=lambda r: TARGET_COLUMNS if r.target is not None else []),
]


def clipped_cell(c: Comparison | None) -> str:
    return "" if c is None or c.low is None else str(c.clipped).lower()
