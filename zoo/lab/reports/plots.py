"""The report's PNGs, drawn with matplotlib's object API on the Agg canvas (no display, no pyplot state)."""

from __future__ import annotations

import math
import statistics
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

from zoo.lab.reports.table import interval_text
from zoo.lab.studies.runset import Variant
from zoo.lab.studies.stats import CONFIDENCE, mean_interval
from zoo.lab.studies.variants import Report

#: Curves drawn at most: past this, the best ones (the rest stay in the table and final.png).
MAX_CURVES = 10


def palette(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def mean_curve(runs_metrics: list[list[dict[str, Any]]], kind: str, key: str) -> tuple[list[float], list[float]]:
    """(tokens, mean value) over the runs' records of ``kind`` that carry ``key``."""
    by_tokens: dict[float, list[float]] = defaultdict(list)
    for records in runs_metrics:
        for r in records:
            if r.get("kind") == kind and isinstance(r.get(key), (int, float)):
                by_tokens[r["tokens"]].append(r[key])
    xs = sorted(by_tokens)
    return xs, [statistics.fmean(by_tokens[x]) for x in xs]


def plot_curves(report: Report, path: Path, metrics: dict[Path, list[dict[str, Any]]]) -> None:
    """Training loss and validation loss against training tokens, one line per variant (mean over seeds)."""
    shown = report.variants[:MAX_CURVES]
    colors = palette(len(shown))
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    train_ax, val_ax = fig.subplots(1, 2)
    for variant, color in zip(shown, colors, strict=True):
        records = [metrics.get(r.path, []) for r in variant.runs if r.status != "failed"]
        label = short_label(report, variant)
        xs, ys = mean_curve(records, "train", "loss")
        train_ax.plot(xs, ys, color=color, lw=1.4, label=label)
        xs, ys = mean_curve(records, "val", "val_loss")
        val_ax.plot(xs, ys, color=color, lw=1.6, marker="o", ms=3.5, label=label)
    for ax, title in [(train_ax, "training loss"), (val_ax, "validation loss")]:
        ax.set_title(title)
        ax.set_xlabel("training tokens")
        ax.set_ylabel("cross-entropy (nats / token)")
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 20k, 1.5M
    clip_outliers(train_ax)
    more = f" (best {len(shown)} of {len(report.variants)})" if len(report.variants) > len(shown) else ""
    fig.suptitle(f"{report.root.name}: loss curves per variant, mean over seeds{more}")
    handles, labels = val_ax.get_legend_handles_labels()
    if handles:  # below the axes: beside them it rose into the title
        columns = min(len(handles), max(1, 150 // max(len(label) for label in labels)))
        fig.legend(handles, labels, loc="outside lower center", fontsize="small", ncols=columns, title="variant")
    fig.savefig(path, dpi=110)


def clip_outliers(ax: Any) -> None:
    """Start the y axis below the early-training spike so the end of training stays readable."""
    ys = [y for line in ax.get_lines() for y in line.get_ydata()]
    if len(ys) > 4:
        ys = sorted(ys)
        low, high = ys[0], ys[int(0.9 * (len(ys) - 1))]
        pad = 0.1 * (high - low) or 0.1
        ax.set_ylim(low - pad, high + 3 * pad)


#: probes.png's panels: (title, y label, the value of a probe record; zoo.lab.training.probes).
PROBE_PANELS = (
    ("max attention logit (max over layers)", "pre-softmax q·k scale", lambda r: top(r.get("attn_logit_max"))),
    ("output log-partition (mean log Z, what z-loss penalizes)", "log Z (nats)", lambda r: r.get("log_z")),
)


def top(values: Any) -> float | None:
    """The largest number of a per-layer list (None entries: layers without logits), or None."""
    known = [v for v in values or [] if isinstance(v, (int, float))]
    return max(known) if known else None


def probe_curve(runs_metrics: list[list[dict[str, Any]]], value: Any) -> tuple[list[int], list[float]]:
    """(steps, mean over the runs) of ``value(record)`` over their ``probe`` records."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for records in runs_metrics:
        for r in records:
            got = value(r) if r.get("kind") == "probe" else None
            if isinstance(got, (int, float)) and math.isfinite(got):
                by_step[r["step"]].append(got)
    xs = sorted(by_step)
    return xs, [statistics.fmean(by_step[x]) for x in xs]


def plot_probes(report: Report, path: Path, metrics: dict[Path, list[dict[str, Any]]]) -> bool:
    """The probes (train.probe_every) against steps: the largest attention logit over layers and the output
    logits' mean log-partition, one line per variant (mean over seeds). False (nothing written): no probes."""
    shown = report.variants[:MAX_CURVES]
    curves = []
    for variant in shown:
        records = [metrics.get(r.path, []) for r in variant.runs if r.status != "failed"]
        curves.append([probe_curve(records, value) for _, _, value in PROBE_PANELS])
    if not any(xs for panels in curves for xs, _ in panels):
        return False
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    axes = fig.subplots(1, len(PROBE_PANELS))
    for variant, panels, color in zip(shown, curves, palette(len(shown)), strict=True):
        for ax, (xs, ys) in zip(axes, panels, strict=True):
            ax.plot(xs, ys, color=color, lw=1.6, marker="o", ms=3, label=short_label(report, variant))
    for ax, (title, label, _) in zip(axes, PROBE_PANELS, strict=True):
        ax.set_title(title, fontsize="medium")
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
        ys = [y for line in ax.get_lines() for y in line.get_ydata()]
        if ys and min(ys) > 0 and max(ys) / min(ys) > 30:  # logits growing by orders of magnitude
            ax.set_yscale("log")
    more = f" (best {len(shown)} of {len(report.variants)})" if len(report.variants) > len(shown) else ""
    fig.suptitle(f"{report.root.name}: probes on the first validation batch, mean over seeds{more}")
    handles, labels = axes[0].get_legend_handles_labels()
    columns = min(len(handles), max(1, 150 // max(len(label) for label in labels)))
    fig.legend(handles, labels, loc="outside lower center", fontsize="small", ncols=columns, title="variant")
    fig.savefig(path, dpi=110)
    return True


#: Verdict colours of the final plot's difference panel.
VERDICT_COLORS = {"better": "tab:green", "worse": "tab:red", "within noise": "tab:gray", "too few seeds": "silver"}


def plot_final(report: Report, path: Path) -> Figure:
    """Left: the headline metric per variant (mean, 95% interval over seeds, each seed), best at the top,
    the baseline's mean as a line. Right: each variant minus the baseline with its paired interval and verdict."""
    m = report.metric
    n = len(report.variants)
    fig = Figure(figsize=(13, 1.9 + 0.36 * n), layout="constrained")
    ax, delta_ax = fig.subplots(1, 2, sharey=True, width_ratios=[1.1, 1])
    labels, ys, known, deltas = [], [], [], [0.0]
    base = report.variant(report.baseline)
    base_mean = base.mean_std(m)[0] if base is not None else None
    for i, variant in enumerate(report.variants):
        y = n - 1 - i
        labels.append(short_label(report, variant) + ("  (baseline)" if variant.key == report.baseline else ""))
        ys.append(y)
        values = draw_values(ax, variant, m, y)
        if values is None:
            continue
        known += values
        deltas += draw_difference(delta_ax, report, variant, y)
    if base_mean is not None:
        ax.axvline(base_mean, color="black", ls="--", lw=1, alpha=0.7, label=f"baseline {report.baseline_label}")
        fig.legend(loc="outside lower center", fontsize="small")  # below the axes: never over a variant's row
    delta_ax.axvline(0, color="black", ls="--", lw=1, alpha=0.7)
    ax.set_yticks(ys, labels, fontsize="small")
    ax.set_ylim(-0.7, n - 0.3)
    better = "lower" if report.mode == "min" else "higher"
    ax.set_xlabel(f"{m} ({better} is better)\ndot: mean, bar: {CONFIDENCE:.0%} interval over seeds, x: each seed")
    ax.set_title(f"final {m} per variant, best at the top")
    delta_ax.set_xlabel(f"Δ {m}: variant - baseline\npaired by seed ({CONFIDENCE:.0%} interval)")
    how = ", Holm-corrected verdicts" if report.correction == "holm" else ""
    delta_ax.set_title(textwrap.fill(f"difference from {report.baseline_label}{how}", 44))  # long labels wrap
    for axis in (ax, delta_ax):
        axis.grid(axis="x", alpha=0.3)
    if known:
        low, high = min(known), max(known)
        pad = 0.08 * ((high - low) or abs(high) * 0.05 or 0.1)
        ax.set_xlim(low - pad, high + pad)
    low, high = min(deltas), max(deltas)
    pad = 0.12 * ((high - low) or 0.01)
    delta_ax.set_xlim(low - pad, high + pad)
    fig.suptitle(f"{report.root.name}: {m}")
    fig.savefig(path, dpi=110)
    return fig


def draw_values(ax: Any, variant: Variant, m: str, y: float) -> list[float] | None:
    """One variant's row of the final plot's left panel: its mean, its interval over seeds and each seed
    (or its status, when no run has a value); the values drawn, for the axis limits (None: none)."""
    mean, _ = variant.mean_std(m)
    if mean is None:
        ax.annotate(variant.status, (0.01, y), xycoords=("axes fraction", "data"), va="center", color="firebrick")
        return None
    seeds = variant.values(m)
    interval = mean_interval(seeds)
    low, high = (interval[1], interval[2]) if interval else (mean, mean)
    ax.errorbar(mean, y, xerr=[[mean - low], [high - mean]], fmt="o", color="tab:blue", ecolor="tab:gray",
                capsize=4, ms=6, zorder=3)  # fmt: skip
    ax.annotate(f"{mean:.4f}", (mean, y), xytext=(0, 7), textcoords="offset points", fontsize="small", ha="center")
    ax.plot(seeds, [y] * len(seeds), "x", color="tab:blue", alpha=0.45, ms=5)
    return [*seeds, low, high]


def draw_difference(ax: Any, report: Report, variant: Variant, y: float) -> list[float]:
    """One variant's row of the right panel: the baseline as a point, any other variant's difference from
    it with its paired interval, coloured by its verdict; the interval's ends drawn, for the axis limits."""
    c = report.comparisons.get(variant.key)
    if variant.key == report.baseline:
        ax.plot(0, y, "D", color="black", ms=5)
        return []
    if c is None or c.delta_mean is None:
        return []
    color = VERDICT_COLORS.get(c.verdict, "tab:gray")
    bounded = c.low is not None and c.high is not None and math.isfinite(c.low) and math.isfinite(c.high)
    lo, hi = (c.low, c.high) if bounded else (c.delta_mean, c.delta_mean)  # an unbounded one: the mean
    ax.errorbar(c.delta_mean, y, xerr=[[c.delta_mean - lo], [hi - c.delta_mean]], fmt="o", color=color,
                ecolor=color, capsize=4, ms=6, zorder=3)  # fmt: skip
    tag = c.verdict + ("" if c.paired or c.low is None else ", unpaired")
    ax.annotate(tag, (c.delta_mean, y), xytext=(0, 7), textcoords="offset points", fontsize="small", ha="center",
                color=color)  # fmt: skip
    return [lo, hi]


def numeric(values: list[str]) -> bool:
    try:
        [float(v) for v in values]
    except ValueError:
        return False
    return True


def axis_values(report: Report, axis: str) -> list[str]:
    """An axis's values, in numeric order when they are numbers, else in the order first met (baseline first)."""
    i = report.axes.index(axis)
    seen = [report.baseline[i]] if report.baseline else []
    for variant in report.variants:
        if variant.key[i] not in seen:
            seen.append(variant.key[i])
    return sorted(seen, key=float) if numeric(seen) else seen


#: Interaction panels drawn at most (one per combination of the axes not on the x axis or the lines).
MAX_PANELS = 12


def interaction_layout(report: Report) -> list[tuple[str, str, dict[str, str]]]:
    """(x axis, line axis, fixed values of the other axes) per panel: two axes give both arrangements;
    more put the numeric axis with most values on x, the next axis as lines, one panel per rest."""
    axes = report.axes
    if len(axes) == 2:
        return [(axes[0], axes[1], {}), (axes[1], axes[0], {})]
    x = max(axes, key=lambda a: (numeric(axis_values(report, a)), len(axis_values(report, a)), -axes.index(a)))
    line = next(a for a in axes if a != x)
    rest = [a for a in axes if a not in (x, line)]
    combos: list[dict[str, str]] = [{}]
    for axis in rest:
        combos = [{**c, axis: v} for c in combos for v in axis_values(report, axis)]
    return [(x, line, c) for c in combos[:MAX_PANELS]]


def interaction_note(report: Report, axes: set[str]) -> str:
    """The interactions of a panel's two axes, for its title: the difference of differences, its interval
    and verdict (zoo.lab.studies.interactions); empty when the report states none for them."""
    return "".join(f"\ninteraction {i.values[0]}×{i.values[1]}: {interval_text(i.comparison)} {i.verdict}"
                   for i in report.interactions if set(i.axes) == axes)  # fmt: skip


def plot_interactions(report: Report, path: Path) -> Figure:
    """For sweeps of several axes: the headline metric against one axis, one line per value of another,
    the 95% interval over seeds as a band; one panel per value of the remaining axes."""
    m = report.metric
    layout = interaction_layout(report)
    columns = min(len(layout), 3)
    rows = -(-len(layout) // columns)
    fig = Figure(figsize=(5.2 * columns, 3.9 * rows + 0.6), layout="constrained")
    grid = fig.subplots(rows, columns, squeeze=False)
    by_key = {v.key: v for v in report.variants}
    seeds = max((len(v.values(m)) for v in report.variants), default=0)
    for n, (x_axis, line_axis, fixed) in enumerate(layout):
        ax = grid[n // columns][n % columns]
        xs = axis_values(report, x_axis)
        positions = [float(v) for v in xs] if numeric(xs) else list(range(len(xs)))
        lines = axis_values(report, line_axis)
        for value, color in zip(lines, palette(len(lines)), strict=True):
            points = []
            for x, pos in zip(xs, positions, strict=True):
                setting = {**fixed, x_axis: x, line_axis: value}
                variant = by_key.get(tuple(setting[a] for a in report.axes))
                values = variant.values(m) if variant is not None else []
                if values:
                    interval = mean_interval(values)
                    mean = statistics.fmean(values)
                    points.append((pos, mean, *(interval[1:] if interval else (mean, mean))))
            if not points:
                continue
            px, py, lo, hi = zip(*points, strict=True)
            ax.plot(px, py, "o-", color=color, lw=1.6, ms=4, label=f"{line_axis}={value}")
            ax.fill_between(px, lo, hi, color=color, alpha=0.18, lw=0)
        if not numeric(xs):
            ax.set_xticks(positions, xs, fontsize="small")
        ax.set_xlabel(x_axis)
        ax.set_ylabel(m)
        ax.grid(alpha=0.3)
        title = ", ".join(f"{k}={v}" for k, v in fixed.items()) or f"{m} vs {x_axis}"
        ax.set_title(title + interaction_note(report, {x_axis, line_axis}), fontsize="medium")
        ax.legend(fontsize="small")
    for n in range(len(layout), rows * columns):
        grid[n // columns][n % columns].set_visible(False)
    better = "lower" if report.mode == "min" else "higher"
    band = f"band: {CONFIDENCE:.0%} interval over {seeds} seeds" if seeds > 1 else "one seed per point: no interval"
    fig.suptitle(f"{report.root.name}: {m} ({better} is better), mean over seeds; {band}")
    fig.savefig(path, dpi=110)
    return fig


def plot_lr(report: Report, path: Path) -> Figure:
    """The tuning runs' validation metric against the learning rate (log scale), one line per variant of the
    sweep: the mean over the tune seeds that finished ok with its 95% interval as a band, the best rate
    circled, and an x where some run diverged or failed (at the top of the axes where none finished)."""
    study = report.lr
    assert study is not None
    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.subplots()
    curves = list(study.curves.values())
    for curve, color in zip(curves, palette(len(curves)), strict=True):
        label = report.label(curve.key)
        if (s := curve.sensitivity()) is not None:
            label += f" (sensitivity {s[0]:.3f})"
        points = [(p.rate, *interval) for p in curve.points if (interval := p.interval()) is not None]
        if points:
            xs, ys, lo, hi = zip(*points, strict=True)
            ax.plot(xs, ys, "o-", color=color, lw=1.6, ms=4, label=label)
            ax.fill_between(xs, lo, hi, color=color, alpha=0.18, lw=0)
        for rate, mean, *_ in points:
            if rate == curve.best_lr:
                ax.plot(rate, mean, "o", ms=12, mfc="none", mec=color, mew=2)
                if curve.edge:  # the best rate is an end of the grid: the best may lie beyond it
                    ax.annotate(f"edge ({curve.edge})", (rate, mean), xytext=(0, -16), textcoords="offset points",
                                ha="left" if curve.edge == "lowest" else "right", color=color, fontsize="small")
        for p in curve.points:
            if len(p.values) < len(study.seeds):
                if (interval := p.interval()) is not None:
                    ax.plot(p.rate, interval[0], "x", color=color, ms=10, mew=2)
                else:
                    ax.plot(p.rate, 0.97, "x", color=color, ms=10, mew=2, transform=ax.get_xaxis_transform())
    limit_bands(ax, [p.interval() for c in curves for p in c.points])
    initial = [x for c in curves for x in c.initial.values()]
    if initial:  # drawn where it falls inside the curves' range; named with its value either way
        at = statistics.fmean(initial)
        low, high = ax.get_ylim()
        where = "" if low <= at <= high else (", above the axis" if at > high else ", below the axis")
        ax.axhline(at, color="gray", ls=":", lw=1.2, label=f"at initialization: {at:.4g} (mean{where})")
        ax.set_ylim(low, high)
    ax.set_xscale("log")
    better = "lower" if study.mode == "min" else "higher"
    ax.set_xlabel("peak learning rate (train.lr, log scale)")
    ax.set_ylabel(f"{study.metric} ({better} is better)")
    ax.grid(alpha=0.3, which="both")
    if len(curves) > 6:
        fig.legend(fontsize="small", loc="outside right upper")
    else:
        ax.legend(fontsize="small")
    seeds = len(study.seeds)
    band = f"band: {CONFIDENCE:.0%} interval over {seeds} seeds" if seeds > 1 else "one seed: no band"
    ax.set_title(f"{report.root.name}: {study.metric} against the learning rate (tuning runs; {band};\n"
                 f"circled: the best rate, 'edge' when it ends the grid; x: some run diverged or failed)",
                 fontsize="medium")  # fmt: skip
    fig.savefig(path, dpi=110)
    return fig


def limit_bands(ax: Any, intervals: list[tuple[float, float, float] | None]) -> None:
    """Keep the y axis on the means: a band over two seeds can be far wider than the curves; it is cut at a
    quarter of the means' span beyond them."""
    known = [i for i in intervals if i is not None]
    if not known:
        return
    low, high = min(i[0] for i in known), max(i[0] for i in known)
    span = (high - low) or abs(high) * 0.05 or 0.1
    bottom = min(max(min(i[1] for i in known), low - 0.25 * span), low - 0.05 * span)
    ax.set_ylim(bottom, max(min(max(i[2] for i in known), high + 0.25 * span), high + 0.05 * span))


def short_label(report: Report, variant: Variant) -> str:
    return report.label(variant)


def plot_routing(report: Report, path: Path) -> bool:
    """Routing balance: for each variant whose runs route tokens (a mixture of experts), the fraction of
    validation tokens each expert received, one bar per layer (mean over seeds), beside the uniform
    share. Returns False (and writes nothing) when no run recorded routing."""
    routed = []
    for variant in report.variants:
        runs = [r.record.routing for r in variant.runs if r.record.routing]
        if runs:
            layers = {name: [sum(run[name][e] for run in runs) / len(runs) for e in range(len(runs[0][name]))]
                      for name in runs[0]}  # fmt: skip
            routed.append((short_label(report, variant), layers, len(runs)))
    if not routed:
        return False
    fig = Figure(figsize=(9, 2.4 * len(routed)), layout="constrained")
    axes = fig.subplots(len(routed), 1, squeeze=False)[:, 0]
    for ax, (label, layers, seeds) in zip(axes, routed, strict=True):
        n_experts = len(next(iter(layers.values())))
        width = 0.8 / len(layers)
        for i, (name, fractions) in enumerate(layers.items()):
            ax.bar([e + (i - (len(layers) - 1) / 2) * width for e in range(n_experts)], fractions, width, label=name)
        ax.axhline(1 / n_experts, color="black", lw=0.8, ls="--", label="uniform")
        ax.set_xticks(range(n_experts))
        ax.set_ylabel("fraction of tokens")
        ax.set_title(f"{label} ({seeds} seeds)", fontsize="small")
        ax.legend(fontsize="x-small", ncol=len(layers) + 1)
    axes[-1].set_xlabel("expert")
    fig.suptitle(f"{report.root.name}: routing balance on validation tokens")
    fig.savefig(path, dpi=110)
    return True
