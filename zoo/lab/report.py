"""``zoo-report DIR``: one row per variant of a sweep, mean ± std over seeds, sorted by the metric.

Reads every ``summary.json`` under DIR; writes ``report.md``, ``report.csv`` (one row per
variant), ``runs.csv`` (one row per run), ``curves.png`` and ``final.png`` beside them, and
prints the Markdown table. Runs at the end of every sweep (:class:`ReportCallback`).
"""

from __future__ import annotations

import argparse
import csv
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from zoo.lab.fixed import fixed_line
from zoo.lab.plots import plot_curves, plot_final
from zoo.lab.records import read_metrics
from zoo.lab.variants import Report, build_report

log = logging.getLogger("zoo.lab.report")


def fmt(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def markdown(report: Report) -> str:
    """The variants table, best first, with a line on what was measured and the failures below."""
    m = report.metric
    better = "lower" if report.mode == "min" else "higher"
    best = next((v.mean_std(m)[0] for v in report.variants if v.mean_std(m)[0] is not None), None)
    head = [
        "#",
        *report.axes,
        "seeds",
        "params",
        f"{m} (mean ± std)",
        "vs best",
        *report.extra,
        "tokens/s",
        "wall s",
        "status",
    ]
    lines = [
        f"{report.root}: {len(report.runs)} runs, {len(report.variants)} variants, sorted by {m} ({better} is better)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for i, variant in enumerate(report.variants, 1):
        mean, std = variant.mean_std(m)
        shown = "" if mean is None else fmt(mean) + (f" ± {std:.4f}" if std is not None else "")
        delta = "" if mean is None or best is None else ("best" if i == 1 else f"{mean - best:+.4f}")
        params = variant.parameters
        rate, wall = variant.mean_of("tokens_per_s"), variant.mean_of("wall_time_s")
        row = [
            str(i),
            *variant.key,
            str(len(variant.runs)),
            f"{params:,}" if params is not None else "",
            shown,
            delta,
            *[fmt(variant.mean_std(k)[0]) for k in report.extra],
            f"{rate:,.0f}" if rate is not None else "",
            f"{wall:.1f}" if wall is not None else "",
            variant.status,
        ]
        lines.append("| " + " | ".join(row) + " |")
    lines += fixed_line(report.runs)  # what every run shares beyond zoo's defaults (zoo/lab/fixed.py)
    problems = [(report.label(v), e) for v in report.variants for e in v.errors()]
    if problems:
        lines += ["", "Not ok:"] + [f"- {label}: {error}" for label, error in problems]
    resumed = [(r.path.relative_to(report.root).as_posix() or ".", r.summary["resumed_from"])
               for v in report.variants for r in v.runs if r.summary.get("resumed_from")]  # fmt: skip
    if resumed:
        lines += ["", "Resumed from a checkpoint:"]
        lines += [f"- {path}: from step {', '.join(str(s) for s in steps)}" for path, steps in resumed]
    return "\n".join(lines) + "\n"


def write_csv(report: Report) -> None:
    m = report.metric
    finals = sorted({k for r in report.runs for k in (r.summary.get("final") or {})})
    with open(report.root / "report.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            [*report.axes, "runs", "ok", "parameters", "metric", f"{m}_mean", f"{m}_std",
             *[f"{k}_mean" for k in finals if k != m], "tokens_per_s", "wall_time_s", "flops_per_token", "status"]
        )  # fmt: skip
        for v in report.variants:
            mean, std = v.mean_std(m)
            flops = next((r.summary.get("flops_per_token") for r in v.runs if r.summary.get("flops_per_token")), None)
            writer.writerow(
                [*v.key, len(v.runs), len(v.ok), v.parameters, m, mean, std,
                 *[v.mean_std(k)[0] for k in finals if k != m], v.mean_of("tokens_per_s"), v.mean_of("wall_time_s"),
                 flops, v.status]
            )  # fmt: skip
    with open(report.root / "runs.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["run_dir", *report.axes, "seed", "status", m, "parameters", "tokens_per_s", "wall_time_s", "error"]
        )
        for v in report.variants:
            for r in v.runs:
                writer.writerow(
                    [r.path.relative_to(report.root).as_posix() or ".", *v.key, r.seed, r.status,
                     (r.summary.get("final") or {}).get(m), (r.summary.get("parameters") or {}).get("total"),
                     r.summary.get("tokens_per_s"), r.summary.get("wall_time_s"),
                     r.summary.get("error") or r.summary.get("reason")]
                )  # fmt: skip


def write_report(root: Path, plots: bool = True) -> str:
    """Build and write the whole report for the runs under ``root``; returns the Markdown."""
    report = build_report(Path(root))
    text = markdown(report)
    (report.root / "report.md").write_text(text)
    write_csv(report)
    if plots:
        plot_curves(report, report.root / "curves.png", {r.path: read_metrics(r.path) for r in report.runs})
        plot_final(report, report.root / "final.png")
    return text


def report_main(argv: Sequence[str] | None = None) -> None:
    """``zoo-report DIR``: print a sweep's table; write report.md, report.csv, runs.csv and PNG plots."""
    parser = argparse.ArgumentParser(prog="zoo-report", description=report_main.__doc__)
    parser.add_argument("dir", type=Path, help="a sweep folder (e.g. runs/quick) or any folder of runs")
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    args = parser.parse_args(argv)
    try:
        print(write_report(args.dir, plots=not args.no_plots), end="")
    except FileNotFoundError as error:
        parser.exit(1, f"zoo-report: {error}\n")
    print(f"\nwritten: {', '.join(str(args.dir / n) for n in ('report.md', 'report.csv', 'runs.csv'))}", end="")
    print("" if args.no_plots else f", {args.dir / 'curves.png'}, {args.dir / 'final.png'}")


class ReportCallback(Callback):
    """Hydra callback: when a sweep ends, write its report and print the table."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        root = Path(config.hydra.sweep.dir)
        try:
            text = write_report(root)
        except Exception as error:  # a report problem must not hide the runs' own results
            log.error("report for %s failed: %s: %s", root, type(error).__name__, error)
            return
        print("\n" + text + f"\nreport: {root / 'report.md'} (and report.csv, runs.csv, curves.png, final.png)")


if __name__ == "__main__":
    report_main()
