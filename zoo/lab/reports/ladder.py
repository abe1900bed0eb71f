"""A ladder sweep's part of the report (``ladder.steps``, zoo/lab/studies/ladder/study.py): its section in report.md,
``ladder.csv`` (one row per variant) and ``ladder.png`` (loss against compute with each envelope, the paired
loss difference with its band and any crossing, the iso-loss multiplier against loss with any not-reached
bound). A sweep that is not a ladder gets none."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, MaxNLocator, NullFormatter

from zoo.lab.reports.plots import palette
from zoo.lab.studies.ladder.iso import LOW_AT, POINTS, cost_at
from zoo.lab.studies.ladder.study import LAW_REACH, SEED_SPREAD, Answer, Cell, LadderRow, LadderStudy, envelope
from zoo.lab.studies.stats import CONFIDENCE
from zoo.lab.studies.variants import Report, steps_of


def label(study: LadderStudy, key: tuple[str, ...]) -> str:
    return " ".join(f"{a}={v}" for a, v in zip(study.axes, key, strict=True)) or "the ladder"


def num(value: float, spec: str = ".3g") -> str:
    return f"{value:{spec}}" if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def ci_text(mean: float, low: float, high: float) -> str:
    if not math.isfinite(mean):
        return "-"
    return f"{num(mean)} [{num(low)}, {num(high)}]" if math.isfinite(low) else num(mean)


def bound_text(a: Answer) -> str:
    if math.isfinite(a.data_lower_bound):
        return f"at least {num(a.data_lower_bound)} (measured)"
    if math.isfinite(a.data_upper_bound):
        return f"at most {num(a.data_upper_bound)} (measured)"
    if math.isfinite(a.crossing_compute):
        return f"crosses at C = {num(a.crossing_compute)}"
    return ""


def intro(study: LadderStudy, report: Report) -> str:
    return (
        f"Ladder (ladder.steps; ladder.csv, ladder.png): per variant, the loss ({study.metric}) against training "
        f"compute C (each run's FLOPs; a branch counts its source's steps), the (width, budget) cells averaged "
        f"over the seeds ({study.varied} varied between them). Each variant is answered on its pair alone (it "
        f"and the baseline). Multiplier (no law): C_baseline(L) / C_variant(L) on the two compute-optimal "
        f"envelopes, interpolated log-log, near the lowest loss both reach ({LOW_AT:g} of the way up the range "
        f"both reach, in log L) and at its middle [{CONFIDENCE:.0%} intervals, simultaneous over the two "
        f"multipliers and the paired loss difference at {POINTS} computes: a two-level bootstrap, seeds and runs "
        f"within a seed, paired]; the same on the runs' training time, each run's time drawn with its loss "
        f"[its own {CONFIDENCE:.0%} interval, no verdict]. Verdict, the first that holds: too few seeds; "
        f"unidentified (the seeds' own mid-range multipliers span more than {SEED_SPREAD:g}x); not reached (one "
        f"envelope lies wholly below or above the other's losses: a measured bound, no multiplier); "
        f"scale-dependent (the paired loss difference is significantly of both signs within the compute trained, "
        f"or the two multipliers are); else better / worse / within noise, each multiplier named when they differ; "
        f"Holm-corrected over the ladder's {max(len(study.rows) - 1, 0)} variants (p: the band's, Holm's). Law "
        f"(secondary): L(C) = E + A (C / C0)^-alpha fitted on the pair's envelopes with a shared floor, read at "
        f"the variant's largest compute; floor-dependent when each curve's own floor moves it past its interval; "
        f"withheld when its error on the largest width held out exceeds the difference it predicts, or when it "
        f"reads the baseline more than {LAW_REACH:g}x past its largest compute (and past what the held-out check "
        f"reached). Report test {report.test} is not used here."
    )


def noise_line(study: LadderStudy) -> str:
    """The noise by source the runs show, and whether other work shared their timings."""
    n, t = study.noise, study.time_noise
    shared, recorded, runs = study.timings
    if not recorded:
        machine = f"no run recorded the machine's load ({runs} runs): whether other work shared its timings is unknown"
    elif shared:
        machine = (f"{shared} of {recorded} runs trained while the machine's load average exceeded its cores: other "
                   f"work shared their timings, and the wall-time multipliers support no cost claim")  # fmt: skip
    else:
        machine = f"no run of {recorded} trained while the machine's load average exceeded its cores"
    budgets = ", ".join(f"{num(sd, '.2g')} at {steps} steps" for steps, sd in n.by_budget.items())
    return (f"Noise in {study.metric} (pooled over {n.curves} variants): a seed's offset sd {num(n.seed, '.2g')}, "
            f"a run's own sd {num(n.run, '.2g')} ({budgets}); in log training time, a seed's "
            f"{num(t.seed, '.2g')} and a run's {num(t.run, '.2g')}. Timings: {machine}.")  # fmt: skip


def ladder_lines(report: Report) -> list[str]:
    """The ladder section of report.md: how it is read, a row per variant, refusals."""
    study = report.ladder
    if study is None:
        return []
    lines = [
        "",
        intro(study, report),
        *budget_lines(report),
        "",
        noise_line(study),
        "",
        f"| variant | envelope cells | seeds | verdict | p (Holm) | multiplier near the lowest loss both reach "
        f"[{CONFIDENCE:.0%} CI] | at mid-range | loss range both reach (read at) | in wall time | bound or crossing | "
        f"law multiplier [{CONFIDENCE:.0%} CI] | own floors | baseline read at (x its largest C) | held-out "
        f"error (base, variant) | predicted difference | law verdict |",
        "|" + "---|" * 16,
    ]  # fmt: skip
    for key, row in study.rows.items():
        a = row.answer
        if a is None:
            cells = [label(study, key), str(len(envelope_of(row))), str(len(row.per_seed)), "baseline"] + [""] * 12
        else:
            law, held = a.law, a.law.held_out
            cells = [label(study, key), str(len(envelope_of(row))), str(a.seeds), a.verdict,
                     f"{num(a.p_value, '.2g')} ({num(a.p_holm, '.2g')})" if math.isfinite(a.p_value) else "-",
                     ci_text(a.multiplier, a.low, a.high), ci_text(a.mid, a.mid_low, a.mid_high),
                     f"{num(a.losses[0], '.4f')}-{num(a.losses[1], '.4f')} ({num(a.read[0], '.4f')}, "
                     f"{num(a.read[1], '.4f')})" if a.losses[0] <= a.losses[1] else "none",
                     ci_text(a.time, a.time_low, a.time_high), bound_text(a),
                     ci_text(law.multiplier, law.low, law.high),
                     num(law.own_floors), num(law.baseline_extrapolation),
                     f"{num(held.base_error, '.4f')}, {num(held.var_error, '.4f')}" if held else "-",
                     num(law.predicted_difference, ".4f"), law.verdict]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    if study.rates:
        lines += ["", "The rate per budget (tuned at the longest, each budget's best among the tuning runs' decays):"]
        lines += [f"- {label(study, key)}: {text}" for key, text in study.rates.items()]
    if study.errors:
        lines += ["", "Not fitted (no number is given for these):"] + [f"- {e}" for e in study.errors]
    return lines


def budget_lines(report: Report) -> list[str]:
    """Which budgets the fit read, when the folder holds others (an earlier sweep's, not asked for again)."""
    if not report.ladder_left_out:
        return []
    shown = ", ".join(map(str, sorted({steps_of(r) for r in report.runs} - set(report.ladder_left_out))))
    return ["", f"Budgets read: {shown} (ladder.steps and train.steps); left out: "
                f"{', '.join(map(str, report.ladder_left_out))} (in the folder, not asked for)."]  # fmt: skip


def envelope_of(row: LadderRow) -> list[Cell]:
    return envelope(row.cells)


#: ladder.csv's columns after the variant's axis values.
COLUMNS = [
    "envelope_cells", "seeds", "varied", "compute", "loss_lowest_shared", "loss_highest_shared", "loss_read",
    "loss_read_mid", "multiplier", "multiplier_ci_low", "multiplier_ci_high", "multiplier_mid",
    "multiplier_mid_ci_low", "multiplier_mid_ci_high", "verdict", "p_value", "p_holm", "data_lower_bound",
    "data_upper_bound", "crossing_compute", "seed_spread", "time_multiplier",
    "time_multiplier_ci_low", "time_multiplier_ci_high", "law_E", "law_A", "law_alpha", "law_alpha_baseline",
    "law_c0", "law_compute", "law_multiplier", "law_multiplier_ci_low", "law_multiplier_ci_high",
    "law_multiplier_own_floors", "law_multiplier_extrapolated", "baseline_extrapolation", "heldout_width",
    "heldout_error_baseline", "heldout_error_variant", "law_predicted_difference", "law_verdict", "rate_check",
]  # fmt: skip


def cell(value: Any) -> Any:
    return "" if isinstance(value, float) and not math.isfinite(value) else value


def csv_row(study: LadderStudy, row: LadderRow) -> list[Any]:
    head = [len(envelope_of(row)), len(row.per_seed), study.varied, row.compute]
    a, rates = row.answer, study.rates.get(row.key, "")
    if a is None:
        return head + [""] * 10 + ["baseline"] + [""] * (len(COLUMNS) - 16) + [rates]
    law, held = a.law, a.law.held_out
    fit = [law.var.E, law.var.A, law.var.alpha, law.base.alpha, law.var.c0] if law.var and law.base else [""] * 5
    values = [*a.losses, *a.read, a.multiplier, a.low, a.high, a.mid, a.mid_low, a.mid_high, a.verdict, a.p_value,
              a.p_holm, a.data_lower_bound,
              a.data_upper_bound, a.crossing_compute, a.seed_spread, a.time, a.time_low, a.time_high, *fit,
              law.compute, law.multiplier, law.low, law.high, law.own_floors, law.far, law.baseline_extrapolation,
              held.width if held else "", held.base_error if held else "", held.var_error if held else "",
              law.predicted_difference, law.verdict, rates]  # fmt: skip
    return [cell(v) for v in head + values]


def write_ladder_csv(report: Report) -> None:
    """ladder.csv: a row per variant (its axis values, the data's answer, the law's); none without a ladder."""
    study = report.ladder
    if study is None:
        return
    with open(report.root / "ladder.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*study.axes, *COLUMNS])
        for key, row in study.rows.items():
            writer.writerow([*key, *csv_row(study, row)])


def draw_row(axes: Any, study: LadderStudy, row: LadderRow, color: Any) -> None:
    """One variant on the three panels: runs and envelope; paired difference and crossing; iso-loss curve."""
    loss_ax, diff_ax, mult_ax = axes
    name = label(study, row.key)
    for cells in row.per_seed.values():
        loss_ax.plot([c.compute for c in cells], [c.loss for c in cells], ".", color=color, alpha=0.3)
    front = envelope_of(row)
    loss_ax.plot([c.compute for c in front], [c.loss for c in front], "o-", color=color, mfc="none", label=name)
    a = row.answer
    if a is None or a.pair is None:
        return
    pair, law = a.pair, a.law
    if law.var is not None and law.base is not None:
        grid = np.geomspace(front[0].compute, row.compute * study.extrapolate, 40)
        loss_ax.plot(grid, [law.var.loss(c) for c in grid], "--", color=color, lw=0.8)
    if len(pair.points):
        diff_ax.plot(pair.points, pair.difference, "-", color=color, label=name)
        if a.difference_low.size:
            diff_ax.fill_between(pair.points, a.difference_low, a.difference_high, color=color, alpha=0.2)
    if math.isfinite(a.crossing_compute):
        for ax in (loss_ax, diff_ax):
            ax.axvline(a.crossing_compute, color=color, ls=":", lw=1.2)
        diff_ax.annotate("crossing", (a.crossing_compute, 0), color=color, textcoords="offset points",
                         xytext=(4, 6), fontsize="small")  # fmt: skip
    low, high = pair.losses
    if low <= high:
        ls = np.geomspace(low, high, 30)
        mult_ax.plot(ls, [cost_at(pair.base, v) / cost_at(pair.var, v) for v in ls], "-", color=color, label=name)
        for at, value, lo, hi in ((a.read[0], a.multiplier, a.low, a.high), (a.read[1], a.mid, a.mid_low, a.mid_high)):
            if math.isfinite(lo):
                mult_ax.errorbar([at], [value], yerr=[[value - lo], [hi - value]], fmt="o", color=color, capsize=3)
    bound = a.data_lower_bound if math.isfinite(a.data_lower_bound) else a.data_upper_bound
    if math.isfinite(bound):
        at = pair.var[1][0]
        mult_ax.plot([at], [bound], "^" if math.isfinite(a.data_lower_bound) else "v", color=color, ms=10)
        mult_ax.annotate(f"not reached: {'>=' if math.isfinite(a.data_lower_bound) else '<='} {bound:.3g}",
                         (at, bound), color=color, textcoords="offset points", xytext=(6, 0), fontsize="small")
        loss_ax.annotate("not reached", (front[0].compute, front[0].loss), color=color, textcoords="offset points",
                         xytext=(4, -12), fontsize="small")  # fmt: skip


def plot_ladder(report: Report, path: Path) -> bool:
    """ladder.png: loss against compute (log axes: every run, each envelope, the pair laws dashed), the paired
    loss difference against compute with its band and crossings, the iso-loss multiplier against loss (its
    interval at the lowest loss both reach, a not-reached bound as a triangle). False without a ladder."""
    study = report.ladder
    if study is None or not study.rows:
        return False
    fig = Figure(figsize=(16, 4.8), layout="constrained")
    axes = fig.subplots(1, 3)
    colors = dict(zip(study.rows, palette(len(study.rows)), strict=True))
    for key, row in study.rows.items():
        draw_row(axes, study, row, colors[key])
    loss_ax, diff_ax, mult_ax = axes
    for ax in (loss_ax, diff_ax):
        ax.set_xscale("log")
        ax.set_xlabel("training compute C (FLOPs, log scale)")
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
    loss_ax.set_yscale("log")
    loss_ax.set_ylabel(f"{study.metric} (log scale)")
    loss_ax.set_title("runs (dots), envelopes (circles), pair laws (dashed)", fontsize="medium")
    diff_ax.axhline(0.0, color="black", lw=0.8)
    diff_ax.set_ylabel(f"{study.metric}: variant - baseline at equal compute")
    diff_ax.set_title(f"paired difference, simultaneous {CONFIDENCE:.0%} band (dotted: crossing)", fontsize="medium")
    mult_ax.axhline(1.0, color="black", lw=0.8)
    mult_ax.set_xscale("log")
    mult_ax.set_yscale("log")
    mult_ax.xaxis.set_major_locator(MaxNLocator(6))  # a loss range under a decade: plain numbers, not 3 x 10^0
    mult_ax.xaxis.set_major_formatter(FormatStrFormatter("%.2f"))
    mult_ax.xaxis.set_minor_formatter(NullFormatter())
    mult_ax.set_xlabel(f"{study.metric} both reach (log scale)")
    mult_ax.set_ylabel("iso-loss multiplier C_baseline(L) / C_variant(L)")
    mult_ax.set_title("multiplier (bars: intervals where it is read; triangle: bound)", fontsize="medium")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.suptitle(f"{report.root.name}: ladder, baseline {label(study, study.baseline)}")
    fig.savefig(path, dpi=110)
    return True
