"""``zoo-report DIR``: one row per variant of a sweep, each against a baseline with a paired interval and a verdict.

Reads every ``summary.json`` under DIR (a run folder whose summary cannot be read is named, with the
reason, at the top of the report, and ``zoo-report`` then exits 1); writes ``report.md``, ``report.csv`` (one row per
variant), ``runs.csv`` (one row per run), ``effects.csv`` (several axes: each axis value against its
baseline value), ``curves.png``, ``final.png`` and ``interactions.png`` (several axes) beside them,
and prints the Markdown table. Runs at the end of every sweep (:class:`ReportCallback`). The
statistics are in :mod:`zoo.lab.stats`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import logging
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from zoo.core.errors import ConfigError
from zoo.lab.fixed import fixed_line
from zoo.lab.lock import report_lock
from zoo.lab.peaks import PEAKS, Peak
from zoo.lab.plots import plot_curves, plot_final, plot_interactions, plot_lr, plot_probes, plot_routing
from zoo.lab.records import read_metrics
from zoo.lab.report_files import OPTIONAL, PLOTS, TABLES
from zoo.lab.runset import Variant
from zoo.lab.sensitivity import LrCurve
from zoo.lab.stats import (
    CONFIDENCE,
    CORRECTIONS,
    EXACT_MAX,
    MIN_PAIRS,
    TESTS,
    TOO_FEW,
    Comparison,
    difference_range,
    pass_threshold,
)
from zoo.lab.tune import TUNE_DIR
from zoo.lab.variants import Report, build_report, report_options

log = logging.getLogger("zoo.lab.report")


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


#: How each ``report.test`` makes its interval, for the report's header.
TEST_TEXT = {
    "t": "Student t interval",
    "permutation": f"sign-flip permutation interval: every sign pattern of the per-seed differences up to "
    f"{EXACT_MAX} seeds, the test inverted; no 95% interval excludes anything under 6 seeds",
    "bootstrap": "percentile bootstrap interval",
}


def test_line(report: Report) -> str:
    """Which test ``report.test`` chose for the headline metric, and why."""
    bounded = difference_range(report.metric) is not None
    if report.test_option == "auto":
        why = "a bounded metric: a run's outcome is often all or nothing" if bounded else "an unbounded metric"
        how = f"report.test=auto: {report.test} for {report.metric}, {why}"
    else:
        how = f"report.test={report.test_option}"
    rng = difference_range(report.metric)
    clip = f"; intervals are clipped to the difference's feasible range [{rng[0]:+g}, {rng[1]:+g}]" if rng else ""
    return f"Test: {report.test} ({how}; one of {', '.join(TESTS)}){clip}."


def statistics_lines(report: Report) -> list[str]:
    """What the Δ column is and how its verdicts are reached (and the correction, if any)."""
    n = sum(1 for c in report.comparisons.values() if c.p_value is not None)
    lines = [
        f"Δ: each variant minus the baseline {report.baseline_label}, paired by seed (runs with the same seed "
        f"share initial weights and data order): mean difference [{CONFIDENCE:.0%} {TEST_TEXT[report.test]}]. "
        f"Verdict: better or worse when the interval excludes 0, within noise when it contains it; "
        f"unpaired: Welch's interval (seeds that do not pair); under {MIN_PAIRS} pairs: {TOO_FEW}.",
        test_line(report),
    ]
    if report.correction == "holm":
        lines.append(
            f"Correction: Holm, family-wise over the {n} comparison{'s' if n != 1 else ''} with an interval: "
            f"a verdict is better or "
            f"worse when the Holm-adjusted p < {1 - CONFIDENCE:.2f} (the intervals shown are per comparison)."
        )
    return lines


def flops_text(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


def fairness_lines(report: Report) -> list[str]:
    """The budget every run had and the learning-rate tuning, when the sweep used them."""
    lines = []
    budgets = {(b["kind"], b["value"]) for v in report.variants if (b := v.budget) is not None}
    if budgets:
        shown = ", ".join(f"{value:.3g} {kind}" for kind, value in sorted(budgets))
        lines.append(
            f"Budget: {shown} per run (train.budget): each variant's steps are set from its tokens per step and "
            f"FLOPs per token; the steps and FLOPs columns are what each spent (mean over seeds)."
        )
    tuned = [r.summary["tune"] for r in report.runs if (r.summary.get("tune") or {}).get("lr")]
    if tuned:
        rates = sorted({float(rate) for t in tuned for rate in t.get("searched", {})}) or (
            report.lr.rates if report.lr else []
        )
        seeds = tuned[0].get("seeds")
        lines.append(
            f"Learning rate tuned per variant (tune.lr): each tried at {', '.join(f'{r:g}' for r in rates)} on seed "
            f"{', '.join(str(s) for s in seeds or [])}, best validation {tuned[0].get('metric')} kept (lr column); "
            f"the tuning runs and their report are in {TUNE_DIR}/, the sensitivity in lr.png."
        )
    return [""] + lines if lines else []


def optimizer_of(run: Any) -> str:
    """The run's ``optim`` name (``adamw``, the default, when its config names none)."""
    section = (run.summary.get("config") or {}).get("optim")
    return str(section.get("name", "adamw")) if isinstance(section, dict) else str(section or "adamw")


