"""A ladder sweep's part of the report (``ladder.steps``, zoo/lab/studies/ladder.py): its section in report.md,
``ladder.csv`` (one row per variant) and ``ladder.png`` (loss against compute with each variant's fit, the
multiplier against compute with its band, the fits' residuals). A sweep that is not a ladder gets none."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from zoo.lab.reports.plots import palette
from zoo.lab.studies.ladder import Interval, LadderRow, LadderStudy, multiplier, seed_interval
from zoo.lab.studies.stats import CONFIDENCE
from zoo.lab.studies.variants import Report


def label(study: LadderStudy, key: tuple[str, ...]) -> str:
    return " ".join(f"{a}={v}" for a, v in zip(study.axes, key, strict=True)) or "the ladder"


def interval_text(i: Interval | None, spec: str = ".3g") -> str:
    if i is None:
        return "baseline"
    if i.mean is None or i.low is None or i.high is None:
        return i.verdict
    return f"{i.mean:{spec}} [{i.low:{spec}}, {i.high:{spec}}]"


def rms(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else math.nan


def ladder_lines(report: Report) -> list[str]:
    """The ladder section of report.md: how the fit and the multiplier are read, a row per variant, refusals."""
    study = report.ladder
    if study is None:
        return []
    far, first = study.extrapolate, next(iter(study.rows.values()), None)
    c0 = f" (C0 = {first.fit.c0:.3g} FLOPs)" if first else ""
    lines = [
        "",
        f"Ladder (ladder.steps; ladder.csv, ladder.png): per variant, the loss ({study.metric}) against training "
        f"compute C (each run's FLOPs; a branch counts its source's steps), the (width, budget) cells averaged "
        f"over the seeds, fitted on the compute-optimal envelope as L(C) = E + A (C / C0)^-alpha{c0} with a Huber "
        f"loss on log L. Multiplier: the compute the baseline's fit needs to reach the variant's loss at C, over "
        f"C (above 1: the variant is worth that much more compute), at the largest compute it trained and at "
        f"{far:g}x it (an extrapolation); the geometric mean over the seeds of each seed's refit, variant and "
        f"baseline of the same seed [{CONFIDENCE:.0%} interval, {report.test}]. Δalpha: the variant's exponent "
        f"minus the baseline's (steeper: the gap grows with compute).",
        "",
        f"| variant | E | A | alpha | envelope cells | RMS residual (log L) | compute C | multiplier at C "
        f"[{CONFIDENCE:.0%} CI] | verdict | multiplier at {far:g}x C [{CONFIDENCE:.0%} CI] | verdict | Δalpha "
        f"[{CONFIDENCE:.0%} CI] | verdict |",
        "|" + "---|" * 13,
    ]  # fmt: skip
    for key, row in study.rows.items():
        fit = row.fit
        cells = [label(study, key), f"{fit.E:.4f}", f"{fit.A:.4f}", f"{fit.alpha:.4f}", str(len(fit.cells)),
                 f"{rms(fit.residuals):.4f}", f"{row.compute:.3g}", interval_text(row.multiplier),
                 verdict(row.multiplier), interval_text(row.multiplier_far), verdict(row.multiplier_far),
                 interval_text(row.alpha_delta, "+.3f"), verdict(row.alpha_delta)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    if study.errors:
        lines += ["", "Not fitted (no number is given for these):"] + [f"- {e}" for e in study.errors]
    return lines


def verdict(i: Interval | None) -> str:
    return "" if i is None or i.mean is None else i.verdict


#: ladder.csv's columns after the variant's axis values.
COLUMNS = [
    "E", "A", "alpha", "c0", "envelope_cells", "residual_rms", "compute", "multiplier", "multiplier_ci_low",
    "multiplier_ci_high", "verdict", "compute_extrapolated", "multiplier_extrapolated",
    "multiplier_extrapolated_ci_low", "multiplier_extrapolated_ci_high", "verdict_extrapolated", "alpha_delta",
    "alpha_delta_ci_low", "alpha_delta_ci_high", "alpha_verdict", "seeds",
]  # fmt: skip


def csv_row(study: LadderStudy, row: LadderRow) -> list[Any]:
    base = row.key == study.baseline
    near, far, alpha = row.multiplier, row.multiplier_far, row.alpha_delta

    def parts(i: Interval | None) -> list[Any]:
        return ["", "", "", "baseline" if base else ""] if i is None else [i.mean, i.low, i.high, i.verdict]

    fit = row.fit
    return [fit.E, fit.A, fit.alpha, fit.c0, len(fit.cells), rms(fit.residuals), row.compute, *parts(near),
            row.compute * study.extrapolate, *parts(far), *parts(alpha), len(row.seed_fits)]  # fmt: skip


def write_ladder_csv(report: Report) -> None:
    """ladder.csv: a row per fitted variant (its axis values, the law, the multipliers); none without a ladder."""
    study = report.ladder
    if study is None:
        return
    with open(report.root / "ladder.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*study.axes, *COLUMNS])
        for key, row in study.rows.items():
            writer.writerow([*key, *csv_row(study, row)])


def plot_ladder(report: Report, path: Path) -> bool:
    """ladder.png: loss against compute (log axes: every run, each variant's envelope and fit), the multiplier
    against compute with its band (each seed's refit), and the fits' residuals. False without a fitted ladder."""
    study = report.ladder
    if study is None or not study.rows:
        return False
    fig = Figure(figsize=(16, 4.8), layout="constrained")
    loss_ax, mult_ax, res_ax = fig.subplots(1, 3)
    colors = dict(zip(study.rows, palette(len(study.rows)), strict=True))
    top = max(r.compute for r in study.rows.values()) * study.extrapolate
    low = min(c.compute for r in study.rows.values() for f in r.seed_fits.values() for c in f.cells)
    grid = [low * (top / low) ** (i / 60) for i in range(61)]
    base = study.rows.get(study.baseline)
    for key, row in study.rows.items():
        color, name = colors[key], label(study, key)
        for fit in row.seed_fits.values():
            loss_ax.plot([c.compute for c in fit.cells], [c.loss for c in fit.cells], ".", color=color, alpha=0.3)
        loss_ax.plot([c.compute for c in row.fit.cells], [c.loss for c in row.fit.cells], "o", color=color,
                     mfc="none", ms=8)  # fmt: skip
        trained = [c for c in grid if c <= row.compute]
        loss_ax.plot(trained, [row.fit.loss(c) for c in trained], "-", color=color, label=name)
        beyond = [c for c in grid if c >= row.compute]
        loss_ax.plot(beyond, [row.fit.loss(c) for c in beyond], "--", color=color)
        res_ax.plot([c.compute for c in row.fit.cells], row.fit.residuals, "o-", color=color, label=name)
        if base is not None and key != study.baseline:
            band = [band_at(row, base, c, report.test) for c in grid]
            kept = [(c, b) for c, b in zip(grid, band, strict=True) if b.mean is not None]
            if kept:
                xs = [c for c, _ in kept]
                mult_ax.plot(xs, [b.mean for _, b in kept], color=color, label=name)
                mult_ax.fill_between(xs, [b.low for _, b in kept], [b.high for _, b in kept], color=color, alpha=0.2)
                mult_ax.axvline(row.compute, color=color, ls=":", lw=1)
    for ax in (loss_ax, mult_ax, res_ax):
        ax.set_xscale("log")
        ax.set_xlabel("training compute C (FLOPs, log scale)")
        ax.grid(alpha=0.3, which="both")
    loss_ax.set_yscale("log")
    loss_ax.set_ylabel(f"{study.metric} (log scale)")
    loss_ax.set_title("runs (dots), envelope (circles), fit (dashed: extrapolated)", fontsize="medium")
    mult_ax.axhline(1.0, color="black", lw=0.8)
    mult_ax.set_yscale("log")
    mult_ax.set_ylabel("compute multiplier vs the baseline")
    mult_ax.set_title(f"multiplier, {CONFIDENCE:.0%} band over seeds (dotted: largest compute trained)",
                      fontsize="medium")  # fmt: skip
    res_ax.axhline(0.0, color="black", lw=0.8)
    res_ax.set_ylabel("fit residual (log L fitted - measured)")
    res_ax.set_title("residuals on the envelope (seed means)", fontsize="medium")
    for ax in (loss_ax, mult_ax, res_ax):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.suptitle(f"{report.root.name}: ladder, baseline {label(study, study.baseline)}")
    fig.savefig(path, dpi=110)
    return True


def band_at(row: LadderRow, base: LadderRow, compute: float, test: str) -> Interval:
    """The multiplier at ``compute`` over the seeds (each seed's refit against the baseline's of that seed)."""
    seeds = [s for s in row.seed_fits if s in base.seed_fits]
    values = [multiplier(row.seed_fits[s], base.seed_fits[s], compute) for s in seeds]
    return seed_interval(values, test, log=True, center=1.0, words=("better", "worse"))
