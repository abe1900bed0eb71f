"""Synthetic ladders with known answers, shaped like sweeps/ladder.yaml, and the planted cases a ladder's
verdicts are held to (tests/test_ladder_rates.py, ``python benchmarks/ladder_rates.py``).

A planted ladder has sweeps/ladder.yaml's 5 widths (16-64, each at its FLOPs per token) x 3 budgets (80, 240,
896 steps of 24 x 64 tokens) x 5 seeds, 110x in compute; each run's loss is a known law of its compute (or of
its width and budget) plus its seed's offset and its own noise, at the noise results section 13 measured
(:data:`SEED_SD`, :data:`RUN_SD` per budget), and its time its FLOPs at a fixed speed, times its own log-normal
noise.
Each :class:`Case` says what a right answer is on one draw; :func:`rate` counts them over many draws."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from zoo.lab.studies.ladder import iso
from zoo.lab.studies.ladder.study import LOW_READ, MID_READ, Answer, Cell, LadderStudy, answer_all
from zoo.lab.studies.stats import BETTER, NOISE

#: sweeps/ladder.yaml's widths with each one's training FLOPs per token (summary.json's flops_per_token: 2
#: layers, 4 heads, bytes); its budgets and seeds.
FLOPS_PER_TOKEN = {16: 76416, 24: 142272, 32: 226560, 48: 450432, 64: 748032}
WIDTHS = tuple(FLOPS_PER_TOKEN)
BUDGETS = (80, 240, 896)
SEEDS = 5
TOKENS_PER_STEP = 24 * 64
#: A seed's offset and a run's own noise per budget (bits per byte), as results section 13's first ladder
#: measured them (its report's noise line).
SEED_SD, RUN_SD = 0.017, {80: 0.072, 240: 0.045, 896: 0.028}
#: A run's own timing noise, sd of log seconds, on cores other work shares (section 13's first ladder: 0.21).
TIME_SD = 0.3

Law = Callable[[float], float]


def flops(width: int, steps: int) -> float:
    return float(FLOPS_PER_TOKEN[width] * steps * TOKENS_PER_STEP)


C0 = math.exp(float(np.mean([math.log(flops(w, s)) for w in WIDTHS for s in BUDGETS])))
LARGEST = max(flops(w, s) for w in WIDTHS for s in BUDGETS)


def base_law(x: float) -> float:
    """The baseline: loss against compute x = C / C0."""
    return 3.0 + 0.5 * x**-0.3


def shifted(factor: float) -> Law:
    """The baseline worth ``factor`` x its compute: a pure compute shift."""
    return lambda x: base_law(factor * x)


def crossing_above(x: float) -> float:
    """Better than the baseline at small compute, equal at 1.2x the largest compute trained (just above the
    range), worse beyond: 3.5x at mid-range, little at the lowest loss both reach."""
    cross = 1.2 * LARGEST / C0
    return 3.0 + 0.5 * cross**-0.3 * (x / cross) ** -0.18


def plateau(width: int, steps: int) -> float:
    """The baseline, but its widest rung gains nothing: width 64 reaches width 48's loss at each budget."""
    return base_law(flops(min(width, 48), steps) / C0)


def draw(law: Law | None, rng: np.random.Generator, seeds: int = SEEDS, seconds_per_flop: float = 1e-9,
         time_sd: float = 0.0, loss: Callable[[int, int], float] | None = None) -> dict[int, list[Cell]]:  # fmt: skip
    """A variant's cells per seed: ``law(C / C0)`` (or ``loss(width, steps)``) plus the seed's offset and each
    run's own noise; each run's time its FLOPs at ``seconds_per_flop``, times exp of its own noise of sd
    ``time_sd``."""
    offsets = rng.normal(0, SEED_SD, seeds)
    out = {}
    for s in range(seeds):
        cells = []
        for w in WIDTHS:
            for b in BUDGETS:
                c = flops(w, b)
                y = (loss(w, b) if loss else law(c / C0)) + offsets[s] + rng.normal(0, RUN_SD[b])  # type: ignore[misc]
                cells.append(Cell(w, b, c, y, c * seconds_per_flop * math.exp(rng.normal(0, time_sd))))
        out[s] = cells
    return out


def answers(variants: dict[str, Law | None], rng: np.random.Generator, draws: int = iso.DRAWS, law: int = 0,
            **cells: dict) -> LadderStudy:  # fmt: skip
    """The study of ``{name: law}`` (the first the baseline), each drawn with ``rng`` (``cells[name]``: its
    :func:`draw` options)."""
    per = {(k,): draw(f, rng, **cells.get(k, {})) for k, f in variants.items()}
    return answer_all(LadderStudy("val_bpb", ["mlp"], (next(iter(variants)),), 10.0), per, draws, law)


def truth(base: Law, var: Law, loss: float) -> float:
    """C_baseline(L) / C_variant(L) of two laws of compute, by bisection in log C."""

    def reach(f: Law) -> float:
        lo, hi = -20.0, 20.0
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(math.exp(mid)) > loss else (lo, mid)
        return math.exp(lo)

    return reach(base) / reach(var)


def noiseless(base: Callable[[int, int], float], var: Callable[[int, int], float], loss: float) -> float:
    """The multiplier at ``loss`` read on two noiseless ladders' envelopes (each ``f(width, steps)``): what the
    data give without noise, the answer where a rung off any law leaves no law to read."""
    cells = [(w, b) for w in WIDTHS for b in BUDGETS]
    costs = np.array([flops(w, b) for w, b in cells])
    fronts = [iso.front(costs, np.array([f(w, b) for w, b in cells])) for f in (base, var)]
    return iso.cost_at(fronts[0], loss) / iso.cost_at(fronts[1], loss)