def warning_lines(report: Report) -> list[str]:
    """What the report can tell makes its comparison unfair: optimizers compared at one shared rate."""
    names = sorted({optimizer_of(r) for r in report.runs})
    if len(names) < 2 or any((r.summary.get("tune") or {}).get("lr") for r in report.runs):
        return []
    return [
        f"Warning: these runs differ in optim ({', '.join(names)}) without tune.lr: each optimizer at one shared "
        "train.lr, which means another step to each, is not a fair comparison; tune each one's rate with a grid "
        "wide enough for all (tune.lr=[...], docs/sweeps.md#fair-comparisons)."
    ]


def active_params(variant: Any) -> int | None:
    """Parameters one token uses (``active_parameters`` in a run's summary; less than the total for a
    mixture of experts)."""
    return next((int(r.summary["active_parameters"]) for r in variant.runs if r.summary.get("active_parameters")), None)


def sparse(report: Report) -> bool:
    """Whether some variant uses fewer parameters per token than it holds (the report then shows both)."""
    return any(active_params(v) not in (None, v.parameters) for v in report.variants)


def dropped_lines(report: Report) -> list[str]:
    """The run folders left out because their summary could not be read, each with the reason."""
    if not report.dropped:
        return []
    n = len(report.dropped)
    lines = ["", f"Not read: {n} run folder{'s' if n != 1 else ''}, left out of every table and interval below:"]
    return lines + [f"- {relative_to(d.path, report.root)}: {d.reason}" for d in report.dropped]


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


