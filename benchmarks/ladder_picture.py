"""The picture of a ladder's verdicts in docs/sweeps.md#ladders: a synthetic ladder drawn from known laws of
compute, answered and drawn as ``zoo-report`` draws ladder.png (zoo/lab/reports/ladder.py).

    python benchmarks/ladder_picture.py                       # writes docs/images/ladder-verdicts.png

Five widths x four budgets x five seeds at the noise results section 13 measured (a seed's offset sd 0.01, a
run's own sd 0.012), x = C / C0: the baseline ``3.0 + 0.5 x^-0.3``; a 2x compute shift (``better``); a
variant that crosses the baseline at C0 (``3.0 + 0.5 x^-0.6``: ``scale-dependent``, its crossing marked);
one below every loss the baseline reaches (``2.0 + 0.5 x^-0.3``: ``not reached``, its measured bound marked).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from zoo.lab.reports.ladder import plot_ladder
from zoo.lab.studies.ladder import Cell, LadderStudy, answer_all

WIDTHS, BUDGETS, SEEDS = (32, 48, 64, 96, 128), (250, 500, 1000, 2000), 5


def flops(width: int, steps: int) -> float:
    return 6 * 12 * width * width * steps * 1536.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/images/ladder-verdicts.png")
    args = parser.parse_args()
    c0 = math.exp(np.mean([math.log(flops(w, s)) for w in WIDTHS for s in BUDGETS]))
    laws = {"baseline": lambda x: 3.0 + 0.5 * x**-0.3, "shift-2x": lambda x: 3.0 + 0.5 * (2 * x) ** -0.3,
            "crossing": lambda x: 3.0 + 0.5 * x**-0.6, "below": lambda x: 2.0 + 0.5 * x**-0.3}  # fmt: skip
    rng = np.random.default_rng(0)
    per = {}
    for name, law in laws.items():
        offsets = rng.normal(0, 0.01, SEEDS)
        per[(name,)] = {s: [Cell(w, b, flops(w, b), law(flops(w, b) / c0) + offsets[s] + rng.normal(0, 0.012))
                            for w in WIDTHS for b in BUDGETS] for s in range(SEEDS)}  # fmt: skip
    study = answer_all(LadderStudy("val_bpb", ["variant"], ("baseline",), 10.0), per)
    for key, row in study.rows.items():
        if row.answer is not None:
            a = row.answer
            print(f"{key[0]:<10} {a.verdict:<16} multiplier {a.multiplier:.3g} [{a.low:.3g}, {a.high:.3g}] "
                  f"bound {a.data_lower_bound:.3g} crossing {a.crossing_compute / c0:.3g} C0 law {a.law.verdict}")
    out = Path(args.out)
    plot_ladder(SimpleNamespace(ladder=study, root=Path("synthetic")), out)  # type: ignore[arg-type]
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
