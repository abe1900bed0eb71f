"""A ladder's primary answer, which needs no law: the iso-loss multiplier of a variant against the baseline.

Each curve is its compute-optimal envelope (the (width, budget) cells, averaged over the seeds, that reach a
lower loss than every cell of less cost). The cost to reach a loss L, ``C(L)``, is read on an envelope by
interpolation in log C against log L (monotone: the envelope's loss falls as its cost grows), so only a loss
both envelopes reach gives a number: the **iso-loss multiplier** ``C_baseline(L) / C_variant(L)``, read at
two losses of the range both reach, both fixed on the seed means (:func:`read_losses`): ``low``, a quarter of
the way up that range in log L from its lowest loss (:data:`LOW_AT`: not at the lowest loss itself, where a
rung that gains nothing leaves the envelope flat and the reading jumps between rungs), and ``mid``, its middle.
It depends on no law, and on no other variant of the sweep. The same reading on the runs' training time
instead of their FLOPs gives the multiplier in wall time.

The interval is a two-level bootstrap (:func:`resample`): the seeds are drawn with replacement (the same draw
for the variant and the baseline: a seed's runs share its data order), then, within each drawn seed, its runs'
own noise (what neither the cell nor the seed explains) is drawn with replacement from that seed's runs; each
run's cost moves with its loss (in log: a run's measured time is as noisy as its loss; FLOPs do not vary). The
envelopes and the answer are recomputed on every draw, vectorized over the draws (:class:`Envelopes`), at the
same two losses (:data:`DRAWS` draws from a fixed seed: the same report every time). The paired loss difference
at equal cost, ``L_variant(C) - L_baseline(C)``, read on the same draws at :data:`POINTS` costs spanning the
range both trained, says whether the answer holds at every scale trained (:class:`Pair`). The readings'
intervals, simultaneous over them, are zoo.lab.studies.ladder.band's."""

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
#: The low reading's place in the range of losses both envelopes reach: this fraction of the way up, in log L,
#: from its lowest loss.
LOW_AT = 0.25


@dataclass
class Grid:
    """A curve's runs as arrays: ``loss[replicate, cell]`` and ``cost[replicate, cell]`` (nan: not run)."""

    replicates: list[Any]
    cells: list[tuple[int, int]]  # (width, budget)
    cost: np.ndarray
    loss: np.ndarray

    def mean_cost(self) -> np.ndarray:
        """Each cell's cost, the geometric mean over the runs that have one (nan: none)."""
        with np.errstate(all="ignore"):
            logs = np.where(self.cost > 0, np.log(self.cost), math.nan)
            return np.exp(np.nanmean(logs, axis=0)) if logs.size else np.full(len(self.cells), math.nan)


@dataclass
class Envelopes:
    """Compute-optimal envelopes of many curves at once, one a row (a bootstrap draw, a seed): each row's cells
    by cost, ``keep`` where a cell reaches a lower loss than every cell of less cost."""

    cost: np.ndarray  # [row, cell], ascending in each row
    loss: np.ndarray
    keep: np.ndarray

    def lowest(self) -> np.ndarray:
        """Each envelope's lowest loss (nan: an empty envelope)."""
        low = np.min(np.where(self.keep, self.loss, math.inf), axis=1, initial=math.inf)
        return np.where(np.isfinite(low), low, math.nan)

    def highest(self) -> np.ndarray:
        """Each envelope's highest loss, its cheapest cell's (nan: an empty envelope)."""
        high = np.max(np.where(self.keep, self.loss, -math.inf), axis=1, initial=-math.inf)
        return np.where(np.isfinite(high), high, math.nan)

    def cost_at(self, loss: np.ndarray) -> np.ndarray:
        """Each row's cost to reach ``loss[row]`` (log-log interpolation; nan outside its envelope's losses)."""
        target = np.asarray(loss, float)[:, None]
        above, below = self.keep & (self.loss >= target), self.keep & (self.loss <= target)
        return self.between(above, below, self.loss, self.cost, target[:, 0])

    def loss_at(self, costs: np.ndarray) -> np.ndarray:
        """Each row's loss at each of ``costs`` (log-log interpolation; nan outside the costs its envelope spans),
        ``[row, cost]``."""
        out = np.full((len(self.cost), len(costs)), math.nan)
        for k, c in enumerate(costs):
            tol = np.abs(c) * 1e-12
            cheaper, dearer = self.keep & (self.cost <= c + tol), self.keep & (self.cost >= c - tol)
            out[:, k] = self.between(cheaper, dearer, self.cost, self.loss, np.full(len(self.cost), float(c)))
        return out

    @staticmethod
    def between(first: np.ndarray, second: np.ndarray, x: np.ndarray, y: np.ndarray, at: np.ndarray) -> np.ndarray:
        """Per row, ``y`` interpolated in logs at ``x = at`` between the last cell of ``first`` and the first of
        ``second`` (an envelope's cells in order; nan where a row has none of either)."""
        rows = np.arange(len(x))
        i = x.shape[1] - 1 - np.argmax(first[:, ::-1], axis=1)
        j = np.argmax(second, axis=1)
        ok = first.any(axis=1) & second.any(axis=1)
        with np.errstate(all="ignore"):
            lx_i, lx_j, ly_i, ly_j = np.log(x[rows, i]), np.log(x[rows, j]), np.log(y[rows, i]), np.log(y[rows, j])
            t = np.where(lx_j != lx_i, (np.log(at) - lx_i) / (lx_j - lx_i), 0.0)
            return np.where(ok, np.exp(ly_i + t * (ly_j - ly_i)), math.nan)


