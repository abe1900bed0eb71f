"""The coordinate check the ``mup`` package prescribes before trusting a μP model (``zoo-coordcheck``,
zoo.lab.commands.coordcheck): mean |x| of the embedding, every block, every softmax attention's scores and
the output logits, per training step, across widths, under both parametrizations; its slopes and verdict."""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from zoo.assembly.combinations import block_settings, covering_combinations, node
from zoo.assembly.compose import compose_with_choices
from zoo.core.errors import ConfigError
from zoo.core.interface import hook
from zoo.lab.keys import PARAM_VALUES
from zoo.lab.planning.plan import plan_run
from zoo.lab.tasks.base import IGNORE

#: Slope of log mean|x| against log width above which a μP curve fails (printed with the verdict).
PARAMS = PARAM_VALUES

Row = tuple[str, int, int, str, float]  # param, width, step, quantity, mean |x|


def attention_scale(attn: torch.nn.Module, x: torch.Tensor) -> float | None:
    """Mean |score| over the keys each query may see: the mixer's pre-softmax scores of its input ``x``
    (the ``attention_logits`` hook, its own score scale applied); None for a mixer without logits."""
    with torch.no_grad():
        scores = hook(attn, "attention_logits")(x)
    return None if scores is None else scores[torch.isfinite(scores)].abs().float().mean().item()


def config(overrides: Sequence[str], param: str, width: int, base: int) -> tuple[dict, dict]:
    extra = [f"block.d_model={width}", f"param={param}"] + ([f"param.base_width={base}"] if param == "mup" else [])
    cfg, choices = compose_with_choices([*overrides, *extra])
    return OmegaConf.to_container(cfg, resolve=True), choices  # type: ignore[return-value]


def averaged(overrides: Sequence[str], param: str, width: int, base: int, steps: int, seeds: int) -> list[Row]:
    """:func:`measure`'s rows averaged over ``seeds`` seeds (seed, seed + 1, ...)."""
    runs = [measure([*overrides, f"seed={seed}"], param, width, base, steps) for seed in range(seeds)]
    return [(*row[:4], sum(run[i][4] for run in runs) / seeds) for i, row in enumerate(runs[0])]


def measure(overrides: Sequence[str], param: str, width: int, base: int, steps: int) -> list[Row]:
    """Train ``steps`` steps of the config at ``width`` (constant rate train.lr, no clipping); the rows
    recorded before each step."""
    raw, choices = config(overrides, param, width, base)
    plan = plan_run(raw, choices)
    torch.set_num_threads(raw.get("threads") or 1)
    task = plan.build_task()
    torch.manual_seed(raw.get("seed", 0))
    model = plan.run_model.build(raw)
    optimizer = plan.recipe.build(model, plan.train)
    for group in optimizer.param_groups:
        group["lr"] = plan.train.lr * group.get("lr_ratio", 1.0)
    values: dict[str, float] = {}
    hooks = [model.embed.register_forward_hook(lambda m, i, out: values.__setitem__("embedding", mean_abs(out)))]
    for i, block in enumerate(model.blocks):
        hooks.append(
            block.register_forward_hook(lambda m, i_, out, i=i: values.__setitem__(f"block.{i}", mean_abs(out)))
        )
    scores: dict[str, float | None] = {}
    for i, block in enumerate(model.blocks):
        hooks.append(
            block.attn.register_forward_pre_hook(
                lambda m, args, i=i: scores.__setitem__(f"attn_logits.{i}", attention_scale(m, args[0]))
            )
        )
    generator, rows = torch.Generator().manual_seed(raw.get("seed", 0)), []
    for step in range(steps):
        batch = task.train_batch(plan.train.batch_size, generator)
        logits = task.logits(model, batch)
        values.update({name: s for name, s in scores.items() if s is not None}, output_logits=mean_abs(logits))
        rows += [(param, width, step, name, value) for name, value in values.items()]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.flatten(), ignore_index=IGNORE)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    for handle in hooks:
        handle.remove()
    return rows


def mean_abs(x: torch.Tensor) -> float:
    return x.detach().abs().float().mean().item()


