"""Learning-rate transfer across widths from a finished `zoo-sweep mup` folder (docs/results.md section 11).

    python benchmarks/mup_transfer.py runs/mup --base 64 --out docs/images/mup-transfer.png

For each parametrization and width: the headline metric (mean over seeds) at every rate, the best
rate, and the regret of transferring the base width's best rate (the metric there minus the best at
this width, per seed, then averaged). Draws the metric against the rate, one panel per parametrization,
one line per width.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def collect(folder: Path) -> dict[tuple[str, int], dict[float, dict[int, float]]]:
    """{(param, width): {lr: {seed: metric}}} over the folder's finished runs (a diverged run: inf)."""
    found: dict[tuple[str, int], dict[float, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for path in sorted(folder.glob("*/summary.json")):
        summary = json.loads(path.read_text())
        config = summary.get("config") or {}
        if summary.get("status") not in ("ok", "diverged"):
            continue
        value = (summary.get("metric") or {}).get("value")
        key = ((config.get("param") or {}).get("name", "standard"), config["block"]["d_model"])
        found[key][config["train"]["lr"]][config.get("seed", 0)] = float("inf") if value is None else value
    return found


def table(found: dict, base: int) -> list[str]:
    """Markdown rows: param, width, the mean metric at each rate, the best rate, the transfer regret."""
    rates = sorted({lr for runs in found.values() for lr in runs})
    lines = [
        "| param | width | " + " | ".join(f"lr {r:g}" for r in rates) + " | best lr | regret at base's best lr |",
        "|---|---|" + "---|" * len(rates) + "---|---|",
    ]
    for (param, width), runs in sorted(found.items()):
        means = {lr: statistics.fmean(runs[lr].values()) for lr in rates if lr in runs}
        best = min(means, key=means.get)
        base_runs = found.get((param, base))
        regret = "n/a"
        if base_runs:
            base_best = min(base_runs, key=lambda lr: statistics.fmean(base_runs[lr].values()))
            per_seed = [runs[base_best][s] - runs[best][s] for s in runs[best] if s in runs.get(base_best, {})]
            if per_seed:
                regret = f"{statistics.fmean(per_seed):+.4f} ({', '.join(f'{d:+.3f}' for d in per_seed)})"
        cells = [f"**{means[r]:.4f}**" if r == best else f"{means.get(r, float('nan')):.4f}" for r in rates]
        lines.append(f"| {param} | {width} | " + " | ".join(cells) + f" | {best:g} | {regret} |")
    return lines


def plot(found: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    params = sorted({p for p, _ in found})
    fig = Figure(figsize=(5.2 * len(params), 4.2), layout="constrained")
    axes = fig.subplots(1, len(params), squeeze=False)[0]
    for ax, param in zip(axes, params, strict=True):
        for (p, width), runs in sorted(found.items()):
            if p != param:
                continue
            rates = sorted(runs)
            means = [statistics.fmean(runs[lr].values()) for lr in rates]
            ax.plot(rates, means, marker="o", ms=4, label=f"d_model {width}")
            best = min(range(len(rates)), key=lambda i: means[i])
            ax.plot([rates[best]], [means[best]], marker="o", ms=11, mfc="none", color="black")
        ax.set_xscale("log")
        ax.set_title(f"param={param}")
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
    found = collect(args.folder)
    print("\n".join(table(found, args.base)))
    if args.out is not None:
        plot(found, args.out)


if __name__ == "__main__":
    main()
