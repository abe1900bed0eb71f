"""The report's Markdown (:func:`markdown`): the variants table, then its sections (the test used, fairness of
the comparison, warnings, runs not read, effects per axis, learning-rate sensitivity, peaks)."""

from __future__ import annotations

from typing import Any

from zoo.lab.planning.options import TESTS, TUNE_DIR
from zoo.lab.reports.gates import gate_lines
from zoo.lab.reports.ladder import ladder_lines
from zoo.lab.reports.table import (
    PEAK_HEADERS,
    fmt,
    fmt_rate,
    header_fields,
    interval_text,
    lr_curve,
    lr_delta_text,
    lr_grid,
    markdown_columns,
    peak_delta_text,
    peak_of,
    peak_text,
    relative_to,
    sensitivity_text,
    tuned_edge,
    verdict_text,
)
from zoo.lab.reports.target import target_lines
from zoo.lab.studies.fixed import fixed_line
from zoo.lab.studies.interactions import INTERACTS
from zoo.lab.studies.peaks import PEAKS
from zoo.lab.studies.runset import Variant
from zoo.lab.studies.stats import (
    CONFIDENCE,
    EXACT_MAX,
    MIN_PAIRS,
    TOO_FEW,
    difference_range,
)
from zoo.lab.studies.variants import Report

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
    lines += tuning_lines(report)
    return [""] + lines if lines else []


def rates_text(rates: list[float]) -> str:
    return ", ".join(f"{r:g}" for r in rates)


def tuning_lines(report: Report) -> list[str]:
    """How ``tune.lr`` chose each variant's rate: the grid (each variant's, :func:`lr_grid`, as the learning-rate
    section and the lr column read it), the seeds and the width; and the variants whose rate ends its grid."""
    tuned = [v for v in report.variants if v.tune]
    if not tuned:
        return []
    first = tuned[0].tune or {}
    grids = {tuple(lr_grid(report, v)) for v in tuned}
    tried = (f"each tried at {rates_text(list(grids.pop()))}" if len(grids) == 1 else "each tried at its own grid ("
             + "; ".join(f"{report.label(v)}: {rates_text(lr_grid(report, v))}" for v in tuned) + ")")  # fmt: skip
    width = next((w for r in report.runs if (w := ((r.record.config or {}).get("tune") or {}).get("width"))), None)
    at = f" at block.d_model={width} for every width (tune.width)" if width else ""
    seeds = ", ".join(str(s) for s in first.get("seeds") or [])
    return [
        f"Learning rate tuned per variant (tune.lr): {tried} on seed {seeds}{at}, best validation "
        f"{first.get('metric')} kept (lr column); the tuning runs and their report are in {TUNE_DIR}/, the "
        "sensitivity in lr.png.",
        *edge_lines(report, [(v, tuned_edge(report, v)) for v in report.variants], "tuned"),
    ]


def optimizer_of(run: Any) -> str:
    """The run's ``optim`` name (``adamw``, the default, when its config names none)."""
    section = (run.record.config or {}).get("optim")
    return str(section.get("name", "adamw")) if isinstance(section, dict) else str(section or "adamw")


def warning_lines(report: Report) -> list[str]:
    """What the report can tell makes its comparison unfair: optimizers compared at one shared rate."""
    names = sorted({optimizer_of(r) for r in report.runs})
    if len(names) < 2 or any(r.record.tune and r.record.tune.get("lr") for r in report.runs):
        return []
    return [
        f"Warning: these runs differ in optim ({', '.join(names)}) without tune.lr: each optimizer at one shared "
        "train.lr, which means another step to each, is not a fair comparison; tune each one's rate with a grid "
        "wide enough for all (tune.lr=[...], docs/sweeps.md#fair-comparisons)."
    ]


def dropped_lines(report: Report) -> list[str]:
    """The run folders left out because their summary could not be read, each with the reason."""
    if not report.dropped:
        return []
    n = len(report.dropped)
    lines = ["", f"Not read: {n} run folder{'s' if n != 1 else ''}, left out of every table and interval below:"]
    return lines + [f"- {relative_to(d.path, report.root)}: {d.reason}" for d in report.dropped]


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
    lines += interaction_lines(report)
    lines += lr_lines(report)
    lines += ladder_lines(report)
    lines += gate_lines(report)  # report.gates (zoo/lab/reports/gates.py)
    lines += target_lines(report)  # report.target (zoo/lab/reports/target.py)
    lines += peak_lines(report)
    lines += fixed_line(report.runs)  # what every run shares beyond zoo's defaults (zoo/lab/studies/fixed.py)
    problems = [(report.label(v), e) for v in report.variants for e in v.errors()]
    if problems:
        lines += ["", "Not ok:"] + [f"- {label}: {error}" for label, error in problems]
    resumed = [(relative_to(r.path, report.root), r.record.resumed_from)
               for v in report.variants for r in v.runs if r.record.resumed_from]  # fmt: skip
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
    misleading = sorted({axis for i in report.interactions if i.verdict == INTERACTS for axis in i.axes})
    if misleading:
        lines += ["", f"Pooled effects of {' and '.join(misleading)} average over effects that differ: these axes "
                  "interact (below), so read each axis's effect at the other's values, not pooled."]  # fmt: skip
    return lines


def interaction_lines(report: Report) -> list[str]:
    """One line per interaction: the per-seed difference of differences, its interval and its verdict."""
    if not report.interactions:
        return []
    lines = ["", "Interactions: does one axis's effect depend on the other's value? The difference of differences, "
             "formed within each seed, its interval over the seeds:", ""]  # fmt: skip
    for i in report.interactions:
        c = i.comparison
        seeds = f"{c.units} seeds" if c.units else "no paired seeds"
        lines.append(f"- interaction {i.name}: {i.text()} = {interval_text(c)} ({c.test or 'no interval'}, {seeds}):"
                     f" {i.verdict}")  # fmt: skip
    return lines


