"""Training throughput of each model-family preset beside ``preset=llama`` at matched parameters, in one process.

    python benchmarks/presets.py                                  # every family preset at its own size, CPU
    python benchmarks/presets.py --presets gemma3 gpt_oss --repeats 5
    python benchmarks/presets.py --match active                   # Llama matched to each preset's active parameters
    python benchmarks/presets.py --device cuda --batch 32 --seq-len 512
    python benchmarks/presets.py --variants base: bigram:model.ngram=2 wide:block.d_ff=415 --seq-len 64 --batch 24 \
        --threads 1 +sweeps=bigram                                # named variants of one model, against the first

Each preset trains at the size its option file sets (conf/preset/<name>.yaml) on the bytes task's batches; its
Llama peer has the same depth, with the d_model (a multiple of 16, 8 heads) whose parameter count is nearest
the preset's total (``--match total``, the default) or active (``--match active``: what a token uses; the two
differ for a mixture of experts). Both run the trainer's own step (zoo.lab.training.step: loss, auxiliary
losses, backward, clipping, AdamW), on one fixed batch, timed round-robin across every model (the median of
``--repeats`` rounds of ``--steps`` steps), so drift in machine load hits all alike. Prints a Markdown table: each
model's parameters, training FLOPs per token, tokens/s, and the preset / its Llama peer ratio of tokens/s
(below 1: the family costs more per token on this machine).

``--variants NAME:OVERRIDE,... ...`` times named variants of the model the positional overrides compose (a sweep's,
with ``+sweeps=NAME``) in place of the presets, the same step round-robin, against the first variant: each one's
parameters (an n-gram table's apart: it is a lookup, no FLOP), FLOPs per token, ms per step, tokens/s and its
step time over the first's (above 1: slower), with the load average before and after.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import OmegaConf
from timing import time_interleaved

from zoo import compose
from zoo.core.auxiliary import aux_weights
from zoo.lab.planning.run_model import build_run_model
from zoo.lab.planning.train_config import check_run_config
from zoo.lab.tasks import build_task
from zoo.lab.training.step import Stepper
from zoo.lab.training.trainer import make_optimizer

PRESETS = Path(__file__).resolve().parent.parent / "conf" / "preset"
#: The presets that are not one released family's model (the classic blocks and the peer itself).
CLASSICS = ("llama", "gpt", "vaswani")


def family_presets() -> list[str]:
    """Every preset in conf/preset that names a model family (not a classic block)."""
    return sorted(p.stem for p in PRESETS.glob("*.yaml") if p.stem not in CLASSICS)


def run_config(overrides: list[str], args: argparse.Namespace) -> dict:
    """The resolved run config of ``overrides`` on the bytes task at the benchmark's batch and length."""
    common = [f"task.seq_len={args.seq_len}", "task.max_bytes=1000000", f"train.batch_size={args.batch}",
              f"device={args.device}", "train.eval_every=0"]  # fmt: skip
    return OmegaConf.to_container(compose([*overrides, *common]), resolve=True)


def counts(raw: dict) -> tuple[int, int]:
    """(total, active) parameters of the model ``raw`` builds."""
    model = build_run_model(raw)
    return model.num_parameters(), model.num_active_parameters()


def matched_llama(raw: dict, target: int, args: argparse.Namespace) -> list[str]:
    """The overrides of the Llama of ``raw``'s depth whose parameter count is nearest ``target``."""
    layers = raw["model"]["n_layers"]
    best: tuple[int, list[str]] | None = None
    for d_model in range(32, 4097, 16):
        overrides = ["preset=llama", f"block.d_model={d_model}", "block.n_heads=8", f"model.n_layers={layers}"]
        total = counts(run_config(overrides, args))[0]
        if best is None or abs(total - target) < abs(best[0] - target):
            best = (total, overrides)
        if total > target:
            break
    assert best is not None
    return best[1]


def train_step(raw: dict, device: torch.device) -> tuple[Callable[[], None], int]:
    """One training step of ``raw``'s model on a fixed batch (the trainer's own step), and its FLOPs per token."""
    train_cfg, _ = check_run_config(raw)
    task = build_task(raw["task"])
    torch.manual_seed(0)
    model = build_run_model(raw).to(device)
    optimizer = make_optimizer(model, train_cfg)
    batch = task.train_batch(train_cfg.batch_size, torch.Generator().manual_seed(0)).to(device)
    step = Stepper(model, model, optimizer, device, train_cfg.grad_clip, aux_weights(model, train_cfg.aux_weights))
    return lambda: step(batch), model.flops_per_token(task.seq_len)