def slopes(rows: Sequence[Row]) -> dict[tuple[str, int, str], float]:
    """Least-squares slope of log mean|x| against log width, per (param, step, quantity)."""
    points: dict[tuple[str, int, str], list[tuple[float, float]]] = {}
    for param, width, step, name, value in rows:
        points.setdefault((param, step, name), []).append((math.log(width), math.log(max(value, 1e-30))))
    found = {}
    for key, xy in points.items():
        mx, my = sum(x for x, _ in xy) / len(xy), sum(y for _, y in xy) / len(xy)
        var = sum((x - mx) ** 2 for x, _ in xy)
        found[key] = sum((x - mx) * (y - my) for x, y in xy) / var if var else 0.0
    return found


def write_csv(rows: Sequence[Row], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["param", "width", "step", "quantity", "mean_abs"])
        writer.writerows(rows)


def plot(rows: Sequence[Row], path: Path, steps: int) -> None:
    """One panel per (parametrization, quantity): mean |x| against width, one line per step."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    names = list(dict.fromkeys(r[3] for r in rows))
    fig = Figure(figsize=(2.6 * len(names), 5.4), layout="constrained")
    axes = fig.subplots(len(PARAMS), len(names), squeeze=False)
    colors = colormaps["viridis"]
    for row, param in enumerate(PARAMS):
        for col, name in enumerate(names):
            ax = axes[row][col]
            for step in range(steps):
                xy = sorted((r[1], r[4]) for r in rows if r[0] == param and r[3] == name and r[2] == step)
                color = colors(step / max(steps - 1, 1))
                ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", ms=3, color=color, label=f"step {step}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{param}: {name}", fontsize=9)
            ax.grid(alpha=0.3)
            if row == len(PARAMS) - 1:
                ax.set_xlabel("width (block.d_model)")
            if col == 0:
                ax.set_ylabel("mean |x|")
    axes[0][-1].legend(fontsize=7)
    fig.savefig(path, dpi=110)


def verdict(rows: Sequence[Row], tolerance: float, judged: str = "mup") -> list[str]:
    """The ``judged`` parametrization's curves whose slope exceeds ``tolerance``; every parametrization's
    steepest slope is printed."""
    found = slopes(rows)
    for param in PARAMS:
        worst = max(((s, k) for k, s in found.items() if k[0] == param), default=None)
        if worst is not None:
            print(f"{param}: steepest slope {worst[0]:+.3f} ({worst[1][2]} at step {worst[1][1]})")
    return [
        f"{k[2]} at step {k[1]}: slope {s:+.3f}" for k, s in sorted(found.items()) if k[0] == judged and s > tolerance
    ]


def combination_overrides(combo: dict[str, str]) -> list[str]:
    """The overrides that select a covering-set row (``attn=mha+qknorm``: attn=mha, block.attn.qk_norm=...)."""
    found = []
    for axis, label in combo.items():
        options = node(axis, label)
        found.append(f"{axis}={options.pop('name')}")
        found += [f"block.{axis}.{key}={json.dumps(value)}" for key, value in options.items()]
    return found + [f"block.{key}={json.dumps(value)}" for key, value in block_settings(combo).items()]


def covering(args: argparse.Namespace, widths: list[int]) -> int:
    """The check for every row of the contract's covering set over ``args.overrides``: 1 when one fails
    (a row param=mup refuses, or the parts cannot combine, is listed and skipped)."""
    failed = []
    for combo in covering_combinations():
        label = " ".join(f"{a}={v}" for a, v in combo.items())
        overrides = [*args.overrides, *combination_overrides(combo)]
        try:
            runs = [averaged(overrides, p, w, widths[0], args.steps, args.seeds) for p in PARAMS for w in widths]
        except ConfigError as error:
            print(f"skip {label}: {error}")
            continue
        failures = verdict([row for run in runs for row in run], args.tolerance, args.check)
        print(f"{'FAIL' if failures else 'ok'} {label}" + (f": {failures[0]}" if failures else ""))
        failed += [label] if failures else []
    print(f"coordcheck over the covering set: {len(failed)} failed (tolerance {args.tolerance:+.3f})")
    return 1 if failed else 0
