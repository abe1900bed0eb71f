"""A scaling ladder's answer per variant: how much compute it is worth against the baseline, and what the data
identify of it.

A ladder trains every variant at several widths and budgets on several seeds (``zoo-sweep ladder``,
docs/sweeps.md#ladders). Each run is a cell: its width, budget, training FLOPs (a branch counts its source's
steps), training time (a branch's counts its source's too) and final loss. Each pair, the variant and the
baseline, is answered on its own two curves only: no other variant of the sweep moves it.

The primary answer needs no law (zoo.lab.studies.ladder.iso): the iso-loss multiplier on the two envelopes,
in FLOPs and in wall time, read near the lowest loss both reach and at mid-range, with a paired two-level
bootstrap; the two multipliers and the paired loss differences are judged in one simultaneous band
(zoo.lab.studies.ladder.band). The verdict (:func:`data_verdict`) is decided in this order, the first that
holds:

1. ``too few seeds``: fewer than :data:`MIN_PAIRS` seeds both ran;
2. ``unidentified``: the seeds disagree (their own mid-range multipliers span more than :data:`SEED_SPREAD` x), or
   most bootstrap draws' envelopes do not reach the loss read;
3. ``not reached``: the variant's envelope lies below every loss the baseline's reaches (``data_lower_bound``:
   the baseline's largest compute over the variant's smallest, which already reaches lower; measured, no
   law), or above every loss it reaches, for a worse one (``data_upper_bound``, the reverse); no multiplier;
4. ``scale-dependent``: the paired loss difference's band is below 0 at one compute trained and above at
   another (``crossing_compute``: where it changes sign), or the two multipliers' intervals lie on opposite
   sides of 1;
5. ``better`` / ``worse`` / ``within noise``: both multipliers' intervals lie above 1, below, or hold it; when
   only one holds 1, the verdict names both readings (:func:`readings_verdict`).

The verdicts other than ``within noise`` are then corrected over the ladder's variants (:func:`correct`:
Holm, on the band's p-value of each verdict's claim).

The law (zoo.lab.studies.ladder.law), secondary and labelled so, is fitted per pair under the shared floor
and under each curve's own, read at the variant's largest compute, with a held-out check; its verdict
(:func:`law_verdict`) says when it is withheld.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zoo.lab.studies.ladder import iso
from zoo.lab.studies.ladder.band import Band, band
from zoo.lab.studies.ladder.law import (
    Cell,
    HeldOut,
    LadderError,
    PowerLaw,
    envelope,
    fit_law,
    fit_laws,
    held_out,
    multiplier,
    parameters,
)
from zoo.lab.studies.ladder.noise import Noise, noise, shared_timings
from zoo.lab.studies.runset import Run
from zoo.lab.studies.stats import BETTER, CONFIDENCE, MIN_PAIRS, NOISE, TOO_FEW, WORSE, holm

__all__ = ["Cell", "LadderError", "PowerLaw", "envelope", "fit_law", "ladder_study"]

#: The fewest widths and budgets a ladder needs.
MIN_RUNGS = 3
#: Seeds whose own multipliers span more than this factor leave the answer unidentified.
SEED_SPREAD = 10.0
#: The law gives a verdict read at most this many times beyond the baseline's largest compute (further only
#: as far as the held-out check reached and passed).
LAW_REACH = 2.0
#: Bootstrap draws for the law's interval (each a refit).
LAW_DRAWS = 50
UNIDENTIFIED, NOT_REACHED, SCALE = "unidentified", "not reached", "scale-dependent"
FLOOR, WITHHELD = "floor-dependent", "withheld"
#: How a verdict names the two readings when they differ.
LOW_READ, MID_READ = "near the lowest loss", "at mid-range"


def replicate_key(run: Run) -> Any:
    """A run's replicate (what pairs it with the baseline's runs): its seed, with its data seed when set."""
    return run.seed


def ladder_cells(runs: Sequence[Run], metric: str) -> dict[Any, list[Cell]]:
    """``{replicate: its cells}`` of a variant's finished runs: width ``block.d_model``, budget ``train.steps``,
    the run's training FLOPs and time (a branch's count its source's steps) and its final ``metric``."""
    out: dict[Any, list[Cell]] = {}
    for run in runs:
        value, flops = run.record.final_value(metric), run.record.flops
        config = run.record.config or {}
        width, steps = (config.get("block") or {}).get("d_model"), (config.get("train") or {}).get("steps")
        ok = isinstance(value, (int, float)) and math.isfinite(value) and isinstance(flops, (int, float))
        seconds = run.record.train_time_s
        time = float(seconds) if isinstance(seconds, (int, float)) and seconds > 0 else math.nan
        if run.status == "ok" and ok and flops > 0 and width and steps:
            cell = Cell(int(width), int(steps), float(flops), float(value), time)
            out.setdefault(replicate_key(run), []).append(cell)
    return out