def envelopes(cost: np.ndarray, loss: np.ndarray) -> Envelopes:
    """:class:`Envelopes` of ``cost`` and ``loss`` (``[row, cell]``, or one curve's 1-D cells; nan skipped)."""
    cost, loss = np.atleast_2d(np.asarray(cost, float)), np.atleast_2d(np.asarray(loss, float))
    cost = np.broadcast_to(cost, loss.shape)
    ok = np.isfinite(loss) & np.isfinite(cost) & (cost > 0)
    c, y = np.where(ok, cost, math.inf), np.where(ok, loss, math.inf)
    order = np.lexsort((y, c), axis=-1)
    c, y, ok = (np.take_along_axis(a, order, axis=1) for a in (c, y, ok))
    before = np.concatenate([np.full((len(y), 1), math.inf), np.minimum.accumulate(y, axis=1)[:, :-1]], axis=1)
    return Envelopes(c, y, ok & (y < before))


def front(cost: np.ndarray, loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One curve's envelope (``cost``, ``loss``: 1-D, nan skipped) as its cells' (costs, losses), by cost."""
    env = envelopes(cost, loss)
    return env.cost[0][env.keep[0]], env.loss[0][env.keep[0]]


def cost_at(env: tuple[np.ndarray, np.ndarray], loss: float) -> float:
    """The cost at which an envelope (:func:`front`) reaches ``loss`` (log-log interpolation; nan outside)."""
    c, y = env
    return float(Envelopes(c[None], y[None], np.ones((1, len(c)), bool)).cost_at(np.array([loss]))[0])


def read_losses(base: Envelopes, var: Envelopes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row: the lowest and the highest loss both envelopes reach, and the two losses read between them:
    :data:`LOW_AT` of the way up in log L, and the middle (nan where the envelopes do not meet)."""
    low, high = np.maximum(base.lowest(), var.lowest()), np.minimum(base.highest(), var.highest())
    meet = np.isfinite(low) & np.isfinite(high) & (low <= high)
    low, high = np.where(meet, low, math.nan), np.where(meet, high, math.nan)
    with np.errstate(all="ignore"):
        at = np.exp(np.log(low) + LOW_AT * (np.log(high) - np.log(low)))
    return low, high, at, np.sqrt(low * high)


def cost_points(base: np.ndarray, var: np.ndarray) -> np.ndarray:
    """:data:`POINTS` costs, log-spaced over the range both curves trained (each a 1-D array of its cells'
    costs); empty when they do not overlap."""
    low, high = max(np.nanmin(base), np.nanmin(var)), min(np.nanmax(base), np.nanmax(var))
    return np.geomspace(low, high, POINTS) if low < high else np.array([])


def resample(values: np.ndarray, seeds: np.ndarray, swap: np.ndarray) -> np.ndarray:
    """Two-level draws of ``values[replicate, cell]``, one per row of ``seeds[draw, n]``: the drawn seeds' runs,
    each with its own noise (the residual after the cell's and the seed's means) swapped for that of the
    same seed's run at cell ``swap[draw, n, cell]``; returned as the cells' means over the drawn seeds,
    ``[draw, cell]``. The same ``seeds`` and ``swap`` for both curves of a pair keep it paired, and for a
    curve's losses and costs keep each run's two together."""
    with np.errstate(all="ignore"):
        cell = np.nanmean(values, axis=0)
        offset = np.nanmean(values - cell, axis=1, keepdims=True)
    residual = np.nan_to_num(values - cell - offset)
    picked, own = values[seeds], residual[seeds]  # [draw, n, cell]
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
    their bootstrap draws at the same losses (nan where a draw's envelopes do not reach one)."""

    base: tuple[np.ndarray, np.ndarray]  # the envelope of the seed means: its cells' costs and losses
    var: tuple[np.ndarray, np.ndarray]
    low: float  # the iso-loss multiplier at ``read[0]``
    mid: float  # ... at ``read[1]``, the middle of the range both reach
    losses: tuple[float, float]  # that range: (lowest, highest)
    read: tuple[float, float]  # the two losses read (:func:`read_losses`)
    points: np.ndarray  # costs where the paired difference is read
    difference: np.ndarray  # L_variant - L_baseline at ``points`` (seed means)
    draws_low: np.ndarray = field(default_factory=lambda: np.array([]))
    draws_mid: np.ndarray = field(default_factory=lambda: np.array([]))
    draws_difference: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    seeds: int = 0  # the replicates both curves ran

    def interval(self, draws: np.ndarray) -> tuple[float, float]:
        """:func:`log_interval` of ``draws`` over this pair's seeds."""
        return log_interval(draws, self.seeds)


def aligned(grid: Grid, cells: list[tuple[int, int]]) -> Grid:
    """``grid`` on ``cells`` (its own and more: nan where it has none)."""
    at = [grid.cells.index(c) if c in grid.cells else -1 for c in cells]
    missing = np.full(len(grid.replicates), math.nan)
    cost, loss = (np.stack([a[:, i] if i >= 0 else missing for i in at], axis=1) for a in (grid.cost, grid.loss))
    return Grid(grid.replicates, cells, cost, loss)


def paired_rows(base: Grid, var: Grid, name: str = "loss") -> tuple[np.ndarray, np.ndarray]:
    """The two curves' ``name`` rows (``loss`` or ``cost``) of the replicates both ran, in the same order (the
    pairing); the grids' cells the same (:func:`aligned`)."""
    shared = [r for r in base.replicates if r in var.replicates]
    return (getattr(base, name)[[base.replicates.index(r) for r in shared]],
            getattr(var, name)[[var.replicates.index(r) for r in shared]])  # fmt: skip


def drawn_cost(cost: np.ndarray, seeds: np.ndarray, swap: np.ndarray) -> np.ndarray:
    """Each draw's cell costs (:func:`resample` in log), or each cell's own when no run's differs from it."""
    with np.errstate(all="ignore"):
        logs = np.log(cost)
        if np.nanmax(np.abs(logs - np.nanmean(logs, axis=0)), initial=0.0) < 1e-12:  # FLOPs: the same every seed
            return np.broadcast_to(np.exp(np.nanmean(logs, axis=0)), (len(seeds), cost.shape[1]))
        return np.exp(resample(logs, seeds, swap))


def multipliers(base: Envelopes, var: Envelopes, at: np.ndarray) -> np.ndarray:
    """``C_baseline(L) / C_variant(L)`` per row at ``at[row]`` (nan where either envelope does not reach it)."""
    with np.errstate(all="ignore"):
        return base.cost_at(at) / var.cost_at(at)


def compare_grids(base: Grid, var: Grid, draws: int = DRAWS) -> Pair:
    """The variant's iso-loss answer against the baseline's, with ``draws`` paired two-level bootstrap draws."""
    cells = sorted(set(base.cells) | set(var.cells))
    base, var = aligned(base, cells), aligned(var, cells)
    b_cost, v_cost = base.mean_cost(), var.mean_cost()
    with np.errstate(all="ignore"):
        b, v = envelopes(b_cost, np.nanmean(base.loss, 0)), envelopes(v_cost, np.nanmean(var.loss, 0))
    low, high, at_low, at_mid = (float(x[0]) for x in read_losses(b, v))
    points = cost_points(b_cost, v_cost)
    low_mid = [float(multipliers(b, v, np.array([at]))[0]) for at in (at_low, at_mid)]
    diff = (v.loss_at(points) - b.loss_at(points))[0]
    (b_loss, v_loss), (b_runs, v_runs) = paired_rows(base, var), paired_rows(base, var, "cost")
    n = len(b_loss)
    pair = Pair((b.cost[0][b.keep[0]], b.loss[0][b.keep[0]]), (v.cost[0][v.keep[0]], v.loss[0][v.keep[0]]),
                *low_mid, (low, high), (at_low, at_mid), points, diff, seeds=n)  # fmt: skip
    if n < 2 or draws < 1:
        return pair
    rng = np.random.default_rng(BOOT_SEED)
    seeds = rng.integers(0, n, size=(draws, n))  # the same seeds for both curves: the pairing
    swap = rng.integers(0, b_loss.shape[1], size=(draws, n, b_loss.shape[1]))
    b_c, v_c = (drawn_cost(r, seeds, swap) for r in (b_runs, v_runs))
    bd = envelopes(b_c, resample(b_loss, seeds, swap))
    vd = envelopes(v_c, resample(v_loss, seeds, swap))
    pair.draws_low = multipliers(bd, vd, np.full(draws, at_low))
    pair.draws_mid = multipliers(bd, vd, np.full(draws, at_mid))
    pair.draws_difference = vd.loss_at(points) - bd.loss_at(points)
    return pair


def seed_multipliers(base: Grid, var: Grid) -> np.ndarray:
    """Each replicate's own multiplier at mid-range, read on its two envelopes (nan where they do not meet): the
    middle of the range its envelopes both reach, where each is interior (near the lowest loss one seed's
    envelope rests on its widest runs alone, and its run noise alone spreads the seeds past 10x)."""
    cells = sorted(set(base.cells) | set(var.cells))
    base, var = aligned(base, cells), aligned(var, cells)
    (b_loss, v_loss), (b_cost, v_cost) = paired_rows(base, var), paired_rows(base, var, "cost")
    b, v = envelopes(b_cost, b_loss), envelopes(v_cost, v_loss)
    return multipliers(b, v, read_losses(b, v)[3])
