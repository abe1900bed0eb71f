"""A sweep's report written: ``report.md``, ``report.csv`` (a row per variant), ``runs.csv`` (a row per run),
``effects.csv`` (several axes) and the plots, stale optional files removed; at the end of every sweep
(:func:`report_sweep`, from zoo.lab.reports.callback) and by ``zoo-report``. The statistics are
:mod:`zoo.lab.studies.stats`'."""

from __future__ import annotations

import csv
import logging
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from zoo.lab.planning.options import ladder_options, report_interaction, report_options, target_options
from zoo.lab.records.exit_status import report_failed
from zoo.lab.records.lock import report_lock
from zoo.lab.records.metrics import read_metrics
from zoo.lab.records.report_files import OPTIONAL, PLOTS, TABLES
from zoo.lab.reports.gates import write_gates
from zoo.lab.reports.ladder import plot_ladder, write_ladder_csv
from zoo.lab.reports.plots import plot_curves, plot_final, plot_interactions, plot_lr, plot_probes, plot_routing
from zoo.lab.reports.sections import markdown, warning_lines
from zoo.lab.reports.sweep_record import write_sweep_record
from zoo.lab.reports.table import (
    STAT_COLUMNS,
    clipped_cell,
    csv_columns,
    header_fields,
    relative_to,
    run_spikes,
    stat_cells,
    studied,
)
from zoo.lab.studies.gates import report_gates
from zoo.lab.studies.stats import (
    pass_threshold,
)
from zoo.lab.studies.variants import Report, build_report

log = logging.getLogger("zoo.lab.reports.report")


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
                value = r.record.final_value(m)
                passed = "" if threshold is None or not isinstance(value, (int, float)) else value >= threshold
                writer.writerow(
                    [relative_to(r.path, report.root), *v.key, r.seed, r.status, value,
                     (r.record.parameters or {}).get("total"), r.record.tokens_per_s, r.record.wall_time_s,
                     r.record.error or r.record.reason, passed, run_spikes(r.record)]
                )  # fmt: skip
        for d in report.dropped:  # no summary to read the axes from: the folder and the reason
            writer.writerow([relative_to(d.path, report.root), *[""] * len(report.axes), "", "not read", "", "", "",
                             "", d.reason, "", ""])  # fmt: skip


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


def write_built(report: Report, plots: bool = True, gates: Any = None) -> str:
    """Write the report's files (Markdown, CSVs, gates.json with ``gates`` and, with ``plots``, PNGs) into its root;
    returns the Markdown. ``gates`` (``report.gates``) defaults to the runs' own."""
    report.gates = report_gates(report, gates)
    text = markdown(report)
    for line in warning_lines(report):
        print(f"zoo-report: {report.root}: {line}", file=sys.stderr)
    for stale in OPTIONAL:  # an earlier report's (of more axes, with tuning, probes or routing)
        (report.root / stale).unlink(missing_ok=True)
    (report.root / "report.md").write_text(text)
    write_csv(report)
    write_ladder_csv(report)  # a ladder sweep's only
    write_gates(report)  # with report.gates only
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
        plot_ladder(report, report.root / "ladder.png")  # only for a ladder sweep (ladder.steps)
    return text


def written(root: Path, plots: bool) -> list[Path]:
    """The report's files in ``root`` (those this report wrote)."""
    names = TABLES + PLOTS if plots else TABLES
    return [root / n for n in names if (root / n).exists()]


def asked_budgets(config: DictConfig) -> list[int] | None:
    """The shorter budgets a ladder sweep asked for (its ``ladder.steps``), None for any other sweep."""
    section = OmegaConf.to_container(config.ladder, resolve=True) if "ladder" in config else None
    if not isinstance(section, dict) or not section.get("steps"):
        return None
    return ladder_options(section, int(config.train.steps))[0]


def report_sweep(config: DictConfig) -> None:
    """When a sweep ends (zoo.lab.reports.callback): write its report (a ladder's on the budgets it asked for) and
    print the table; a report that fails is logged and marks the sweep failed, and the runs stay as they are."""
    root = Path(config.hydra.sweep.dir)
    try:
        section = OmegaConf.to_container(config.report, resolve=True) if "report" in config else None
        baseline, correction, test = report_options(section)
        named = report_interaction((section or {}).get("interaction"))  # the sweep's, its runs skipped or not
        with report_lock(root):  # a second sweep into this folder writes its report after this one
            report = build_report(root, baseline=baseline, correction=correction, test=test, interaction=named,
                                  ladder=asked_budgets(config), target=target_options(section))  # fmt: skip
            text = write_built(report, gates=(section or {}).get("gates") or [])
            write_sweep_record(root, sys.argv)  # the command line, for zoo-results
    except Exception as error:  # a report problem must not hide the runs' own results: the sweep exits 1
        log.error("report for %s failed: %s: %s", root, type(error).__name__, error)
        report_failed(root, f"{type(error).__name__}: {error}")
        return
    others = ", ".join(p.name for p in written(root, True) if p.name != "report.md")
    print("\n" + text + f"\nreport: {root / 'report.md'} (and {others})")
    for d in report.dropped:
        log.error("report for %s left out %s: %s", root, relative_to(d.path, root), d.reason)
