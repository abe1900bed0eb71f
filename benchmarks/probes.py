"""What probes cost: a run with ``train.probe_every`` against the same run without, side by side in one process.

    python benchmarks/probes.py                      # the quick sweep's run (sweeps/quick.yaml), 200 steps
    python benchmarks/probes.py --repeats 5 --probe-every 10 --threads 1

Both sides are the quick sweep's run (d_model 64, 4 heads, 2 layers, seq_len 64, batch 24, evaluation every
50 steps, threads=1), trained by ``zoo.lab.training.run.run`` into a temporary folder as ``zoo-train`` trains it
(checks, data, model, training, evaluations, checkpoints, final weights). Runs alternate (plain,
probed, plain, ...) so drift in machine load hits both alike. Reported: each side's median wall time,
the median per round of probed / plain (paired: back to back), and the probes' own time (summed around
each probe record) over the probed run's whole time and over its ``Trainer.fit`` alone (the loop:
training, evaluations, probes), in wall and in this process's CPU seconds (on a busy machine the CPU
share is the steadier figure; with one thread it is the work). Target: at probe_every=10 probes cost
at most 5% of the run's time.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from zoo import compose
from zoo.lab.training.loop_callbacks import Probing
from zoo.lab.training.run import run
from zoo.lab.training.trainer import Trainer

#: Seconds (wall, CPU) of the current run: the whole run, its fit, its probes.
SPENT: dict[str, list[float]] = {}


def timed(name: str, function: Any) -> Any:
    """``function`` adding its wall and CPU seconds to ``SPENT[name]``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            SPENT[name][0] += time.perf_counter() - wall
            SPENT[name][1] += time.process_time() - cpu

    return wrapper


def one_run(raw: dict, folder: Path) -> dict[str, list[float]]:
    """{"run", "fit", "probes": [wall s, CPU s]} of one run of ``raw`` into ``folder``."""
    SPENT.update({name: [0.0, 0.0] for name in ("run", "fit", "probes")})
    summary = timed("run", run)(raw, folder)
    assert summary["status"] == "ok", summary.get("error")
    return {name: list(values) for name, values in SPENT.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    common = [
        "task=bytes", f"block.d_model={args.d_model}", f"block.n_heads={args.heads}", f"model.n_layers={args.layers}",
        f"task.seq_len={args.seq_len}", f"train.batch_size={args.batch}", f"train.steps={args.steps}",
        "train.warmup_steps=20", f"train.eval_every={args.eval_every}", f"threads={args.threads}", "progress=false",
        *args.overrides,
    ]  # fmt: skip
    configs = {every: OmegaConf.to_container(compose([*common, f"train.probe_every={every}"]), resolve=True)
               for every in (0, args.probe_every)}  # fmt: skip
    Trainer.fit = timed("fit", Trainer.fit)  # type: ignore[method-assign]
    Probing.on_step_end = timed("probes", Probing.on_step_end)  # type: ignore[method-assign]
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            rounds.append({every: one_run(cfg, Path(tmp) / f"{every}-{i}") for every, cfg in configs.items()})
    plain, probed = ([r[every]["run"][0] for r in rounds] for every in configs)
    median = statistics.median
    size = f"d_model={args.d_model} heads={args.heads} layers={args.layers} T={args.seq_len} batch={args.batch}"
    print(f"model: {size} steps={args.steps} threads={torch.get_num_threads()} {' '.join(args.overrides)}")
    print("| run | wall s (median) | all repeats |")
    print("|---|---|---|")
    print(f"| probe_every=0 | {median(plain):.3f} | {', '.join(f'{x:.3f}' for x in plain)} |")
    count = args.steps // args.probe_every + (args.steps % args.probe_every > 0)
    print(f"| probe_every={args.probe_every} ({count} probes) | {median(probed):.3f} | "
          f"{', '.join(f'{x:.3f}' for x in probed)} |")  # fmt: skip
    p = args.probe_every
    for k, unit in ((0, "wall"), (1, "CPU")):
        ratio = median(r[p]["run"][k] / r[0]["run"][k] for r in rounds)
        of_run = median(r[p]["probes"][k] / r[p]["run"][k] for r in rounds)
        of_fit = median(r[p]["probes"][k] / r[p]["fit"][k] for r in rounds)
        print(f"{unit}: probed / plain {ratio:.3f}; probes' own time {100 * of_run:.2f}% of the run, "
              f"{100 * of_fit:.2f}% of its fit (median; target <= 5%)")  # fmt: skip


if __name__ == "__main__":
    main()