def mean_cells(per_seed: dict[Any, list[Cell]]) -> list[Cell]:
    """Each (width, budget) cell averaged over the seeds that ran it (compute, loss and time)."""
    groups: dict[tuple[int, int], list[Cell]] = {}
    for cells in per_seed.values():
        for c in cells:
            groups.setdefault((c.width, c.steps), []).append(c)
    return [Cell(w, s, statistics.fmean(c.compute for c in g), statistics.fmean(c.loss for c in g),
                 statistics.fmean(c.time for c in g)) for (w, s), g in sorted(groups.items())]  # fmt: skip


def check_rungs(per_seed: dict[Any, list[Cell]], label: str) -> None:
    """:class:`LadderError` for a variant with fewer than :data:`MIN_RUNGS` widths or budgets."""
    cells = [c for cs in per_seed.values() for c in cs]
    widths, budgets = sorted({c.width for c in cells}), sorted({c.steps for c in cells})
    for name, found in (("widths (block.d_model)", widths), ("budgets (train.steps)", budgets)):
        if len(found) < MIN_RUNGS:
            shown = ", ".join(map(str, found)) or "none"
            raise LadderError(f"{label}: {len(found)} {name} finished ({shown}); a ladder needs at least {MIN_RUNGS}")


def grid_of(per_seed: dict[Any, list[Cell]], cost: str = "compute") -> iso.Grid:
    """A variant's cells as an :class:`iso.Grid` on ``cost`` (``compute`` or ``time``: each run's own)."""
    replicates = sorted(per_seed, key=str)
    keys = sorted({(c.width, c.steps) for cs in per_seed.values() for c in cs})
    loss, costs = np.full((len(replicates), len(keys)), math.nan), np.full((len(replicates), len(keys)), math.nan)
    for i, r in enumerate(replicates):
        for c in per_seed[r]:
            loss[i, keys.index((c.width, c.steps))], costs[i, keys.index((c.width, c.steps))] = c.loss, getattr(c, cost)
    return iso.Grid(replicates, keys, costs, loss)


def is_rung_key(key: str) -> bool:
    """The keys a ladder varies within a variant: the width, the budget and the branch a budget came from."""
    return key in ("block.d_model", "train.steps") or key.startswith("train.branch.")


@dataclass
class Law:
    """The pair's law (secondary): its fit under the shared floor, the answer under each curve's own floor,
    where it is read, its held-out check and its verdict."""

    base: PowerLaw | None = None
    var: PowerLaw | None = None
    compute: float = math.nan  # where it is read: the variant's largest compute
    multiplier: float = math.nan
    low: float = math.nan
    high: float = math.nan
    own_floors: float = math.nan  # the multiplier under each curve's own floor
    far: float = math.nan  # the multiplier at LadderStudy.extrapolate x compute (no verdict)
    baseline_extrapolation: float = math.nan  # the baseline's compute it reads, over its largest trained
    predicted_difference: float = math.nan  # |log L_variant - log L_baseline| at ``compute``
    held_out: HeldOut | None = None
    verdict: str = ""


@dataclass
class Answer:
    """A variant against the baseline: the data's answer (no law) and the law's. The multipliers' and the
    paired differences' intervals are one simultaneous band (zoo.lab.studies.ladder.band); ``p_value`` is the
    band's, ``p_holm`` it corrected over the ladder's variants (Holm)."""

    multiplier: float = math.nan  # at ``read[0]``, near the lowest loss both reach
    low: float = math.nan
    high: float = math.nan
    mid: float = math.nan  # at ``read[1]``, the middle of the range both reach
    mid_low: float = math.nan
    mid_high: float = math.nan
    losses: tuple[float, float] = (math.nan, math.nan)  # the loss range both reach
    read: tuple[float, float] = (math.nan, math.nan)  # the losses the two multipliers are read at
    verdict: str = ""
    p_value: float = math.nan
    p_holm: float = math.nan
    data_lower_bound: float = math.nan
    data_upper_bound: float = math.nan
    crossing_compute: float = math.nan
    seed_spread: float = math.nan  # largest over smallest of the seeds' own multipliers
    time: float = math.nan  # the iso-loss multiplier in training time (its own 95% interval; no verdict)
    time_low: float = math.nan
    time_high: float = math.nan
    seeds: int = 0
    pair: iso.Pair | None = None
    difference_low: np.ndarray = field(default_factory=lambda: np.array([]))  # the paired differences' band
    difference_high: np.ndarray = field(default_factory=lambda: np.array([]))
    law: Law = field(default_factory=Law)


