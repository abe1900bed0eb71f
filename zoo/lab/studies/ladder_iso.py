"""A ladder's primary answer, which needs no law: the iso-loss multiplier of a variant against the baseline.

Each curve is its compute-optimal envelope (the (width, budget) cells, averaged over the seeds, that reach a
lower loss than every cell of less cost). The cost to reach a loss L, ``C(L)``, is read on an envelope by
interpolation in log C against log L (monotone: the envelope's loss falls as its cost grows), so only a loss
both envelopes reach gives a number: the **iso-loss multiplier** ``C_baseline(L) / C_variant(L)`` at the lowest
loss both reach, and at the middle (in log L) of the range both reach. It depends on no law, and on no other
variant of the sweep. The same reading on the runs' training time instead of their FLOPs gives the multiplier
in wall time.

The interval is a two-level bootstrap (:func:`resample`): the seeds are drawn with replacement (the same draw
for the variant and the baseline: a seed's runs share its data order), then, within each drawn seed, its runs'
own noise (what neither the cell nor the seed explains) is drawn with replacement from that seed's runs; the
envelopes and the answer are recomputed on every draw, and the interval is the draws' 2.5 and 97.5 percentiles
(:data:`DRAWS` draws from a fixed seed: the same report every time). The paired loss difference at equal cost,
``L_variant(C) - L_baseline(C)``, read on the same draws at :data:`POINTS` costs spanning the range both
trained, says whether the answer holds at every scale trained (:class:`Pair`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Bootstrap draws, and the seed they are drawn from (deterministic).
DRAWS = 1000
BOOT_SEED = 0
#: Costs (log-spaced over the range both curves trained) where the paired loss difference is read.
POINTS = 9
#: The interval's confidence (zoo.lab.studies.stats.CONFIDENCE).
CONFIDENCE = 0.95


@dataclass
class Grid:
    """A curve's runs as arrays: ``loss[replicate, cell]`` (nan: not run) and each cell's mean ``cost``."""

    replicates: list[Any]
    cells: list[tuple[int, int]]  # (width, budget)
    cost: np.ndarray
    loss: np.ndarray


def front(cost: np.ndarray, loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The envelope of cells (``cost``, ``loss``: 1-D, nan skipped): by cost, each loss below every cheaper one."""
    ok = np.isfinite(loss) & np.isfinite(cost) & (cost > 0)
    order = np.lexsort((loss[ok], cost[ok]))
    c, y = cost[ok][order], loss[ok][order]
    if not len(y):
        return c, y
    before = np.concatenate([[np.inf], np.minimum.accumulate(y)[:-1]])
    keep = y < before
    return c[keep], y[keep]


def cost_at(env: tuple[np.ndarray, np.ndarray], loss: float) -> float:
    """The cost at which the envelope reaches ``loss`` (log-log interpolation; nan outside its range)."""
    c, y = env
    if not len(y) or not y[-1] <= loss <= y[0]:
        return math.nan
    return float(np.exp(np.interp(math.log(loss), np.log(y[::-1]), np.log(c[::-1]))))


def loss_at(env: tuple[np.ndarray, np.ndarray], costs: np.ndarray) -> np.ndarray:
    """The envelope's loss at each of ``costs`` (log-log interpolation; nan outside the costs it trained)."""
    c, y = env
    if not len(c):
        return np.full(len(costs), math.nan)
    out = np.exp(np.interp(np.log(costs), np.log(c), np.log(y)))
    return np.where((costs >= c[0] * (1 - 1e-12)) & (costs <= c[-1] * (1 + 1e-12)), out, math.nan)


def shared_losses(base: tuple[np.ndarray, np.ndarray], var: tuple[np.ndarray, np.ndarray]) -> tuple[float, float]:
    """(the lowest loss both envelopes reach, the highest); the first above the second when they do not meet."""
    if not len(base[1]) or not len(var[1]):
        return math.nan, math.nan
    return max(base[1][-1], var[1][-1]), min(base[1][0], var[1][0])


