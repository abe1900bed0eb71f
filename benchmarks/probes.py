"""What probes cost: a run with ``train.probe_every`` against the same run without, side by side in one process.

    python benchmarks/probes.py                      # the quick sweep's size (sweeps/quick.yaml), 200 steps
    python benchmarks/probes.py --repeats 5 --probe-every 10 --threads 1

Both sides are the quick sweep's run (d_model 64, 4 heads, 2 layers, seq_len 64, batch 24, evaluation every
50 steps): the Trainer built and fitted from the same seed, wall time around ``fit()`` (training, the
evaluations, and on the probed side every probe). Runs alternate (plain, probed, plain, ...) so drift
in machine load hits both alike. Reported: each side's median wall time, the median per round of
probed / plain (paired: back to back), and the probes' own time (summed around each probe record)
over the probed run's, in wall and in this process's CPU seconds (on a busy machine the CPU share is the
steadier figure; with one thread it is the work). Target: probes at probe_every=10 cost at most 5% of the run's time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch
from omegaconf import OmegaConf

from zoo import build_model, compose
from zoo.lab.tasks import build_task
from zoo.lab.trainer import TrainConfig, Trainer, check_run_config


def fit_seconds(
    raw: dict, task, train_cfg: TrainConfig, device: torch.device
) -> tuple[float, float, float, float, int]:
    """(wall s of Trainer.fit, its CPU s, wall s spent in probes, their CPU s, probe records) for one run
    of ``train_cfg`` (CPU: this process's, which a busy machine's other work does not inflate)."""
    torch.manual_seed(0)
    model = build_model(raw)
    records: list[dict] = []
    trainer = Trainer(model, task, train_cfg, device=device, data_seed=0, progress=False, log=records.append)
    spent = [0.0, 0.0]
    probe = trainer.probe

    def timed(step: int) -> float:
        cpu = time.process_time()
        took = probe(step)
        spent[0] += took
        spent[1] += time.process_time() - cpu
        return took

    trainer.probe = timed  # type: ignore[method-assign]
    start, cpu = time.perf_counter(), time.process_time()
    trainer.fit()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return wall, cpu, spent[0], spent[1], sum(r["kind"] == "probe" for r in records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=24)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--probe-every", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the quick sweep runs on 1)")
    parser.add_argument("overrides", nargs="*", help="extra zoo overrides, e.g. block.attn.qk_norm=rmsnorm")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = compose([
        "task=bytes", f"block.d_model={args.d_model}", f"block.n_heads={args.heads}", f"model.n_layers={args.layers}",
        f"task.seq_len={args.seq_len}", f"train.batch_size={args.batch}", f"train.steps={args.steps}",
        "train.warmup_steps=20", f"train.eval_every={args.eval_every}", f"device={args.device}", *args.overrides,
    ])  # fmt: skip
    raw = OmegaConf.to_container(cfg, resolve=True)
    train_cfg, device = check_run_config(raw)
    task = build_task(raw["task"])
    plain, probed, spent, spent_cpu, ratios, ratios_cpu = [], [], [], [], [], []
    for _ in range(args.repeats):
        base, base_cpu, _, _, _ = fit_seconds(raw, task, replace(train_cfg, probe_every=0), device)
        wall, cpu, probes_s, probes_cpu, count = fit_seconds(
            raw, task, replace(train_cfg, probe_every=args.probe_every), device
        )
        plain.append(base)
        probed.append(wall)
        spent.append(probes_s / wall)
        spent_cpu.append(probes_cpu / cpu)
        ratios.append(wall / base)
        ratios_cpu.append(cpu / base_cpu)
    print(
        f"model: d_model={args.d_model} heads={args.heads} layers={args.layers} T={args.seq_len} batch={args.batch} "
        f"steps={args.steps} device={args.device} threads={torch.get_num_threads()} {' '.join(args.overrides)}"
    )
    print("| run | wall s (median) | all repeats |")
    print("|---|---|---|")
    print(f"| probe_every=0 | {statistics.median(plain):.3f} | {', '.join(f'{x:.3f}' for x in plain)} |")
    print(
        f"| probe_every={args.probe_every} ({count} probes) | {statistics.median(probed):.3f} | "
        f"{', '.join(f'{x:.3f}' for x in probed)} |"
    )
    median = statistics.median
    print(f"ratio probed / plain: {median(ratios):.3f} wall, {median(ratios_cpu):.3f} CPU, median per round")
    print(
        f"probes' own time / the probed run's: {100 * median(spent):.2f}% wall, {100 * median(spent_cpu):.2f}% CPU, "
        "median (target <= 5%)"
    )


if __name__ == "__main__":
    main()
