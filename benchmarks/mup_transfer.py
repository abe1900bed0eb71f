"""Learning-rate transfer across widths from a finished `zoo-sweep mup` folder (docs/results.md section 12).

    python benchmarks/mup_transfer.py runs/mup --base 64 --out docs/images/mup-transfer.png

Prints three tables, every interval the report's own (zoo.lab.studies.stats.compare: a paired Student t
interval over the seeds, none under 3 seeds):

1. For each parametrization and width: the headline metric (mean over seeds) at every rate, the best rate
   (the best mean among the rates where every seed finished; ``edge`` when it is the lowest or highest
   rate tried), and the regret of transferring the base width's best rate: the metric there minus the
   metric at this width's best rate, per seed, with its interval.
2. μP minus standard per width, paired by seed: at the base width's best rate, and each at its own best.
3. Is wider better? Per parametrization, each width minus the base width at the base width's best rate
   (what a user who tuned at the base width gets), paired by seed.

Draws the metric against the rate, one panel per parametrization, one line per width.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from zoo.lab.studies.runset import grid_edge
from zoo.lab.studies.stats import Comparison, compare

#: {(param, width): {lr: {seed: metric}}}: a run that did not finish with a finite metric is absent.
Found = dict[tuple[str, int], dict[float, dict[int, float]]]


def collect(folder: Path) -> tuple[Found, list[float]]:
    """The folder's finished runs, and every rate tried (a rate where some run diverged included)."""
    found: Found = defaultdict(lambda: defaultdict(dict))
    rates = set()
    for path in sorted(folder.glob("*/summary.json")):
        summary = json.loads(path.read_text())
        config = summary.get("config") or {}
        if summary.get("status") not in ("ok", "diverged"):
            continue
        key = ((config.get("param") or {}).get("name", "standard"), config["block"]["d_model"])
        rate, value = float(config["train"]["lr"]), (summary.get("metric") or {}).get("value")
        rates.add(rate)
        found[key][rate]  # noqa: B018  (the rate was tried at this width, whether or not it finished)
        if summary.get("status") == "ok" and isinstance(value, (int, float)) and math.isfinite(value):
            found[key][rate][config.get("seed", 0)] = float(value)
    return found, sorted(rates)


def best_rate(runs: dict[float, dict[int, float]]) -> float:
    """The rate with the best mean among those where every seed of the width finished."""
    seeds = set().union(*(r.keys() for r in runs.values()))
    means = {lr: statistics.fmean(v.values()) for lr, v in runs.items() if v and set(v) == seeds}
    return min(means, key=means.__getitem__)


def mean_text(runs: dict[float, dict[int, float]], rate: float) -> str:
    """The mean over the seeds that finished; ``diverged`` when none did, ``not run`` without a run."""
    if rate not in runs:
        return "not run"
    values = runs[rate]
    return f"{statistics.fmean(values.values()):.4f}" if values else "diverged"


def interval(c: Comparison) -> str:
    """``+0.0123 [-0.0040, +0.0286] within noise`` (the report's form), with the verdict."""
    if c.low is None or c.high is None:
        return f"{c.delta_mean:+.4f} ({c.verdict})" if c.delta_mean is not None else c.verdict
    return f"{c.delta_mean:+.4f} [{c.low:+.4f}, {c.high:+.4f}] {c.verdict}"


def per_seed(a: dict[int, float], b: dict[int, float]) -> str:
    return ", ".join(f"{a[s] - b[s]:+.3f}" for s in sorted(a) if s in b)


def rate_table(found: Found, rates: list[float], base: int) -> list[str]:
    """Table 1: the metric at each rate, the best rate and the regret of the base width's best rate."""
    lines = [
        "| param | width | " + " | ".join(f"lr {r:g}" for r in rates) + " | best lr | regret at base's best lr "
        "[95% CI] | per seed |",
        "|---|---|" + "---|" * len(rates) + "---|---|---|",
    ]  # fmt: skip
    for (param, width), runs in sorted(found.items()):
        best = best_rate(runs)
        cells = [f"**{mean_text(runs, r)}**" if r == best else mean_text(runs, r) for r in rates]
        edge = grid_edge(best, rates)
        regret, seeds = "n/a", ""
        if (param, base) in found:
            moved = best_rate(found[(param, base)])
            regret = interval(compare(runs.get(moved, {}), runs[best], "min"))
            seeds = per_seed(runs.get(moved, {}), runs[best])
        best_text = f"{best:g}" + (f" (edge: {edge})" if edge else "")
        lines.append(f"| {param} | {width} | " + " | ".join(cells) + f" | {best_text} | {regret} | {seeds} |")
    return lines