def iso_multipliers(base: tuple[np.ndarray, np.ndarray], var: tuple[np.ndarray, np.ndarray]) -> tuple[float, float]:
    """``C_baseline(L) / C_variant(L)`` at the lowest loss both reach and at the range's middle (nan: none)."""
    low, high = shared_losses(base, var)
    if not low <= high:
        return math.nan, math.nan
    mid = math.sqrt(low * high)
    return cost_at(base, low) / cost_at(var, low), cost_at(base, mid) / cost_at(var, mid)


def cost_points(base: Grid, var: Grid) -> np.ndarray:
    """:data:`POINTS` costs, log-spaced over the range both curves trained (empty when they do not overlap)."""
    low, high = max(np.nanmin(base.cost), np.nanmin(var.cost)), min(np.nanmax(base.cost), np.nanmax(var.cost))
    return np.geomspace(low, high, POINTS) if low < high else np.array([])


def resample(loss: np.ndarray, seeds: np.ndarray, swap: np.ndarray) -> np.ndarray:
    """Two-level draws of ``loss[replicate, cell]``, one per row of ``seeds[draw, n]``: the drawn seeds' runs,
    each with its own noise (the residual after the cell's and the seed's means) swapped for that of the
    same seed's run at cell ``swap[draw, n, cell]``; returned as the cells' means over the drawn seeds,
    ``[draw, cell]``. The same ``seeds`` and ``swap`` for both curves of a pair keep it paired."""
    with np.errstate(all="ignore"):
        cell = np.nanmean(loss, axis=0)
        offset = np.nanmean(loss - cell, axis=1, keepdims=True)
    residual = np.nan_to_num(loss - cell - offset)
    picked, own = loss[seeds], residual[seeds]  # [draw, n, cell]
    noise = np.take_along_axis(own, swap, axis=2) - own
    with np.errstate(all="ignore"):
        return np.nanmean(picked + noise, axis=1)


def log_interval(draws: np.ndarray, seeds: int) -> tuple[float, float]:
    """The draws' central :data:`CONFIDENCE` interval of a multiplier: percentiles of its log, their distances
    from the draws' median widened by sqrt(n / (n - 1)) for n ``seeds`` (a bootstrap over n seeds spreads its
    draws (n - 1) / n as far as the seeds do); nan when fewer than half the draws have one."""
    ok = draws[np.isfinite(draws) & (draws > 0)]
    if len(ok) < 0.5 * len(draws) or not len(ok) or seeds < 2:
        return math.nan, math.nan
    tail = 50 * (1 - CONFIDENCE)
    low, center, high = np.percentile(np.log(ok), [tail, 50, 100 - tail])
    widen = math.sqrt(seeds / (seeds - 1))
    return float(math.exp(center - widen * (center - low))), float(math.exp(center + widen * (high - center)))


@dataclass
class Pair:
    """The variant against the baseline on one cost (FLOPs or seconds): point answers on the seed means and
    their bootstrap draws (nan where a draw's envelopes do not meet)."""

    base: tuple[np.ndarray, np.ndarray]
    var: tuple[np.ndarray, np.ndarray]
    low: float  # the iso-loss multiplier at the lowest loss both reach
    mid: float  # ... at the middle of the range both reach
    losses: tuple[float, float]  # that range: (lowest, highest)
    points: np.ndarray  # costs where the paired difference is read
    difference: np.ndarray  # L_variant - L_baseline at ``points`` (seed means)
    draws_low: np.ndarray = field(default_factory=lambda: np.array([]))
    draws_mid: np.ndarray = field(default_factory=lambda: np.array([]))
    draws_difference: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    seeds: int = 0  # the replicates both curves ran

    def interval(self, draws: np.ndarray) -> tuple[float, float]:
        """:func:`log_interval` of ``draws`` over this pair's seeds."""
        return log_interval(draws, self.seeds)

    def difference_interval(self) -> tuple[np.ndarray, np.ndarray]:
        """Per cost point, the draws' central interval of the paired loss difference."""
        tail = 50 * (1 - CONFIDENCE)
        with np.errstate(all="ignore"):
            return tuple(np.nanpercentile(self.draws_difference, [tail, 100 - tail], axis=0))  # type: ignore[return-value]


