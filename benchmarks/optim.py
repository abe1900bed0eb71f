"""Optimizer cost: a training step with optim=muon against AdamW (the trainer's default) on the same model.

    python benchmarks/optim.py                      # the quick sweep's size, then d_model 1024 (2 layers)
    python benchmarks/optim.py --sizes 64 --repeats 3 --threads 1   # a quick check
    python benchmarks/optim.py --device cuda --sizes 64 1024 --batch 64 --seq-len 512

Both sides run the trainer's own step (zoo/lab/training/step.py: forward under autocast, loss, backward,
clipping, optimizer step) on the same model (same init, copied) and the same batch; they alternate
(adamw, muon, adamw, ...) so drift in machine load hits both alike, and the medians are compared.
The optimizer step alone is timed the same way (on the gradients of one backward). Muon's extra
cost is per step, independent of the batch: its Newton-Schulz iterations (batched over each fused
weight's logical matrices) against AdamW's elementwise update, so the ratio falls as the batch
grows. Target: muon / adamw <= 1.2 for the whole step.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable

import torch
import yaml
from timing import time_interleaved

from zoo import compose
from zoo.lab.planning.run_model import build_run_model
from zoo.lab.planning.train_config import check_run_config
from zoo.lab.recipe import Recipe
from zoo.lab.tasks import Batch, build_task
from zoo.lab.training.step import Stepper, lm_logits, loss_fn
from zoo.lab.training.trainer import make_optimizer


def optim_section(spec: str) -> dict:
    """``name`` or ``name:key=value,...`` (``muon:ns=polar_express``) -> an ``optim`` section."""
    name, _, options = spec.partition(":")
    pairs = (item.split("=", 1) for item in options.split(",") if item)
    return {"name": name, **{key: yaml.safe_load(value) for key, value in pairs}}


def steppers(raw: dict, device: torch.device, optims: list[str]) -> tuple[dict[str, Stepper], Batch]:
    """The trainer's step with AdamW and with each of ``optims`` (at Muon's rate 0.02), over copies of one model;
    and a batch."""
    train_cfg, _ = check_run_config(raw)
    torch.manual_seed(0)
    model = build_run_model(raw).to(device)
    copies = {"adamw": model, **{spec: copy.deepcopy(model) for spec in optims}}
    optimizers = {"adamw": make_optimizer(copies["adamw"], train_cfg)}
    for spec in optims:
        entry = Recipe(optim=optim_section(spec)).optimizer_entry(train_cfg)
        optimizers[spec] = entry.build(copies[spec], lr=0.02, weight_decay=train_cfg.weight_decay)
    task = build_task(raw["task"])
    batch = task.train_batch(train_cfg.batch_size, torch.Generator().manual_seed(0)).to(device)
    steps = {name: Stepper(m, m, optimizers[name], device, train_cfg.grad_clip) for name, m in copies.items()}
    return steps, batch


def optimizer_only(step: Stepper, batch: Batch) -> Callable[[], object]:
    """The optimizer's step alone, on the gradients of one backward (kept between calls)."""
    loss_fn(lm_logits(step.model, batch), batch.targets).backward()
    return step.optimizer.step


def measure(args: argparse.Namespace, d_model: int) -> None:
    heads = max(4, d_model // 64)
    cfg = compose(
        [
            "task=bytes",
            f"block.d_model={d_model}",
            f"block.n_heads={heads}",
            f"model.n_layers={args.layers}",
            f"task.seq_len={args.seq_len}",
            "task.max_bytes=1000000",
            f"train.batch_size={args.batch}",
            f"device={args.device}",
            *args.overrides,
        ]
    )
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(cfg, resolve=True)
    device = torch.device(args.device)
    steps, batch = steppers(raw, device, args.optims)
    whole = time_interleaved({name: (lambda s=s: s(batch)) for name, s in steps.items()}, device, args.repeats)
    alone = time_interleaved({name: optimizer_only(s, batch) for name, s in steps.items()}, device, args.repeats)
    print(
        f"\nmodel: d_model={d_model} heads={heads} layers={args.layers} T={args.seq_len} batch={args.batch} "
        f"device={args.device} threads={torch.get_num_threads()} {' '.join(args.overrides)}"
    )
    print("| optimizer | step ms (fwd+bwd+opt, median) | optimizer step alone ms |")
    print("|---|---|---|")
    for name in steps:
        print(f"| {name} | {whole[name] * 1e3:.1f} | {alone[name] * 1e3:.1f} |")
    if "muon" not in steps:
        return
    # Muon's extra cost is per step; the rest of the step grows with the tokens. At 1.2x: the tokens it needs.
    extra = alone["muon"] - alone["adamw"]
    per_token = max(whole["adamw"] - alone["adamw"], 1e-9) / (args.batch * args.seq_len)
    print(f"Muon's extra {extra * 1e3:.1f} ms per step is 0.2 of the step from {extra / 0.2 / per_token:,.0f} "
          f"tokens per step (here {args.batch * args.seq_len:,})")  # fmt: skip
    ratio = whole["muon"] / whole["adamw"]
    print(f"ratio muon / adamw: {ratio:.3f} per training step (target <= 1.2), "
          f"{alone['muon'] / alone['adamw']:.2f} for the optimizer step alone")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 1024], help="d_model values")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--optims", nargs="+", default=["muon"], help="optimizers beside adamw: name or "
                        "name:key=value,... (muon:ns=polar_express)")  # fmt: skip
    parser.add_argument("overrides", nargs="*", default=["mlp=swiglu"], help="zoo overrides (default mlp=swiglu)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for d_model in args.sizes:
        measure(args, d_model)


if __name__ == "__main__":
    main()