def param_table(found: Found, base: int) -> list[str]:
    """Table 2: μP minus standard per width, at the base width's best rate and at each one's own best."""
    lines = [
        "| width | Δ μP − standard at the base's best lr [95% CI] | per seed | Δ at each one's best lr [95% CI] "
        "| per seed |",
        "|---|---|---|---|---|",
    ]  # fmt: skip
    widths = sorted({w for p, w in found if p == "mup"} & {w for p, w in found if p == "standard"})
    for width in widths:
        mup, std = found[("mup", width)], found[("standard", width)]
        rate = best_rate(found[("standard", base)])
        at_base = compare(mup.get(rate, {}), std.get(rate, {}), "min")
        own_mup, own_std = mup[best_rate(mup)], std[best_rate(std)]
        own = compare(own_mup, own_std, "min")
        lines.append(f"| {width} | {interval(at_base)} | {per_seed(mup.get(rate, {}), std.get(rate, {}))} | "
                     f"{interval(own)} | {per_seed(own_mup, own_std)} |")  # fmt: skip
    return lines


def width_table(found: Found, base: int) -> list[str]:
    """Table 3: each width minus the base width, at the base width's best rate, per parametrization."""
    lines = [
        f"| param | width | lr (best at {base}) | mean | Δ vs width {base} [95% CI] | per seed |",
        "|---|---|---|---|---|---|",
    ]
    for param in sorted({p for p, _ in found}):
        if (param, base) not in found:
            continue
        rate = best_rate(found[(param, base)])
        reference = found[(param, base)][rate]
        for (p, width), runs in sorted(found.items()):
            if p != param:
                continue
            values = runs.get(rate, {})
            mean = mean_text(runs, rate)
            delta = "base" if width == base else interval(compare(values, reference, "min"))
            seeds = "" if width == base else per_seed(values, reference)
            lines.append(f"| {param} | {width} | {rate:g} | {mean} | {delta} | {seeds} |")
    return lines


def plot(found: Found, path: Path) -> None:
    from matplotlib.figure import Figure

    params = sorted({p for p, _ in found})
    fig = Figure(figsize=(5.2 * len(params), 4.2), layout="constrained")
    axes = fig.subplots(1, len(params), squeeze=False)[0]
    for ax, param in zip(axes, params, strict=True):
        for (p, width), runs in sorted(found.items()):
            if p != param:
                continue
            rates = sorted(lr for lr in runs if runs[lr])
            means = [statistics.fmean(runs[lr].values()) for lr in rates]
            ax.plot(rates, means, marker="o", ms=4, label=f"d_model {width}")
            best = best_rate(runs)
            ax.plot([best], [statistics.fmean(runs[best].values())], marker="o", ms=11, mfc="none", color="black")
        ax.set_xscale("log")
        ax.set_title(f"param={param} (circled: each width's best rate)")
        ax.set_xlabel("peak learning rate (train.lr)")
        ax.set_ylabel("val_bpb (mean over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the sweep folder (runs/mup)")
    parser.add_argument("--base", type=int, default=64, help="the width whose best rate is transferred")
    parser.add_argument("--out", type=Path, default=None, help="where to draw the PNG (default: none)")
    args = parser.parse_args()
    found, rates = collect(args.folder)
    if not found:
        raise SystemExit(f"{args.folder}: no finished run of a `zoo-sweep mup` sweep (summary.json) under it")
    print("\n".join(rate_table(found, rates, args.base)))
    print()
    print("\n".join(param_table(found, args.base)))
    print()
    print("\n".join(width_table(found, args.base)))
    if args.out is not None:
        plot(found, args.out)


if __name__ == "__main__":
    main()