def point_text(point: Any, seeds: int) -> str:
    """One rate's cell: ``3.1234 [3.1000, 3.1468]`` over the seeds that finished ok, and how many did when not all."""
    interval = point.interval()
    if interval is None:
        return f"none ok ({point.runs} run{'s' if point.runs != 1 else ''})"
    mean, low, high = interval
    ok = "" if len(point.values) == seeds else f" ({len(point.values)}/{seeds} ok)"
    return fmt(mean) + (f" [{low:.4f}, {high:.4f}]" if low != high else "") + ok


def edge_lines(report: Report, edges: list[tuple[Variant, str | None]], which: str) -> list[str]:
    """A line naming the variants whose ``which`` rate (tuned or best) is an end of its grid, or none."""
    at = {end: [report.label(v) for v, edge in edges if edge == end] for end in ("lowest", "highest")}
    said = [f"the {end} rate tried for {', '.join(labels)}" for end, labels in at.items() if labels]
    if not said:
        return []
    return [
        f"Edge of the grid: the {which} rate is {' and '.join(said)}, so the best may lie beyond the grid and the "
        "sensitivity there is one-sided (it sees one side of the curve only); widen tune.lr past that end to see "
        "both."
    ]


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
    lines += edge_lines(report, [(v, c.edge) for v in report.variants if (c := lr_curve(report, v))], "best")
    if any(c.clipped for c in study.curves.values()):
        lines.append("A sensitivity is never below 0: an interval reaching below it is cut at 0 and marked clipped.")
    for curve in study.curves.values():
        if curve.missing and curve.per_seed:
            seeds = ", ".join(str(s) for s in curve.missing)
            lines.append(f"{report.label(curve.key)}: seed {seeds} record no `initial`: its sensitivity is over the "
                         f"other seeds.")  # fmt: skip
    return lines


def outside_lines(report: Report) -> list[str]:
    """The tuning runs left out of the section: at rates outside the grid ``tune.lr`` searched for their variant."""
    study = report.lr
    if study is None or not study.outside:
        return []
    n, rates = len(study.outside), sorted({float(r.value("train.lr")) for r in study.outside})
    whose = "their variants" if n != 1 else "its variant"
    return [f"Left out: {n} tuning run{'s' if n != 1 else ''} at lr {rates_text(rates)}, outside the grid tune.lr "
            f"searched for {whose} (as the sweep's runs record it)."]  # fmt: skip


def lr_lines(report: Report) -> list[str]:
    """The learning-rate section (tuning runs under tune/): per variant the best rate, the metric at each
    rate over the tune seeds, the sensitivity and its difference from the baseline's."""
    study = report.lr
    if study is None or not study.curves:
        return []
    seeds = len(study.seeds)
    same = len({tuple(p.rate for p in c.points) for c in study.curves.values()}) == 1
    at = f"at {len(study.rates)} rates" if same else f"at the rates of its grid ({len(study.rates)} in all)"
    lines = [
        "",
        f"Learning rate: the tuning runs ({TUNE_DIR}/), each variant {at} on {seeds} "
        f"seed{'s' if seeds != 1 else ''} ({', '.join(str(s) for s in study.seeds)}); each rate's {study.metric} "
        f"is the mean [{CONFIDENCE:.0%} t interval] over the seeds that finished ok (lr.png).",
        *outside_lines(report),
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
        points = {p.rate: point_text(p, seeds) for p in curve.points}
        cells = [report.label(variant), fmt_rate(curve.best_lr, curve.edge),
                 *(points.get(rate, "") for rate in study.rates),
                 sensitivity_text(report, variant, ""), lr_delta_text(report, variant)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def peak_lines(report: Report) -> list[str]:
    """The probes' peaks over training per variant (train.probe_every), each against the baseline's."""
    if not report.peaks:
        return []
    keys = [key for key in PEAKS if any(key in peaks for peaks in report.peaks.values())]  # those recorded
    newer = [key for key in keys if key in ("attn_first", "resid_max")]
    lines = [
        "",
        "Probes (train.probe_every, probes.png): per run, the largest attention logit (over layers, heads, "
        "positions and every probe record of training) and the largest mean output log-partition (log Z)"
        + (
            ", and the largest over layers and records of the mean attention on the first position (attn first) "
            "and of the residual stream's largest absolute value after a block (abs residual)"
            if newer
            else ""
        )
        + f". Attention logit{' and residual' if 'resid_max' in keys else ''}: the geometric mean over seeds "
        f"[{CONFIDENCE:.0%} t interval of the mean log10], Δ: "
        "the variant's log10 minus the baseline's, paired by seed; log Z"
        + (" and attn first" if "attn_first" in keys else "")
        + ": the mean [t interval] and the paired difference. lower or higher: the interval excludes 0.",
        "",
        "| variant | "
        + " | ".join(
            f"{PEAK_HEADERS[key]} | Δ{' log10' if PEAKS[key] else ''} vs {report.baseline_label} [{CONFIDENCE:.0%} CI]"
            for key in keys
        )
        + " |",
        "|---|" + "---|---|" * len(keys),
    ]
    for variant in report.variants:
        if variant.key in report.peaks:
            cells = [report.label(variant)]
            for key in keys:
                cells += [peak_text(peak_of(report, variant, key)), peak_delta_text(report, variant, key)]
            lines.append("| " + " | ".join(cells) + " |")
    return lines