@dataclass
class LadderRow:
    """One variant on the ladder: its cells (seed means and per replicate), and its answer (None: baseline)."""

    key: tuple[str, ...]
    cells: list[Cell]
    per_seed: dict[Any, list[Cell]]
    compute: float  # the largest compute it trained (a cell's mean over seeds)
    answer: Answer | None = None


@dataclass
class LadderStudy:
    """Every variant's row, keyed by its values of ``axes`` (the sweep's axes but the rungs'), or the error."""

    metric: str
    axes: list[str]
    baseline: tuple[str, ...]
    extrapolate: float
    rows: dict[tuple[str, ...], LadderRow] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    varied: str = ""  # what the replicates varied (noise_source)
    rates: dict[tuple[str, ...], str] = field(default_factory=dict)  # rate_check, per variant
    noise: Noise = Noise(math.nan, math.nan, 0)  # the loss's, by source, pooled over the variants
    time_noise: Noise = Noise(math.nan, math.nan, 0)  # the log training time's
    timings: tuple[int, int, int] = (0, 0, 0)  # shared_timings: runs other work shared, with a load, in all


def not_reached(pair: iso.Pair) -> tuple[str, float, float]:
    """(verdict word, lower bound, upper bound) when one envelope lies wholly below the other's losses."""
    (bc, by), (vc, vy) = pair.base, pair.var
    if vy[0] < by[-1]:  # the variant's highest loss lies below the baseline's lowest
        return NOT_REACHED, float(bc[-1] / vc[0]), math.nan
    if vy[-1] > by[0]:
        return NOT_REACHED, math.nan, float(bc[0] / vc[-1])
    return "", math.nan, math.nan


def crossing(pair: iso.Pair, low: np.ndarray, high: np.ndarray) -> float:
    """The compute where the paired difference changes sign, when its band (``low``, ``high`` per cost point)
    is below 0 at one compute trained and above at another (nan: no significant change of sign)."""
    below, above = np.flatnonzero(high < 0), np.flatnonzero(low > 0)
    if not len(below) or not len(above):
        return math.nan
    d, c = pair.difference, pair.points
    a, b = sorted((below[0], above[0]) if abs(below[0] - above[0]) < abs(below[-1] - above[-1]) else
                  (below[-1], above[-1]))  # fmt: skip
    for i in range(a, b):
        if np.isfinite(d[i]) and np.isfinite(d[i + 1]) and d[i] * d[i + 1] <= 0:
            t = d[i] / (d[i] - d[i + 1]) if d[i] != d[i + 1] else 0.5
            return float(math.exp(math.log(c[i]) + t * (math.log(c[i + 1]) - math.log(c[i]))))
    return float(math.sqrt(c[a] * c[b]))


def side(low: float, high: float) -> int:
    """1 when a multiplier's interval lies above 1 (better), -1 below (worse), 0 when it holds 1."""
    return 1 if low > 1 else -1 if high < 1 else 0


def readings_verdict(low: int, mid: int) -> str:
    """The verdict of the two multipliers' sides (:func:`side`): the same side, or one of them said with the
    other, or ``scale-dependent`` when they are of opposite sides."""
    words = {1: BETTER, -1: WORSE, 0: NOISE}
    if low * mid < 0:
        return SCALE
    if low == mid:
        return words[low]
    said, other = ((low, LOW_READ), (mid, MID_READ)) if low else ((mid, MID_READ), (low, LOW_READ))
    return f"{words[said[0]]} {said[1]}, {words[other[0]]} {other[1]}"


