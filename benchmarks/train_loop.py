"""Training-loop overhead: zoo's Trainer against its bare training step (zoo/lab/training/step.py) on the same model.

    python benchmarks/train_loop.py                                  # CPU, d_model 128, 4 layers, T 128
    python benchmarks/train_loop.py --d-model 64 --layers 2 --steps 50 --repeats 3   # a quick check
    python benchmarks/train_loop.py --device cuda --d-model 512 --layers 8 --batch 32 --seq-len 512
    python benchmarks/train_loop.py --steps 400 --repeats 3          # + checkpoint cost (every 100 steps)

Both sides train the same model (same init) with the same optimizer on the same task's batch
size and length, and the same step (forward under the trainer's autocast, loss, auxiliary losses,
backward, clipping, optimizer step). The bare side reuses one batch already on the device and never
reads the loss back; the Trainer draws a fresh batch every step, sets the learning rate, sums the
loss, logs every ``train.log_every`` steps and updates its progress bar. Runs alternate
(bare, loop, bare, loop, ...) so drift in machine load hits both alike; the medians are compared, and
the median of the ratios within each round (paired: its runs ran back to back).
The Trainer's tokens/s excludes its evaluation, as in summary.json. Target: ratio >= 0.90.

Checkpoint cost: the same Trainer writing a training checkpoint every ``--checkpoint-every`` steps
(default: ``train.checkpoint_every``'s default) into a temp folder, as a run does (snapshot to CPU,
written by a background thread, fsynced, renamed). Its tokens/s counts the checkpoints' time.
Target: >= 0.97 of the Trainer without checkpoints (needs --steps above --checkpoint-every).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from timing import sync

from zoo import compose
from zoo.core.auxiliary import aux_weights
from zoo.lab.planning.run_model import build_run_model
from zoo.lab.planning.train_config import TrainConfig, check_run_config
from zoo.lab.records.checkpoint_writers import CheckpointWriter
from zoo.lab.tasks import build_task
from zoo.lab.training.callbacks import RunContext
from zoo.lab.training.loop_callbacks import run_callbacks
from zoo.lab.training.step import Stepper
from zoo.lab.training.trainer import Trainer, make_optimizer


def bare_tokens_per_s(cfg, task, train_cfg: TrainConfig, device: torch.device, steps: int) -> float:
    """Tokens/s of the trainer's own step (zoo.lab.training.step: autocast, loss, clipping, optimizer) alone."""
    torch.manual_seed(0)
    model = build_run_model(cfg).to(device)
    optimizer = make_optimizer(model, train_cfg)
    batch = task.train_batch(train_cfg.batch_size, torch.Generator().manual_seed(0)).to(device)
    step = Stepper(model, model, optimizer, device, train_cfg.grad_clip, aux_weights(model, train_cfg.aux_weights))
    sync(device)
    start = time.perf_counter()  # the first step counts on both sides (first-call allocations included)
    for _ in range(steps):
        step(batch)
    sync(device)
    return steps * train_cfg.batch_size * task.seq_len / (time.perf_counter() - start)


def loop_tokens_per_s(cfg, task, train_cfg: TrainConfig, device: torch.device, folder: Path | None = None) -> float:
    """The Trainer's tokens/s; with ``folder``, writing checkpoints there every train_cfg.checkpoint_every steps."""
    torch.manual_seed(0)
    model = build_run_model(cfg)
    writer = CheckpointWriter(folder, config_hash="benchmark") if folder is not None else None
    callbacks = run_callbacks(RunContext(train_cfg, {"progress": False}, save_checkpoint=writer), [])  # zoo-train's
    trainer = Trainer(model, task, train_cfg, device=device, data_seed=0, callbacks=callbacks)
    outcome = trainer.fit()
    if writer is None:
        return outcome.tokens_per_s
    waited = time.perf_counter()
    writer.close()  # a write still in flight when training ends counts too
    return outcome.tokens / (outcome.train_time_s + time.perf_counter() - waited)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--checkpoint-every", type=int, default=TrainConfig.checkpoint_every)
    parser.add_argument("overrides", nargs="*", help="extra zoo overrides, e.g. preset=llama")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = compose(
        [
            f"block.d_model={args.d_model}",
            f"block.n_heads={args.heads}",
            f"model.n_layers={args.layers}",
            f"task.seq_len={args.seq_len}",
            "task.max_bytes=1000000",
            f"train.batch_size={args.batch}",
            f"train.steps={args.steps}",
            "train.eval_every=0",
            "train.eval_batches=1",
            f"device={args.device}",
            *args.overrides,
        ]
    )
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(cfg, resolve=True)
    train_cfg, device = check_run_config(raw)
    task = build_task(raw["task"])
    saving = replace(train_cfg, checkpoint_every=args.checkpoint_every)
    bare, loop, saved = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            bare.append(bare_tokens_per_s(raw, task, train_cfg, device, args.steps))
            loop.append(loop_tokens_per_s(raw, task, replace(train_cfg, checkpoint_every=0), device))
            saved.append(loop_tokens_per_s(raw, task, saving, device, Path(tmp) / str(i)))
    b, lo, sv = statistics.median(bare), statistics.median(loop), statistics.median(saved)
    print(
        f"model: d_model={args.d_model} layers={args.layers} T={args.seq_len} batch={args.batch} "
        f"device={args.device} threads={torch.get_num_threads()} {' '.join(args.overrides)}"
    )
    print("| loop | tokens/s (median) | all repeats |")
    print("|---|---|---|")
    print(f"| bare fwd+bwd+step | {b:,.0f} | {', '.join(f'{x:,.0f}' for x in bare)} |")
    print(f"| zoo Trainer | {lo:,.0f} | {', '.join(f'{x:,.0f}' for x in loop)} |")
    every = args.checkpoint_every
    print(f"| zoo Trainer + checkpoints every {every} | {sv:,.0f} | {', '.join(f'{x:,.0f}' for x in saved)} |")
    # Each round's three runs ran back to back: the ratio within a round is paired, free of slower drift.
    paired_loop = statistics.median(x / y for x, y in zip(loop, bare, strict=True))
    paired_saved = statistics.median(x / y for x, y in zip(saved, loop, strict=True))
    print(f"ratio Trainer / bare: {lo / b:.3f} of medians, {paired_loop:.3f} median per round (target >= 0.90)")
    written = args.steps // args.checkpoint_every - (args.steps % args.checkpoint_every == 0)
    print(
        f"ratio with checkpoints / without: {sv / lo:.3f} of medians, {paired_saved:.3f} median per round "
        f"(target >= 0.97; {written} checkpoint{'s' if written != 1 else ''} per run)"
    )


if __name__ == "__main__":
    main()
