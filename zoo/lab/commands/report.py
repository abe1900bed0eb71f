"""``zoo-report DIR``: print a sweep's table, and write its report.md, CSVs and plots beside its runs."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Sequence
from pathlib import Path

from zoo.core.errors import ConfigError
from zoo.lab.planning.gates import gate_options
from zoo.lab.planning.options import CORRECTIONS, TESTS, report_interaction, report_options, target_options
from zoo.lab.records.lock import report_lock


def main(argv: Sequence[str] | None = None) -> None:
    """``zoo-report DIR``: print a sweep's table; write report.md, report.csv, runs.csv and PNG plots."""
    parser = argparse.ArgumentParser(prog="zoo-report", description=main.__doc__)
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
    parser.add_argument("--interaction", metavar="AXIS,AXIS",
                        help="an interaction to state beyond a two-axis sweep's own (report.interaction): two "
                        "swept axes, refused otherwise before anything is written")  # fmt: skip
    parser.add_argument("--gates", metavar="GATE[,GATE]",
                        help="pass/fail rules per variant (report.gates; default: the runs' own), written to report.md "
                        "and gates.json")  # fmt: skip
    parser.add_argument("--target", type=float, help="report.target: when each variant reaches this value of "
                        "the metric, and the pass rule (default: the runs' report.target)")  # fmt: skip
    parser.add_argument("--margin", type=float, help="report.margin: the pass rule's margin (default 0)")
    parser.add_argument("--target-ema", type=float, help="report.target_ema: read the curve through an EMA (default 0)")
    args = parser.parse_args(argv)
    from zoo.lab.reports.report import write_built, written  # the studies and plots: once the arguments are read
    from zoo.lab.reports.table import relative_to
    from zoo.lab.studies.variants import build_report

    try:
        baseline = report_options({"baseline": args.baseline})[0] if args.baseline else None
        named = report_interaction(args.interaction)  # its axes: against the swept ones (build_report)
        gate_options(args.gates)  # refused before anything is written
        target = target_options({"target": args.target, "margin": args.margin, "target_ema": args.target_ema})
        with report_lock(args.dir) if args.dir.is_dir() else contextlib.nullcontext():  # not beside a sweep's own
            report = build_report(args.dir, baseline=baseline, correction=args.correction, test=args.test,
                                  interaction=named, target=target)  # fmt: skip
            print(write_built(report, plots=not args.no_plots, gates=args.gates), end="")
    except (FileNotFoundError, ConfigError) as error:
        parser.exit(1, f"zoo-report: {error}\n")
    print(f"\nwritten: {', '.join(str(p) for p in written(args.dir, not args.no_plots))}")
    if report.dropped:  # the report is written; the status says it is missing runs
        lines = "".join(f"\n  {relative_to(d.path, report.root)}: {d.reason}" for d in report.dropped)
        parser.exit(1, f"zoo-report: {len(report.dropped)} run folder(s) not read, left out of the report:{lines}\n")


if __name__ == "__main__":
    main()