def data_verdict(answer: Answer, pair: iso.Pair) -> None:
    """The data's verdict, in the module docstring's order, with its bounds and crossing (before Holm)."""
    if answer.seeds < MIN_PAIRS:
        answer.verdict = TOO_FEW
    elif answer.seed_spread > SEED_SPREAD:
        answer.verdict = UNIDENTIFIED
    elif (reached := not_reached(pair))[0]:
        answer.verdict, answer.data_lower_bound, answer.data_upper_bound = reached
        answer.multiplier = answer.mid = math.nan
    elif math.isfinite(cross := crossing(pair, answer.difference_low, answer.difference_high)):
        answer.verdict, answer.crossing_compute = SCALE, cross
    elif not math.isfinite(answer.low):
        answer.verdict = UNIDENTIFIED
    else:
        answer.verdict = readings_verdict(side(answer.low, answer.high), side(answer.mid_low, answer.mid_high))


def compare(base: LadderRow, row: LadderRow, draws: int = iso.DRAWS) -> Answer:
    """The data's answer for ``row`` against ``base`` (FLOPs and time), with its verdict (before Holm)."""
    b, v = grid_of(base.per_seed), grid_of(row.per_seed)
    pair = iso.compare_grids(b, v, draws)
    answer = Answer(pair.low, mid=pair.mid, losses=pair.losses, read=pair.read, seeds=pair.seeds, pair=pair)
    if pair.draws_low.size:
        with np.errstate(all="ignore"):
            readings = np.column_stack([np.log(pair.draws_low), np.log(pair.draws_mid), pair.draws_difference])
        found = band(readings, np.zeros(readings.shape[1]), pair.seeds)
        (answer.low, answer.mid_low), (answer.high, answer.mid_high) = np.exp(found.low[:2]), np.exp(found.high[:2])
        answer.difference_low, answer.difference_high = found.low[2:], found.high[2:]
        answer.p_value = claims_p(found)
    spread = [m for m in iso.seed_multipliers(b, v) if math.isfinite(m) and m > 0]
    answer.seed_spread = max(spread) / min(spread) if len(spread) >= 2 else math.nan
    bt, vt = grid_of(base.per_seed, "time"), grid_of(row.per_seed, "time")
    if all(np.isfinite(g.cost[np.isfinite(g.loss)]).all() for g in (bt, vt)):  # every run timed
        timed = iso.compare_grids(bt, vt, draws)
        answer.time, (answer.time_low, answer.time_high) = timed.low, timed.interval(timed.draws_low)
    data_verdict(answer, pair)
    if answer.verdict == NOT_REACHED:
        answer.low = answer.high = answer.mid_low = answer.mid_high = answer.time = answer.p_value = math.nan
    return answer


def claims_p(found: Band) -> float:
    """The p-value of a verdict other than ``within noise``: the smaller of a multiplier's (either of the first
    two readings out of the band) and a crossing's (the paired differences, the rest, out on both sides)."""
    tails, below = found.null_tail[2:], found.below[2:]
    with np.errstate(all="ignore"):
        sides = [np.nanmin(tails[b], initial=math.inf) for b in (below, ~below)]
    return min(found.p_value(float(np.nanmin(found.null_tail[:2], initial=math.inf))), found.p_value(max(sides)))


def correct(answers: Sequence[Answer]) -> None:
    """Holm over the answers that have a p-value: each gets ``p_holm``, and a verdict other than ``within
    noise`` whose corrected p-value is not below 1 - CONFIDENCE becomes ``within noise``."""
    tested = [a for a in answers if math.isfinite(a.p_value)]
    for a, p in zip(tested, holm([a.p_value for a in tested]), strict=True):
        a.p_holm = p
        if p >= 1 - CONFIDENCE and a.verdict not in (TOO_FEW, UNIDENTIFIED, NOT_REACHED):
            a.verdict = NOISE


def law_draws(base: LadderRow, row: LadderRow, fit: tuple[PowerLaw, PowerLaw], c0: float, at: float,
              draws: int) -> list[float]:  # fmt: skip
    """The law's multiplier at ``at`` refitted on ``draws`` paired two-level bootstrap draws."""
    b, v = grid_of(base.per_seed), grid_of(row.per_seed)
    cells = sorted(set(b.cells) | set(v.cells))
    b, v = iso.aligned(b, cells), iso.aligned(v, cells)
    b_loss, v_loss = iso.paired_rows(b, v)
    n = len(b_loss)
    if n < 2:
        return []
    rng = np.random.default_rng(iso.BOOT_SEED)
    seeds = rng.integers(0, n, size=(draws, n))
    swap = rng.integers(0, b_loss.shape[1], size=(draws, n, b_loss.shape[1]))
    b_draws, v_draws = iso.resample(b_loss, seeds, swap), iso.resample(v_loss, seeds, swap)
    out = []
    for bl, vl in zip(b_draws, v_draws, strict=True):
        cells = {k: [Cell(w, s, float(c), float(y)) for (w, s), c, y in zip(g.cells, g.mean_cost(), ys, strict=True)
                     if math.isfinite(y)] for k, g, ys in (("b", b, bl), ("v", v, vl))}  # fmt: skip
        try:
            laws = fit_laws(cells, c0, "draw", start=parameters(*fit))
        except LadderError:
            continue
        out.append(multiplier(laws["v"], laws["b"], at))
    return out


