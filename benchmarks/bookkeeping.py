"""A sweep's bookkeeping against its wall time: the report (statistics, tables, plots) and the
orchestration of ``tune.lr``, timed on a finished sweep folder (target: under 5% of the sweep).

    python benchmarks/bookkeeping.py runs/quick --repeats 5

The folder's ``summary.json`` and ``metrics.jsonl`` files are copied to a temporary folder first (the
report writes its files there, not into the sweep). ``tune.lr`` adds, per sweep, the start of one
process for the tuning sweep (Hydra composing the same sweep), and per run the choice of its rate
from the tuning runs' summaries: both are timed, the latter on a tuning folder of 3 rates per variant
made from the sweep's own summaries. Training the tuning runs is training, not bookkeeping.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from zoo.lab.files import write_json_atomic
from zoo.lab.planning.options import TUNE_DIR
from zoo.lab.records.metrics import read_metrics
from zoo.lab.reports.plots import plot_curves, plot_final, plot_interactions
from zoo.lab.reports.report import write_csv, write_report
from zoo.lab.reports.sections import markdown
from zoo.lab.studies.tune import choose_lr
from zoo.lab.studies.variants import build_report, collect

RATES = (1e-3, 3e-3, 1e-2)


def copy_sweep(root: Path, to: Path) -> None:
    for summary in root.rglob("summary.json"):
        rel = summary.parent.relative_to(root)
        if rel.parts and rel.parts[0] == TUNE_DIR:
            continue
        (to / rel).mkdir(parents=True, exist_ok=True)
        shutil.copy(summary, to / rel / "summary.json")
        if (summary.parent / "metrics.jsonl").exists():
            shutil.copy(summary.parent / "metrics.jsonl", to / rel / "metrics.jsonl")


def fake_tuning(root: Path) -> list[dict]:
    """A tuning folder beside the copied runs: each run's config at 3 rates on seed 0; the configs to tune."""
    configs = []
    for i, run in enumerate(collect(root)):
        config = copy.deepcopy(run.record.config or {})
        config["tune"] = {"lr": list(RATES), "seeds": [0]}
        configs.append(config)
        if config.get("seed", 0) != 0:
            continue
        for rate in RATES:
            summary = copy.deepcopy(run.record.to_json())
            summary["config"]["train"]["lr"] = rate
            summary["metric"]["value"] = (summary["metric"].get("value") or 3.0) + abs(rate - 3e-3)
            write_json_atomic(root / TUNE_DIR / f"{i}-{rate}" / "summary.json", summary)
    return configs


def sweep_wall(root: Path) -> tuple[float, float]:
    """(first start to last finish, sum of the runs' wall times) in seconds."""
    runs = collect(root)
    starts = [datetime.datetime.fromisoformat(r.record.started) for r in runs if r.record.started]
    ends = [datetime.datetime.fromisoformat(r.record.finished) for r in runs if r.record.finished]
    span = (max(ends) - min(starts)).total_seconds() if starts and ends else 0.0
    return span, sum(r.record.wall_time_s or 0.0 for r in runs)


def measure(steps: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """(median wall s, median CPU s of this process and its children) per step, timed round-robin."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            wall, cpu = time.perf_counter(), cpu_seconds()
            step()
            samples[name].append((time.perf_counter() - wall, cpu_seconds() - cpu))
    median = statistics.median
    return {name: (median(w for w, _ in v), median(c for _, c in v)) for name, v in samples.items()}


def cpu_seconds() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, nargs="?", default=Path("runs/quick"), help="a finished sweep folder")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-process", action="store_true", help="skip timing the tuning sweep's process start")
    parser.add_argument("--sweep-cpu-s", type=float, help="the sweep's CPU seconds (user + sys of `/usr/bin/time`): "
                        "a ratio that does not move with the machine's load")  # fmt: skip
    args = parser.parse_args()
    span, summed = sweep_wall(args.dir)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / args.dir.name
        copy_sweep(args.dir, root)
        report = build_report(root)

        def plots() -> None:
            plot_curves(report, root / "curves.png", {r.path: read_metrics(r.path) for r in report.runs})
            plot_final(report, root / "final.png")
            if len(report.axes) >= 2:
                plot_interactions(report, root / "interactions.png")

        def tables() -> None:
            markdown(report)
            write_csv(report)

        configs = fake_tuning(root)

        def choose() -> None:
            for config in configs:
                choose_lr(config, root / TUNE_DIR)

        steps: dict[str, Callable[[], object]] = {
            "statistics (build_report: read, group, intervals)": lambda: build_report(root),
            "tables (report.md text, report.csv, runs.csv)": tables,
            "plots (curves, final, interactions)": plots,
            "whole report (write_report, what a sweep runs)": lambda: write_report(root),
            f"tune.lr: choosing the rate, all {len(configs)} runs": choose,
        }
        sweep = next(((r.record.choices or {}).get("sweeps") for r in report.runs), None)
        if not args.no_process and sweep:
            command = [sys.executable, "-m", "zoo.train", f"+sweeps={sweep}", "--cfg", "job"]  # start + compose
            steps["tune.lr: starting the tuning sweep's process"] = lambda: subprocess.run(
                command, capture_output=True, check=True
            )
        times = measure(steps, args.repeats)
    print(f"sweep: {args.dir} ({len(report.runs)} runs, {len(report.variants)} variants): {span:.0f} s from first "
          f"start to last finish, {summed:.0f} s summed over runs"
          + (f", {args.sweep_cpu_s:.0f} CPU s" if args.sweep_cpu_s else ""))  # fmt: skip
    print("| bookkeeping | wall s (median) | CPU s (median) | % of the sweep's wall time | % of its CPU time |")
    print("|---|---|---|---|---|")
    for name, (wall, cpu) in times.items():
        share = f"{100 * cpu / args.sweep_cpu_s:.2f}%" if args.sweep_cpu_s else ""
        print(f"| {name} | {wall:.3f} | {cpu:.3f} | {100 * wall / max(span, 1e-9):.2f}% | {share} |")
    report_s, report_cpu = times["whole report (write_report, what a sweep runs)"]
    tune_s = sum(w for name, (w, _) in times.items() if name.startswith("tune.lr"))
    tune_cpu = sum(c for name, (_, c) in times.items() if name.startswith("tune.lr"))
    print(f"every sweep: the report, {report_s:.2f} s = {100 * report_s / max(span, 1e-9):.2f}% of {span:.0f} s "
          f"(target < 5%)")  # fmt: skip
    # With tune.lr the sweep also trains each variant at each rate (one tune seed): its wall time grows by that
    # many runs (of this sweep's mean run time; an estimate), and the bookkeeping by the report and the tuning.
    grow = 1 + len(report.variants) * len(RATES) / max(len(report.runs), 1)
    tuned = span + (grow - 1) * summed
    print(f"with tune.lr ({len(RATES)} rates, estimated {tuned:.0f} s): report + tuning orchestration "
          f"{report_s + tune_s:.2f} s = {100 * (report_s + tune_s) / max(tuned, 1e-9):.2f}% (target < 5%)")  # fmt: skip
    if args.sweep_cpu_s:
        print(f"CPU: the report {100 * report_cpu / args.sweep_cpu_s:.2f}% of the sweep's; with tune.lr, report + "
              f"tuning {100 * (report_cpu + tune_cpu) / (grow * args.sweep_cpu_s):.2f}% (target < 5%)")  # fmt: skip
    print(json.dumps({"report_s": report_s, "tune_s": tune_s, "sweep_s": span, "tuned_sweep_s": tuned}))


if __name__ == "__main__":
    main()