def aligned(grid: Grid, cells: list[tuple[int, int]]) -> Grid:
    """``grid`` on ``cells`` (its own and more: nan where it has none)."""
    at = [grid.cells.index(c) if c in grid.cells else -1 for c in cells]
    cost = np.array([grid.cost[i] if i >= 0 else math.nan for i in at])
    loss = np.stack([grid.loss[:, i] if i >= 0 else np.full(len(grid.replicates), math.nan) for i in at], axis=1)
    return Grid(grid.replicates, cells, cost, loss)


def paired_rows(base: Grid, var: Grid) -> tuple[np.ndarray, np.ndarray]:
    """The two curves' ``loss`` rows of the replicates both ran, in the same order (the pairing); the grids'
    cells the same (:func:`aligned`)."""
    shared = [r for r in base.replicates if r in var.replicates]
    return (base.loss[[base.replicates.index(r) for r in shared]],
            var.loss[[var.replicates.index(r) for r in shared]])  # fmt: skip


def answer(base_cost: np.ndarray, var_cost: np.ndarray, base_loss: np.ndarray, var_loss: np.ndarray,
           points: np.ndarray) -> tuple[float, float, np.ndarray, tuple[Any, Any]]:  # fmt: skip
    """The multipliers (lowest shared loss, middle), the paired differences at ``points`` and the envelopes."""
    b, v = front(base_cost, base_loss), front(var_cost, var_loss)
    low, mid = iso_multipliers(b, v)
    diff = loss_at(v, points) - loss_at(b, points)
    return low, mid, diff, (b, v)


def compare_grids(base: Grid, var: Grid, draws: int = DRAWS) -> Pair:
    """The variant's iso-loss answer against the baseline's, with ``draws`` paired two-level bootstrap draws."""
    cells = sorted(set(base.cells) | set(var.cells))
    base, var = aligned(base, cells), aligned(var, cells)
    b_loss, v_loss = paired_rows(base, var)
    points = cost_points(base, var)
    low, mid, diff, (b, v) = answer(base.cost, var.cost, np.nanmean(base.loss, 0), np.nanmean(var.loss, 0), points)
    n = len(b_loss)
    pair = Pair(b, v, low, mid, shared_losses(b, v), points, diff, seeds=n)
    if n < 2 or draws < 1:
        return pair
    rng = np.random.default_rng(BOOT_SEED)
    seeds = rng.integers(0, n, size=(draws, n))  # the same seeds for both curves: the pairing
    swap = rng.integers(0, b_loss.shape[1], size=(draws, n, b_loss.shape[1]))
    b_draws, v_draws = resample(b_loss, seeds, swap), resample(v_loss, seeds, swap)
    lows, mids, diffs = np.full(draws, math.nan), np.full(draws, math.nan), np.full((draws, len(points)), math.nan)
    for i in range(draws):
        lows[i], mids[i], diffs[i], _ = answer(base.cost, var.cost, b_draws[i], v_draws[i], points)
    pair.draws_low, pair.draws_mid, pair.draws_difference = lows, mids, diffs
    return pair


def seed_multipliers(base: Grid, var: Grid) -> list[float]:
    """Each replicate's own multiplier at the lowest loss its two envelopes reach (nan where they do not meet)."""
    cells = sorted(set(base.cells) | set(var.cells))
    base, var = aligned(base, cells), aligned(var, cells)
    b_loss, v_loss = paired_rows(base, var)
    return [iso_multipliers(front(base.cost, b), front(var.cost, v))[0] for b, v in zip(b_loss, v_loss, strict=True)]