def fit_pair_law(base: LadderRow, row: LadderRow, c0: float, extrapolate: float, draws: int = LAW_DRAWS) -> Law:
    """The pair's law (shared floor, own floors, held-out check) read at the variant's largest compute."""
    law = Law(compute=row.compute)
    try:
        fits = fit_laws({"b": base.cells, "v": row.cells}, c0, "the pair")
        own = fit_law(base.cells, c0, "the baseline"), fit_law(row.cells, c0, "the variant")
    except LadderError as error:
        law.verdict = f"no fit: {error}"
        return law
    law.base, law.var, at = fits["b"], fits["v"], row.compute
    law.multiplier, law.own_floors = multiplier(law.var, law.base, at), multiplier(own[1], own[0], at)
    law.far = multiplier(law.var, law.base, at * extrapolate)
    law.baseline_extrapolation = law.base.compute_for(law.var.loss(at)) / base.compute
    law.predicted_difference = abs(math.log(law.var.loss(at) / law.base.loss(at)))
    refits = np.array(law_draws(base, row, (law.base, law.var), c0, at, draws))
    law.low, law.high = iso.log_interval(refits, len(base.per_seed)) if len(refits) else (math.nan, math.nan)
    law.held_out = held_out(base.cells, row.cells, c0, parameters(law.base, law.var))
    law.verdict = law_verdict(law)
    return law


def law_verdict(law: Law) -> str:
    """The law's verdict, the first that holds: ``floor-dependent`` (the answers under the shared floor and
    under each curve's own differ by more than the interval's half width, in log), ``withheld`` (the held-out
    error exceeds the predicted difference; or it is read beyond :data:`LAW_REACH` x the baseline's largest
    compute and beyond what the held-out check reached), else the interval's better / worse / within noise."""
    if not math.isfinite(law.low):
        return UNIDENTIFIED
    half = (math.log(law.high) - math.log(law.low)) / 2
    own = law.own_floors
    if not (math.isfinite(own) and own > 0 and abs(math.log(own) - math.log(law.multiplier)) <= half):
        return FLOOR
    held = law.held_out
    if held is None or held.error > law.predicted_difference:
        shown = "no held-out fit" if held is None else f"held-out error {held.error:.3g}"
        shown += f" > predicted difference {law.predicted_difference:.3g}" if held else ""
        return f"{WITHHELD} ({shown})"
    reach = max(LAW_REACH, held.reach)
    if not law.baseline_extrapolation <= reach:
        return f"{WITHHELD} (read {law.baseline_extrapolation:.3g}x past the baseline's largest compute)"
    return "better" if law.low > 1 else "worse" if law.high < 1 else NOISE


def noise_source(runs: Sequence[Run]) -> str:
    """What the ladder's replicates varied: the seed (initialization and data order), or one of the two."""
    seeds = {(r.record.config or {}).get("seed") for r in runs}
    data = {(r.record.config or {}).get("data_seed") for r in runs}
    if data == {None}:
        return "init and data order (seed)"
    if len(seeds) > 1 and len(data) > 1:
        return "init (seed) and data order (data_seed), each"
    return "init only (data_seed fixed)" if len(seeds) > 1 else "data order only (data_seed; seed fixed)"


