"""How long the contract takes: one part pairwise and full, the whole suite, and the whole split into
shards (the slowest shard against the whole is what a CI matrix of N jobs waits for).

Each run is a fresh ``python -m zoo.testing`` process (``zoo-contract``), timed from start to exit, so
a shard's start-up (Python, torch, the registry) counts as it would in a CI job. Runs one after the
other, in one session, on whatever zoo and plugins this interpreter has installed.

    python benchmarks/contract.py --part norm=dyt --shards 4           # the figures in docs/testing.md
    python benchmarks/contract.py --part attn=mla+qrank --within attn=mla+qrank --shards 2 --no-part-full  # quick
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time


def timed(*args: str) -> tuple[float, int, str]:
    """Wall seconds, the combination count and the summary line of one ``zoo-contract`` run."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "zoo.testing", *args], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    summary = next((line for line in done.stdout.splitlines() if line.startswith("contract (")), "")
    if done.returncode != 0 or not summary:
        sys.exit(f"zoo-contract {' '.join(args)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds, int(re.search(r": (\d+) combinations", summary).group(1)), summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", default="norm=rmsnorm", help="the part timed alone (default norm=rmsnorm)")
    parser.add_argument("--shards", type=int, default=4, help="shards of the whole (default 4)")
    parser.add_argument("--coverage", choices=("full", "pairwise"), default="full", help="of the whole and its shards")
    parser.add_argument("--workers", type=int, default=1, help="-n of every run (default 1)")
    parser.add_argument("--no-part-full", action="store_true", help="skip the part's full run")
    parser.add_argument("--within", action="append", default=[], metavar="AXIS=NAME",
                        help="the whole and its shards over the combinations with this part only (repeat for "
                        "several: those with any of them), e.g. what one plugin's CI jobs run")  # fmt: skip
    args = parser.parse_args()
    if args.shards < 1 or args.workers < 1:
        parser.error(f"--shards={args.shards} and --workers={args.workers} must be at least 1")
    n = ["-n", str(args.workers)]
    rows = [(f"{args.part} pairwise", *timed(args.part, "--coverage", "pairwise", *n)[:2])]
    if not args.no_part_full:
        rows.append((f"{args.part} full", *timed(args.part, *n)[:2]))
    whole_args = [*args.within, "--coverage", args.coverage, *n]  # every combination, or those of --within
    whole = timed(*whole_args)
    rows.append((f"{' or '.join(args.within) or 'every part'}, {args.coverage}", *whole[:2]))
    count = args.shards
    shards = [timed(*whole_args, "--shard", f"{i}/{count}") for i in range(1, count + 1)]
    rows += [(f"shard {i}/{args.shards}", s, c) for i, (s, c, _) in enumerate(shards, 1)]
    print(f"zoo-contract, one process after another, -n {args.workers}, OMP_NUM_THREADS=1\n")
    print("| run | combinations | wall s |\n|---|---:|---:|")
    for name, seconds, count in rows:
        print(f"| {name} | {count:,} | {seconds:.1f} |")
    slowest = max(s for s, _, _ in shards)
    assert sum(c for _, c, _ in shards) == whole[1], "the shards do not add up to the whole"
    print(f"\nslowest shard / whole: {slowest / whole[0]:.2f} (ideal 1/{args.shards} = {1 / args.shards:.2f})")


if __name__ == "__main__":
    main()
