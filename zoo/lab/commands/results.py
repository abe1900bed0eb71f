"""``zoo-results DIR...``: every sweep's comparisons under the folders given, in one table
(zoo/lab/reports/results.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from zoo.lab.files import write_atomic


def main(argv: Sequence[str] | None = None) -> None:
    """``zoo-results DIR...``: one row per comparison (variant against baseline) of every sweep under the folders,
    with its verdict, gates, sweep folder, command, zoo version and date; disagreeing verdicts flagged."""
    parser = argparse.ArgumentParser(prog="zoo-results", description=main.__doc__)
    parser.add_argument("dirs", type=Path, nargs="+", metavar="DIR", help="folders holding sweep folders (report.csv)")
    parser.add_argument("--format", choices=("markdown", "csv"), default="markdown", help="the table's format")
    parser.add_argument("--out", type=Path, help="write the table to this file (default: print it)")
    args = parser.parse_args(argv)
    from zoo.lab.reports.results import gather, markdown, to_csv

    missing = [str(d) for d in args.dirs if not d.exists()]
    if missing:
        parser.exit(1, f"zoo-results: no such folder: {', '.join(missing)}\n")
    results = gather(args.dirs)
    text = markdown(results) if args.format == "markdown" else to_csv(results)
    if args.out is not None:
        write_atomic(args.out, text)
        print(f"zoo-results: {len(results.rows)} comparisons written to {args.out}")
    else:
        print(text, end="")
    for problem in results.problems:
        print(f"zoo-results: left out: {problem}", file=sys.stderr)
    if results.problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