def of_compute(law: Law) -> Callable[[int, int], float]:
    """A law of compute as a loss of (width, steps)."""
    return lambda w, s: law(flops(w, s) / C0)


def covers(low: float, high: float, value: float) -> bool:
    return bool(low < value < high)


def at_edge(a: Answer) -> bool:
    """Whether the multiplier lies in the outer tenth (log) of its interval at either end."""
    width = math.log(a.high / a.low)
    return min(math.log(a.multiplier / a.low), math.log(a.high / a.multiplier)) < 0.1 * width


@dataclass
class Case:
    """A planted ladder: its variants (the first the baseline; a law of compute, or None with a ``loss`` in
    ``cells``), their :func:`draw` options, what is right on one draw, and the share of draws the ladder's
    answer holds it in (``nominal``)."""

    name: str
    variants: dict[str, Law | None]
    right: Callable[[LadderStudy], bool]
    nominal: float
    claim: str
    cells: dict[str, dict] = field(default_factory=dict)
    also: tuple[str, Callable[[LadderStudy], bool]] | None = None  # a further count the benchmark shows


def answer(study: LadderStudy, name: str) -> Answer:
    found = study.rows[(name,)].answer
    assert found is not None
    return found


def floor_right(study: LadderStudy) -> bool:
    a = answer(study, "floor")
    return covers(a.low, a.high, truth(base_law, floor_law, a.read[0]))


def floor_law(x: float) -> float:
    """The baseline's curve on a floor 0.1 lower: different floors, no compute shift."""
    return 2.9 + 0.5 * x**-0.3


def above_right(study: LadderStudy) -> bool:
    """The mid-range interval covers the truth, and a mid-range interval above 1 is never hidden: the verdict
    says better, at mid-range or at both readings."""
    a = answer(study, "above")
    said = a.verdict in (BETTER, f"{BETTER} {MID_READ}, {NOISE} {LOW_READ}")
    return covers(a.mid_low, a.mid_high, truth(base_law, crossing_above, a.read[1])) and (said or a.mid_low <= 1)


def says_better_at_mid_range(study: LadderStudy) -> bool:
    return answer(study, "above").verdict in (BETTER, f"{BETTER} {MID_READ}, {NOISE} {LOW_READ}")


def plateau_right(study: LadderStudy) -> bool:
    a = answer(study, "shift")
    return covers(a.low, a.high, noiseless(plateau, of_compute(shifted(2.0)), a.read[0])) and not at_edge(a)


CASES = {
    "null": Case("null", {"base": base_law, "same": base_law}, lambda s: answer(s, "same").verdict == NOISE,
                 0.95, "a variant equal to the baseline reads within noise"),
    "shift": Case("shift", {"base": base_law, "shift": shifted(2.0)},
                  lambda s: covers(answer(s, "shift").low, answer(s, "shift").high, 2.0), 0.95,
                  "a pure 2x compute shift: its interval covers 2"),
    "family": Case("family", {"base": base_law, "a": base_law, "b": base_law, "c": base_law},
                   lambda s: all(answer(s, k).verdict == NOISE for k in "abc"), 0.95,
                   "three variants equal to the baseline: all read within noise (family-wise, Holm)"),
    "time null": Case("time null", {"base": base_law, "same": base_law},
                      lambda s: covers(answer(s, "same").time_low, answer(s, "same").time_high, 1.0), 0.95,
                      f"equal speed, timing noise sd {TIME_SD:g} (log) a run: the wall-time interval holds 1",
                      {"base": {"time_sd": TIME_SD}, "same": {"time_sd": TIME_SD}}),
    "time 2x": Case("time 2x", {"base": base_law, "fast": base_law},
                    lambda s: covers(answer(s, "fast").time_low, answer(s, "fast").time_high, 2.0), 0.95,
                    f"twice as fast, timing noise sd {TIME_SD:g} (log) a run: the wall-time interval covers 2",
                    {"base": {"time_sd": TIME_SD}, "fast": {"time_sd": TIME_SD, "seconds_per_flop": 0.5e-9}}),
    "above": Case("above", {"base": base_law, "above": crossing_above}, above_right, 0.95,
                  "better at small compute, crossing just above the range: the mid-range interval covers the "
                  "truth, and the verdict says better at mid-range whenever that interval lies above 1",
                  also=("the verdict says better at mid-range", says_better_at_mid_range)),
    "plateau": Case("plateau", {"base": None, "shift": shifted(2.0)}, plateau_right, 0.9,
                    "the baseline's widest rung gains nothing, the variant a 2x shift: the interval covers the "
                    "noiseless envelopes' answer, the estimate off its interval's edges",
                    {"base": {"loss": plateau}}),
    "floors": Case("floors", {"base": base_law, "floor": floor_law}, floor_right, 0.95,
                   "different floors: the interval covers the truth where it is read"),
}


def rate(case: Case, draws: int, seed: int = 0, bootstrap: int = iso.DRAWS) -> tuple[int, int]:
    """How many of ``draws`` planted ladders of ``case`` (drawn from ``seed``) its answer gets right, and how
    many hold its further count (``case.also``; 0 without one)."""
    rng = np.random.default_rng(seed)
    right = also = 0
    for _ in range(draws):
        study = answers(case.variants, rng, bootstrap, **case.cells)
        right += case.right(study)
        also += bool(case.also and case.also[1](study))
    return right, also