def parse_variants(specs: list[str]) -> dict[str, list[str]]:
    """``["base:", "bigram:model.ngram=2", "wide:block.d_ff=415,block.bias=false"]`` -> {name: overrides}."""
    variants = {}
    for spec in specs:
        name, sep, overrides = spec.partition(":")
        if not sep or not name or name in variants:
            raise SystemExit(f"--variants: {spec!r} is not NAME:OVERRIDE,... with a new NAME (base: for none)")
        variants[name] = [o for o in overrides.split(",") if o]
    return variants


def load() -> str:
    """The 1-, 5- and 15-minute load averages."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def run_variants(args: argparse.Namespace, device: torch.device) -> None:
    """Each named variant's training step against the first's, round-robin in this process."""
    variants = parse_variants(args.variants)
    steps, rows = {}, {}
    before = load()
    for name, overrides in variants.items():
        raw = run_config([*args.overrides, *overrides], args)
        step, flops = train_step(raw, device)
        steps[name] = lambda step=step: [step() for _ in range(args.steps)]
        rows[name] = (build_run_model(raw).parameter_counts(), flops)
    seconds = time_interleaved(steps, device, args.repeats)
    tokens = args.steps * args.batch * args.seq_len
    first = next(iter(variants))
    print(f"T={args.seq_len} batch={args.batch} device={args.device} threads={torch.get_num_threads()} "
          f"steps={args.steps} repeats={args.repeats} {' '.join(args.overrides)}")  # fmt: skip
    print(f"load average {before} before, {load()} after")
    columns = "parameters | of them n-gram | training FLOPs/token | ms/step | tokens/s"
    print(f"| variant | {columns} | step time / {first} |")
    print("|---|---|---|---|---|---|---|")
    for name, (counted, flops) in rows.items():
        ms, rate, ratio = 1e3 * seconds[name] / args.steps, tokens / seconds[name], seconds[name] / seconds[first]
        print(f"| {name} | {counted['total']:,} | {counted.get('ngram', 0):,} | {flops:,} | {ms:.2f} | {rate:,.0f} | "
              f"{ratio:.3f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="*", default=None, help="default: every family preset in conf/preset")
    parser.add_argument("--match", choices=("total", "active"), default="total")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3, help="steps per timed call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--variants", nargs="+", default=None, help="NAME:OVERRIDE,... each (the first the baseline), "
                        "in place of the presets")  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="overrides for every preset, e.g. model.n_layers=4")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.variants:
        run_variants(args, device)
        return
    presets = args.presets if args.presets is not None else family_presets()
    rows, steps, peers = {}, {}, {}
    for preset in presets:
        raw = run_config([f"preset={preset}", *args.overrides], args)
        total, active = counts(raw)
        peer = matched_llama(raw, total if args.match == "total" else active, args)
        peer_name = f"llama {peer[1].split('=')[1]} x {raw['model']['n_layers']}"
        for name, config in ((preset, raw), (peer_name, run_config(peer, args))):
            if name in steps:
                continue
            step, flops = train_step(config, device)
            steps[name] = lambda step=step: [step() for _ in range(args.steps)]
            rows[name] = (*counts(config), flops)
        peers[preset] = peer_name
    seconds = time_interleaved(steps, device, args.repeats)
    tokens = args.steps * args.batch * args.seq_len
    print(f"T={args.seq_len} batch={args.batch} device={args.device} threads={torch.get_num_threads()} "
          f"match={args.match} steps={args.steps} repeats={args.repeats} {' '.join(args.overrides)}")  # fmt: skip
    print("| model | parameters | active | training FLOPs/token | tokens/s | / its Llama |")
    print("|---|---|---|---|---|---|")
    for preset in presets:
        for name in (preset, peers[preset]):
            total, active, flops = rows[name]
            rate = tokens / seconds[name]
            ratio = f"{rate / (tokens / seconds[peers[preset]]):.2f}" if name == preset else ""
            print(f"| {name} | {total:,} | {active:,} | {flops:,} | {rate:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
