"""The picture of a ladder's verdicts in docs/sweeps.md#ladders: a planted ladder shaped like sweeps/ladder.yaml
(zoo/lab/studies/ladder/planted.py), answered and drawn as ``zoo-report`` draws ladder.png
(zoo/lab/reports/ladder.py).

    python benchmarks/ladder_picture.py                       # writes docs/images/ladder-verdicts.png

x = C / C0: the baseline ``3.0 + 0.5 x^-0.3``; a 2x compute shift (``better``); a variant that crosses the
baseline at C0 (``3.0 + 0.5 x^-0.6``: ``scale-dependent``, its crossing marked); one below every loss the
baseline reaches (``2.0 + 0.5 x^-0.3``: ``not reached``, its measured bound marked).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from zoo.lab.reports.ladder import plot_ladder
from zoo.lab.studies.ladder.planted import C0, answers, base_law, shifted
from zoo.lab.studies.ladder.study import LAW_DRAWS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/images/ladder-verdicts.png")
    args = parser.parse_args()
    laws = {"baseline": base_law, "shift-2x": shifted(2.0), "crossing": lambda x: 3.0 + 0.5 * x**-0.6,
            "below": lambda x: 2.0 + 0.5 * x**-0.3}  # fmt: skip
    study = answers(laws, np.random.default_rng(0), law=LAW_DRAWS)
    for key, row in study.rows.items():
        if row.answer is not None:
            a = row.answer
            print(f"{key[0]:<10} {a.verdict:<16} multiplier {a.multiplier:.3g} [{a.low:.3g}, {a.high:.3g}] "
                  f"bound {a.data_lower_bound:.3g} crossing {a.crossing_compute / C0:.3g} C0 law {a.law.verdict}")
    out = Path(args.out)
    plot_ladder(SimpleNamespace(ladder=study, root=Path("synthetic")), out)  # type: ignore[arg-type]
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
