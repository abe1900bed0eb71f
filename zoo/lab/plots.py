"""The report's PNGs, drawn with matplotlib's object API on the Agg canvas (no display, no pyplot state)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

from zoo.lab.variants import Report, Variant

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
    fig.legend(*val_ax.get_legend_handles_labels(), loc="outside right upper", fontsize="small", title="variant")
    fig.savefig(path, dpi=110)


def clip_outliers(ax: Any) -> None:
    """Start the y axis below the early-training spike so the end of training stays readable."""
    ys = [y for line in ax.get_lines() for y in line.get_ydata()]
    if len(ys) > 4:
        ys = sorted(ys)
        low, high = ys[0], ys[int(0.9 * (len(ys) - 1))]
        pad = 0.1 * (high - low) or 0.1
        ax.set_ylim(low - pad, high + 3 * pad)


def plot_final(report: Report, path: Path) -> None:
    """The headline metric per variant, mean ± std over seeds, best at the top; not-ok variants listed."""
    m = report.metric
    n = len(report.variants)
    fig = Figure(figsize=(9, 1.6 + 0.34 * n), layout="constrained")
    ax = fig.subplots()
    labels, ys, known = [], [], []
    for i, variant in enumerate(report.variants):
        y = n - 1 - i
        mean, std = variant.mean_std(m)
        labels.append(short_label(report, variant))
        ys.append(y)
        if mean is None:
            ax.annotate(variant.status, (0.01, y), xycoords=("axes fraction", "data"), va="center", color="firebrick")
            continue
        ax.errorbar(mean, y, xerr=std or 0, fmt="o", color="tab:blue", ecolor="tab:gray", capsize=4, ms=6, zorder=3)
        ax.annotate(f"{mean:.4f}", (mean, y), xytext=(0, 7), textcoords="offset points", fontsize="small", ha="center")
        seeds = variant.values(m)
        ax.plot(seeds, [y] * len(seeds), "x", color="tab:blue", alpha=0.45, ms=5)
        known += [*seeds, mean - (std or 0), mean + (std or 0)]
    ax.set_yticks(ys, labels, fontsize="small")
    ax.set_ylim(-0.7, n - 0.3)
    better = "lower" if report.mode == "min" else "higher"
    ax.set_xlabel(f"{m} ({better} is better); dot: mean, bar: ± std, x: each seed")
    ax.set_title(f"{report.root.name}: final {m} per variant, best at the top")
    ax.grid(axis="x", alpha=0.3)
    if known:
        low, high = min(known), max(known)
        pad = 0.08 * ((high - low) or abs(high) * 0.05 or 0.1)
        ax.set_xlim(low - pad, high + pad)
    fig.savefig(path, dpi=110)


def short_label(report: Report, variant: Variant) -> str:
    return report.label(variant)