def rate_check(tune_runs: Sequence[Run], axes: Sequence[str], metric: str) -> dict[tuple[str, ...], str]:
    """Per variant, the rate tuned at the longest budget against each budget's best among the tuning runs and
    their decays (``tune/budgets/``): ``"200: 6e-3 (+0.4% at the tuned 2.5e-3)"``, or ``"200: the tuned"``."""
    table: dict[tuple[str, ...], dict[int, dict[float, list[float]]]] = {}
    for run in tune_runs:
        value, config = run.record.final_value(metric), run.record.config or {}
        lr, steps = (config.get("train") or {}).get("lr"), (config.get("train") or {}).get("steps")
        if run.status == "ok" and isinstance(value, (int, float)) and math.isfinite(value) and lr and steps:
            key = tuple(run.value(a) for a in axes)
            table.setdefault(key, {}).setdefault(int(steps), {}).setdefault(float(lr), []).append(float(value))
    out = {}
    for key, budgets in table.items():
        means = {b: {lr: statistics.fmean(v) for lr, v in rates.items()} for b, rates in sorted(budgets.items())}
        longest = max(means)
        tuned = min(means[longest], key=means[longest].__getitem__)
        words = []
        for budget, rates in means.items():
            best = min(rates, key=rates.__getitem__)
            gap = f" (+{rates[tuned] / rates[best] - 1:.1%} at the tuned {tuned:g})" if tuned in rates else ""
            words.append(f"{budget}: the tuned {tuned:g}" if best == tuned else f"{budget}: {best:g}{gap}")
        out[key] = "; ".join(words)
    return out


def group_cells(study: LadderStudy, runs: Sequence[Run]) -> dict[tuple[str, ...], dict[Any, list[Cell]]]:
    """Each variant's cells per replicate; a variant too small for a ladder is named and left out."""
    groups: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        groups.setdefault(tuple(run.value(a) for a in study.axes), []).append(run)
    out = {}
    for key, group in groups.items():
        label = " ".join(f"{a}={v}" for a, v in zip(study.axes, key, strict=True)) or "the ladder"
        try:
            cells = ladder_cells(group, study.metric)
            check_rungs(cells, label)
            out[key] = cells
        except LadderError as error:
            study.errors.append(str(error))
    return out


def ladder_study(
    runs: Sequence[Run], axes: Sequence[str], baseline: dict[str, str], metric: str, mode: str, test: str,
    extrapolate: float = 10.0, draws: int = iso.DRAWS, law: int = LAW_DRAWS, tune_runs: Sequence[Run] = (),
) -> LadderStudy:  # fmt: skip
    """Every variant against the ``baseline`` variant (its values of ``axes`` less the rungs' keys) on
    ``metric``: the data's answer and the pair's law (:func:`answer_all`). ``test`` is not used: a ladder's interval
    is its bootstrap's (zoo.lab.studies.ladder.iso). ``tune_runs``: the tuning sweep's runs and their decays,
    for :func:`rate_check`."""
    variant_axes = [a for a in axes if not is_rung_key(a)]
    base_key = tuple(baseline.get(a, "") for a in variant_axes)
    study = LadderStudy(metric, variant_axes, base_key, extrapolate, varied=noise_source(runs),
                        timings=shared_timings(runs))  # fmt: skip
    if mode != "min":
        study.errors.append(f"{metric}: a ladder fits a loss (lower is better), not a {mode}-is-better metric")
        return study
    study.rates = rate_check(tune_runs, variant_axes, metric)
    return answer_all(study, group_cells(study, runs), draws, law)


def answer_all(study: LadderStudy, per_variant: dict[tuple[str, ...], dict[Any, list[Cell]]], draws: int = iso.DRAWS,
               law: int = LAW_DRAWS) -> LadderStudy:  # fmt: skip
    """``study``'s rows from each variant's cells per replicate, each answered against the baseline's (``draws``
    bootstrap draws) and, unless ``law`` is 0, by the pair's law (``law`` refits for its interval)."""
    for key, per_seed in per_variant.items():
        cells = mean_cells(per_seed)
        study.rows[key] = LadderRow(key, cells, per_seed, max(c.compute for c in cells))
    study.noise = noise(grid_of(p) for p in per_variant.values())
    with np.errstate(all="ignore"):
        study.time_noise = noise((grid_of(p, "time") for p in per_variant.values()), log_cost=True)
    base = study.rows.get(study.baseline)
    if base is None:
        study.errors.append("the baseline variant has no ladder: no multiplier is given")
        return study
    for key, row in study.rows.items():
        if key != study.baseline:
            row.answer = compare(base, row, draws)
            if law:
                c0 = math.exp(statistics.fmean(math.log(c.compute) for c in [*base.cells, *row.cells]))
                row.answer.law = fit_pair_law(base, row, c0, study.extrapolate, law)
    correct([row.answer for row in study.rows.values() if row.answer is not None])
    return study