def markdown(report: Report) -> str:
    """The variants table, best first, each against the baseline, with what was measured and the failures below."""
    m = report.metric
    columns = markdown_columns(report)
    head = [str(c.header).format(**header_fields(report, key)) for c, key in columns]
    better = "lower" if report.mode == "min" else "higher"
    not_read = f" ({len(report.dropped)} not read: below)" if report.dropped else ""
    lines = [
        f"{report.root}: {len(report.runs)} runs{not_read}, {len(report.variants)} variants, sorted by {m} "
        f"({better} is better)",
        *dropped_lines(report),
        "",
        *statistics_lines(report),
        *fairness_lines(report),
        *(["", *warned] if (warned := warning_lines(report)) else []),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for variant in report.variants:
        lines.append("| " + " | ".join(c.markdown(report, variant, key) for c, key in columns) + " |")
    base = report.variant(report.baseline)
    if base is None or not base.by_seed(m):
        lines += ["", f"The baseline {report.baseline_label} has no ok run: nothing to compare with."]
    lines += effects_lines(report)
    lines += lr_lines(report)
    lines += peak_lines(report)
    lines += fixed_line(report.runs)  # what every run shares beyond zoo's defaults (zoo/lab/fixed.py)
    problems = [(report.label(v), e) for v in report.variants for e in v.errors()]
    if problems:
        lines += ["", "Not ok:"] + [f"- {label}: {error}" for label, error in problems]
    resumed = [(relative_to(r.path, report.root), r.summary["resumed_from"])
               for v in report.variants for r in v.runs if r.summary.get("resumed_from")]  # fmt: skip
    if resumed:
        lines += ["", "Resumed from a checkpoint:"]
        lines += [f"- {path}: from step {', '.join(str(s) for s in steps)}" for path, steps in resumed]
    return "\n".join(lines) + "\n"


def effects_lines(report: Report) -> list[str]:
    """The pooled effects table (several axes): each axis value against its baseline value, blocked by seed."""
    if not report.effects:
        return []
    lines = [
        "",
        "Each axis's values against its baseline value, pooled over the other axes "
        "(pairs: the same seed and the same values of every other axis), blocked by seed: each seed's "
        "differences averaged over the other axes, the interval over those seed means (a seed's pairs share "
        "its initial weights and data order, so the independent units are the seeds, not the pairs):",
        "",
        f"| axis | value | vs | Δ {report.metric} [{CONFIDENCE:.0%} CI] | verdict | pairs | seeds |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in report.effects:
        c = e.comparison
        cells = [e.axis, e.value, e.baseline, interval_text(c), verdict_text(c), str(c.pairs), str(c.units)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def point_text(point: Any, seeds: int) -> str:
    """One rate's cell: ``3.1234 [3.1000, 3.1468]`` over the seeds that finished ok, and how many did when not all."""
    interval = point.interval()
    if interval is None:
        return f"none ok ({point.runs} run{'s' if point.runs != 1 else ''})"
    mean, low, high = interval
    ok = "" if len(point.values) == seeds else f" ({len(point.values)}/{seeds} ok)"
    return fmt(mean) + (f" [{low:.4f}, {high:.4f}]" if low != high else "") + ok


def sensitivity_lines(report: Report) -> list[str]:
    """What the sensitivity is, or why it is not computed."""
    study = report.lr
    assert study is not None
    m = study.metric
    if study.mode == "min":
        how = f"the mean over the rates of min({m} at the rate, {m} at initialization) less the least of them"
    else:
        how = f"the greatest over the rates of max({m} at the rate, {m} at initialization) less their mean"
    lines = [
        f"Sensitivity (Wortsman et al. 2023), per seed: {how} (a run that diverged, failed or is missing counts at "
        f"initialization; 0: the best at every rate, lower is better); its mean over seeds [{CONFIDENCE:.0%} t "
        f"interval], and Δ: each variant's minus the baseline's, paired by seed [{TEST_TEXT[report.test]}]. "
        f"Best lr: the best mean {m} over the seeds among the rates where every seed finished ok."
    ]
    if not study.computed:
        lines.append(
            f"Sensitivity not computed: no tuning run records its {m} at initialization (summary `initial`, "
            f"from the step-0 validation of newer runs); retrain the tuning runs to get it."
        )
    for curve in study.curves.values():
        if curve.missing and curve.per_seed:
            seeds = ", ".join(str(s) for s in curve.missing)
            lines.append(f"{report.label(curve.key)}: seed {seeds} record no `initial`: its sensitivity is over the "
                         f"other seeds.")  # fmt: skip
    return lines


def lr_lines(report: Report) -> list[str]:
    """The learning-rate section (tuning runs under tune/): per variant the best rate, the metric at each
    rate over the tune seeds, the sensitivity and its difference from the baseline's."""
    study = report.lr
    if study is None or not study.curves:
        return []
    seeds = len(study.seeds)
    lines = [
        "",
        f"Learning rate: the tuning runs ({TUNE_DIR}/), each variant at {len(study.rates)} rates on {seeds} "
        f"seed{'s' if seeds != 1 else ''} ({', '.join(str(s) for s in study.seeds)}); each rate's {study.metric} "
        f"is the mean [{CONFIDENCE:.0%} t interval] over the seeds that finished ok (lr.png).",
        *sensitivity_lines(report),
        "",
        "| variant | best lr | "
        + " | ".join(f"lr {r:g}" for r in study.rates)
        + f" | lr sensitivity [{CONFIDENCE:.0%} CI] | Δ vs {report.baseline_label} [{CONFIDENCE:.0%} CI] |",
        "|" + "---|" * (len(study.rates) + 4),
    ]
    for variant in report.variants:
        if (curve := lr_curve(report, variant)) is None:
            continue
        cells = [report.label(variant), fmt_rate(curve.best_lr), *(point_text(p, seeds) for p in curve.points),
                 sensitivity_text(report, variant, ""), lr_delta_text(report, variant)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


#: What a peak's verdict says (lower is not "better" for a logit in itself: it is what stays bounded).
PEAK_VERDICTS = {"better": "lower", "worse": "higher"}
#: report.csv's names of the probes' peaks (zoo/lab/peaks.py).
PEAK_NAMES = {"attn_logit_max": "attn_logit_peak", "log_z": "log_z_peak"}


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


def peak_lines(report: Report) -> list[str]:
    """The probes' peaks over training per variant (train.probe_every), each against the baseline's."""
    if not report.peaks:
        return []
    lines = [
        "",
        "Probes (train.probe_every, probes.png): per run, the largest attention logit (over layers, heads, "
        "positions and every probe record of training) and the largest mean output log-partition (log Z). "
        f"Attention logit: the geometric mean over seeds [{CONFIDENCE:.0%} t interval of the mean log10], Δ: "
        "the variant's log10 minus the baseline's, paired by seed; log Z: the mean [t interval] and the paired "
        "difference. lower or higher: the interval excludes 0.",
        "",
        f"| variant | max attn logit | Δ log10 vs {report.baseline_label} [{CONFIDENCE:.0%} CI] | max log Z | "
        f"Δ vs {report.baseline_label} [{CONFIDENCE:.0%} CI] |",
        "|---|---|---|---|---|",
    ]
    for variant in report.variants:
        if variant.key in report.peaks:
            cells = [report.label(variant)]
            for key in PEAKS:
                cells += [peak_text(peak_of(report, variant, key)), peak_delta_text(report, variant, key)]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def peak_columns(report: Report) -> list[str]:
    """report.csv's peak columns: each key's mean and interval, its difference from the baseline's (log10 for
    the attention logit) with its interval, and the verdict."""
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
    return next((r.summary.get("flops_per_token") for r in variant.runs if r.summary.get("flops_per_token")), None)


def tuned(report: Report) -> bool:
    return any(v.tuned_lr is not None for v in report.variants)


def budgeted(report: Report) -> bool:
    return any(v.budget is not None for v in report.variants)


def lr_curve(report: Report, variant: Variant) -> LrCurve | None:
    """The variant's tuning runs across the rate grid (zoo/lab/sensitivity.py), or None without tune.lr runs."""
    return report.lr.curves.get(variant.key) if report.lr is not None else None


def studied(report: Report) -> bool:
    return report.lr is not None and bool(report.lr.curves)


def sensitive(report: Report) -> bool:
    return report.lr is not None and report.lr.computed


def best_lr(report: Report, variant: Variant) -> float | None:
    return c.best_lr if (c := lr_curve(report, variant)) else None


def fmt_rate(rate: float | None) -> str:
    return "" if rate is None else f"{rate:.3g}"


def sensitivity(report: Report, variant: Variant, i: int) -> float | None:
    """The variant's learning-rate sensitivity: mean over seeds (``i`` 0), its interval's low (1) or high (2)."""
    values = c.sensitivity() if (c := lr_curve(report, variant)) else None
    return values[i] if values else None


def sensitivity_text(report: Report, variant: Variant, key: str) -> str:
    """``0.1234 [0.1000, 0.1468]`` (mean over seeds and its interval), the mean alone for one seed, or empty."""
    mean, low, high = (sensitivity(report, variant, i) for i in range(3))
    return fmt(mean) + (f" [{low:.4f}, {high:.4f}]" if low is not None and high is not None else "")


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


def spike_counts(variant: Variant) -> list[int]:
    """Each run's loss and gradient-norm spikes (summary ``spikes.count``), over the runs that recorded one."""
    counts = [(r.summary.get("spikes") or {}) for r in variant.runs if isinstance(r.summary.get("spikes"), dict)]
    return [int(c["count"]) for c in counts if isinstance(c.get("count"), int) and not isinstance(c["count"], bool)]


def spikes_mean(variant: Variant) -> float | None:
    counts = spike_counts(variant)
    return statistics.fmean(counts) if counts else None


def spiked_runs(variant: Variant) -> str:
    """``1/3``: the runs with a spike, of those that recorded the score (empty when none did)."""
    counts = spike_counts(variant)
    return f"{sum(c > 0 for c in counts)}/{len(counts)}" if counts else ""


def spikes_text(report: Report, variant: Variant, key: str) -> str:
    mean = spikes_mean(variant)
    return "" if mean is None else f"{mean:.2g}; {spiked_runs(variant)}"


def spiky(report: Report) -> bool:
    """Whether some run recorded its spike score (summary ``spikes``)."""
    return any(spike_counts(v) for v in report.variants)


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
    Column("{key}", None, lambda r, v, k: fmt(v.mean_std(k)[0]), each=lambda r: r.extra),
    Column(
        None,
        "{key}_mean",
        lambda r, v, k: v.mean_std(k)[0],
        each=lambda r: [
            k for k in sorted({k for run in r.runs for k in (run.summary.get("final") or {})}) if k != r.metric
        ],
    ),  # fmt: skip
    Column("lr (tuned)", None, lambda r, v, k: v.tuned_lr, formatted(lambda v: v.tuned_lr, ".3g"), when=tuned),
    Column("best lr", None, lambda r, v, k: best_lr(r, v), lambda r, v, k: fmt_rate(best_lr(r, v)), when=studied),
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
    Column(None, "steps", lambda r, v, k: v.mean_of("steps")),
    Column(None, "flops", lambda r, v, k: v.mean_of("flops")),
    Column(None, "budget", lambda r, v, k: budget_text(v)),
    Column(None, "pass", lambda r, v, k: pass_text(v, r, threshold_of(r))),
    Column(None, "pass_threshold", lambda r, v, k: threshold_of(r)),
    Column(None, "clipped", lambda r, v, k: clipped_cell(comparison(r, v))),
    Column(None, "best_lr", lambda r, v, k: best_lr(r, v)),
    Column(None, "lr_sensitivity", lambda r, v, k: sensitivity(r, v, 0)),
    Column(None, "lr_sensitivity_ci_low", lambda r, v, k: sensitivity(r, v, 1)),
    Column(None, "lr_sensitivity_ci_high", lambda r, v, k: sensitivity(r, v, 2)),
    Column(None, "lr_sensitivity_seeds", lambda r, v, k: len(c.per_seed) if (c := lr_curve(r, v)) else None),
    Column(None, "lr_sensitivity_{key}", lr_delta_cell, each=lambda r: LR_DELTA_COLUMNS),
    Column(None, "{key}", peak_cell, each=peak_columns),
    Column(None, "spikes", lambda r, v, k: spikes_mean(v)),
    Column(None, "spiked_runs", lambda r, v, k: spiked_runs(v)),
]


def write_csv(report: Report) -> None:
    """report.csv (one row per variant, :data:`COLUMNS`), effects.csv (several axes) and runs.csv."""
    m = report.metric
    threshold = pass_threshold(m, report.mode)
    columns = csv_columns(report)
    with open(report.root / "report.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([str(c.csv).format(**header_fields(report, key)) for c, key in columns])
        for v in report.variants:
            writer.writerow([c.value(report, v, key) for c, key in columns])
    if report.effects:
        with open(report.root / "effects.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["axis", "value", "metric", *STAT_COLUMNS, "units", "clipped"])
            for e in report.effects:
                c = e.comparison
                cells = stat_cells(c, f"{e.axis}={e.baseline}")
                writer.writerow([e.axis, e.value, m, *cells, c.units, clipped_cell(c)])
    with open(report.root / "runs.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["run_dir", *report.axes, "seed", "status", m, "parameters", "tokens_per_s", "wall_time_s", "error", "pass",
             "spikes"]
        )  # fmt: skip
        for v in report.variants:
            for r in v.runs:
                value = (r.summary.get("final") or {}).get(m)
                passed = "" if threshold is None or not isinstance(value, (int, float)) else value >= threshold
                writer.writerow(
                    [relative_to(r.path, report.root), *v.key, r.seed, r.status, value,
                     (r.summary.get("parameters") or {}).get("total"), r.summary.get("tokens_per_s"),
                     r.summary.get("wall_time_s"), r.summary.get("error") or r.summary.get("reason"), passed,
                     run_spikes(r.summary)]
                )  # fmt: skip
        for d in report.dropped:  # no summary to read the axes from: the folder and the reason
            writer.writerow([relative_to(d.path, report.root), *[""] * len(report.axes), "", "not read", "", "", "",
                             "", d.reason, "", ""])  # fmt: skip


def run_spikes(summary: dict[str, Any]) -> Any:
    """A run's spike count (summary ``spikes.count``), empty when it recorded none."""
    spikes = summary.get("spikes")
    return spikes.get("count") if isinstance(spikes, dict) else None


def clipped_cell(c: Comparison | None) -> str:
    return "" if c is None or c.low is None else str(c.clipped).lower()


def write_report(
    root: Path,
    plots: bool = True,
    baseline: dict[str, str] | None = None,
    correction: str | None = None,
    test: str | None = None,
) -> str:
    """Build and write the whole report for the runs under ``root``; returns the Markdown.

    ``baseline`` (``{axis: value}``), ``correction`` (none, holm) and ``test`` (auto, t, permutation,
    bootstrap) default to the runs' ``report`` section.
    """
    return write_built(build_report(Path(root), baseline=baseline, correction=correction, test=test), plots)


def write_built(report: Report, plots: bool = True) -> str:
    """Write the report's files (Markdown, CSVs and, with ``plots``, PNGs) into its root; returns the Markdown."""
    text = markdown(report)
    for line in warning_lines(report):
        print(f"zoo-report: {report.root}: {line}", file=sys.stderr)
    for stale in OPTIONAL:  # an earlier report's (of more axes, with tuning, probes or routing)
        (report.root / stale).unlink(missing_ok=True)
    (report.root / "report.md").write_text(text)
    write_csv(report)
    if plots:
        metrics = {r.path: read_metrics(r.path) for r in report.runs}
        plot_curves(report, report.root / "curves.png", metrics)
        plot_probes(report, report.root / "probes.png", metrics)  # only when some run has probes (train.probe_every)
        plot_final(report, report.root / "final.png")
        if len(report.axes) >= 2:
            plot_interactions(report, report.root / "interactions.png")
        if studied(report):  # tune.lr's runs under tune/
            plot_lr(report, report.root / "lr.png")
        plot_routing(report, report.root / "routing.png")  # only when some run routes tokens (mlp=moe)
    return text


def written(root: Path, plots: bool) -> list[Path]:
    """The report's files in ``root`` (those this report wrote)."""
    names = TABLES + PLOTS if plots else TABLES
    return [root / n for n in names if (root / n).exists()]


def report_main(argv: Sequence[str] | None = None) -> None:
    """``zoo-report DIR``: print a sweep's table; write report.md, report.csv, runs.csv and PNG plots."""
    parser = argparse.ArgumentParser(prog="zoo-report", description=report_main.__doc__)
    parser.add_argument("dir", type=Path, help="a sweep folder (e.g. runs/quick) or any folder of runs")
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    parser.add_argument(
        "--baseline",
        metavar="AXIS=VALUE[,AXIS=VALUE]",
        help="the variant every other is compared with (default: the runs' report.baseline, else the first "
        "value of each swept axis)",
    )
    parser.add_argument("--correction", choices=CORRECTIONS, help="family-wise correction of the verdicts")
    parser.add_argument(
        "--test", choices=TESTS, help="the interval over the per-seed differences (default: the runs' report.test, "
        "else auto: permutation for a bounded metric such as accuracy, t otherwise)"
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        baseline = report_options({"baseline": args.baseline})[0] if args.baseline else None
        with report_lock(args.dir) if args.dir.is_dir() else contextlib.nullcontext():  # not beside a sweep's own
            report = build_report(args.dir, baseline=baseline, correction=args.correction, test=args.test)
            print(write_built(report, plots=not args.no_plots), end="")
    except (FileNotFoundError, ConfigError) as error:
        parser.exit(1, f"zoo-report: {error}\n")
    print(f"\nwritten: {', '.join(str(p) for p in written(args.dir, not args.no_plots))}")
    if report.dropped:  # the report is written; the status says it is missing runs
        lines = "".join(f"\n  {relative_to(d.path, report.root)}: {d.reason}" for d in report.dropped)
        parser.exit(1, f"zoo-report: {len(report.dropped)} run folder(s) not read, left out of the report:{lines}\n")


class ReportCallback(Callback):
    """Hydra callback: when a sweep ends, write its report and print the table."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        root = Path(config.hydra.sweep.dir)
        try:
            section = OmegaConf.to_container(config.report, resolve=True) if "report" in config else None
            baseline, correction, test = report_options(section)
            with report_lock(root):  # a second sweep into this folder writes its report after this one
                report = build_report(root, baseline=baseline, correction=correction, test=test)
                text = write_built(report)
        except Exception as error:  # a report problem must not hide the runs' own results
            log.error("report for %s failed: %s: %s", root, type(error).__name__, error)
            return
        others = ", ".join(p.name for p in written(root, True) if p.name != "report.md")
        print("\n" + text + f"\nreport: {root / 'report.md'} (and {others})")
        for d in report.dropped:
            log.error("report for %s left out %s: %s", root, relative_to(d.path, root), d.reason)


if __name__ == "__main__":
    report_main()
