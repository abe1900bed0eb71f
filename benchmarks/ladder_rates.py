"""The ladder's error rates on planted ladders with known answers (zoo/lab/studies/ladder/planted.py: shaped
like sweeps/ladder.yaml, at the noise results section 13 measured), the figures docs/sweeps.md#ladders quotes.

    python benchmarks/ladder_rates.py                 # 400 draws a case, each answered with 1000 bootstrap draws
    python benchmarks/ladder_rates.py --draws 40 --case null

For each case: how many draws its answer got right, the rate and its 95% interval (Clopper-Pearson), against
the rate the ladder holds it to.
"""

from __future__ import annotations

import argparse

from scipy import stats

from zoo.lab.studies.ladder.planted import CASES, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=400, help="planted ladders a case")
    parser.add_argument("--case", choices=sorted(CASES), action="append", help="a case (default: all)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for name in args.case or CASES:
        case = CASES[name]
        right, also = rate(case, args.draws, args.seed)
        ci = stats.binomtest(right, args.draws).proportion_ci(0.95)
        print(f"{name:<10} {right:>4} of {args.draws} right ({right / args.draws:.1%}, 95% CI {ci.low:.1%}-"
              f"{ci.high:.1%}; held to {case.nominal:.0%}): {case.claim}", flush=True)
        if case.also:
            print(f"{'':<10} {also:>4} of {args.draws}: {case.also[0]}", flush=True)


if __name__ == "__main__":
    main()
