"""``zoo-contract``: the block contract for named parts (or every installed part), against every
combination of every installed part, built-in and plugin; one line per failing combination and
property, a summary, and a non-zero exit on any failure."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import TYPE_CHECKING

from zoo.core.errors import ConfigError

if TYPE_CHECKING:
    from zoo.testing.run import Outcome

EPILOG = """examples:
  zoo-contract norm=dyt                          # every combination with dyt (and its variants)
  zoo-contract norm=dyt --coverage pairwise      # each pair of other parts meets dyt once: for a pull request
  zoo-contract --shard 2/4 -n 2                  # every installed part, the second of four shards, 2 processes
exit status: 0 when every combination passed (or failed only where a part declares it), 1 on any failure,
2 on a bad argument"""


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="zoo-contract", description=__doc__, epilog=EPILOG, formatter_class=argparse.RawTextHelpFormatter
    )
    made.add_argument("parts", nargs="*", metavar="AXIS=NAME", help="the parts to check (default: every part)")
    made.add_argument("--coverage", choices=("full", "pairwise"), default="full",
                      help="full: every combination; pairwise: a covering set (default: full)")  # fmt: skip
    made.add_argument("--shard", default="1/1", metavar="I/N", help="run shard I of N (default: 1/1, all)")
    made.add_argument("-n", "--workers", type=int, default=1, metavar="WORKERS", help="processes (default: 1)")
    made.add_argument("-v", "--verbose", action="store_true", help="one line per combination, with its outcome")
    return made


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``zoo-contract``."""
    args = parser().parse_args(argv)
    from zoo.testing.combos import parse_part, parse_shard, select, shard  # torch: once the arguments are read
    from zoo.testing.run import summary

    try:
        parts = [parse_part(option) for option in args.parts]
        index, count = parse_shard(args.shard)
        if args.workers < 1:
            raise ConfigError("-n", args.workers, "at least 1")
        combos = shard(select(args.coverage, parts), index, count)
    except ConfigError as error:
        print(f"zoo-contract: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"zoo-contract: {len(combos)} combinations{scope(parts, args.coverage, args.shard)}", flush=True)
    start, outcomes = time.perf_counter(), []
    for outcome in run(combos, args.workers):
        outcomes.append(outcome)
        lines = outcome.lines() or ([f"{outcome.status.upper()} {outcome.id}"] if args.verbose else [])
        for line in lines:
            print(line, flush=True)
    for line in summary(outcomes, scope(parts, args.coverage, args.shard)):
        print(line)
    print(f"{time.perf_counter() - start:.1f} s, {args.workers} process{'es' if args.workers > 1 else ''}")
    sys.exit(1 if any(o.status == "failed" for o in outcomes) else 0)


def scope(parts: list[tuple[str, str]], coverage: str, shard_text: str) -> str:
    """`` (norm=dyt, full, shard 1/4)``: what a run covers."""
    named = ", ".join(f"{axis}={name}" for axis, name in parts) or "every part"
    return f" ({named}, {coverage}" + ("" if shard_text == "1/1" else f", shard {shard_text}") + ")"


def run(combos: list[dict[str, str]], workers: int) -> Iterator[Outcome]:
    """Every combination's outcome, in order: in this process, or in ``workers`` fresh ones (spawned,
    so each imports the installed plugins itself), each with one torch thread."""
    from zoo.testing.run import check

    one_thread()
    if workers == 1:
        yield from map(check, combos)
        return
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=one_thread) as pool:
        yield from pool.map(check, combos, chunksize=max(1, min(8, len(combos) // (4 * workers))))


def one_thread() -> None:
    """One torch thread per process: the contract is many tiny operations."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
