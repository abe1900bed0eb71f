"""Training throughput per parallel layout, side by side: one process, DDP, FSDP2 and tensor parallelism.

    python benchmarks/scale.py                                   # CPU, 2 processes (gloo), a small llama
    python benchmarks/scale.py --d-model 128 --layers 2 --steps 10 --repeats 2   # a quick check
    python benchmarks/scale.py --device cuda --layouts one --d-model 2048 --layers 16 --heads 16 \
        --kv-heads 16 --seq-len 2048 --batch 4 --compile --hf    # one GPU: MFU, and HF Llama beside it

Every layout trains the same model (``preset=llama`` at the given sizes, same init) with the trainer's step
(zoo/lab/training/step.py: bf16 autocast on CUDA, clipping, AdamW) on
random tokens at the same global batch (``--batch`` sequences of ``--seq-len`` tokens per step):

- ``one``: one process with every thread (``--threads``, default: the machine's cores);
- ``ddp``: ``--world`` processes, each ``batch / world`` sequences, gradients all-reduced (DDP);
- ``fsdp``: the same with parameters, gradients and optimizer state sharded (FSDP2, ``parallel.dp_shard``);
- ``tp``: ``--world`` processes sharing each batch, every block split by its parts' plans
  (``parallel.tp``, sequence parallel).

Each multi-process layout runs in its own ``torch.multiprocessing`` group (gloo on CPU, NCCL on
CUDA), the processes splitting the threads. Layouts alternate for ``--repeats`` rounds (one, ddp,
fsdp, tp, one, ...) so drift in machine load hits all alike; medians are compared. tokens/s counts
the global batch; model FLOP/s = tokens/s x the model's FLOPs per token (6 N + attention); MFU
divides by ``--peak-flops`` (or the device's bf16 peak, looked up for known GPUs).
Targets: CPU, FSDP2 at 2 processes >= 0.8 of DDP's tokens/s; one H100/H200, d_model 2048, T 2048,
bf16, compiled: MFU >= 0.45 and >= 1.0x Hugging Face ``LlamaForCausalLM``'s tokens/s.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from timing import sync

#: Dense bf16 peak FLOP/s of GPUs by name fragment (vendor data sheets, without sparsity).
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12, "RTX 4090": 165e12}

LAYOUTS = ("one", "ddp", "fsdp", "tp")


def config(args: argparse.Namespace) -> Any:
    from zoo import compose

    overrides = [
        "preset=llama",
        f"block.d_model={args.d_model}",
        f"block.n_heads={args.heads}",
        f"block.attn.n_kv_heads={args.kv_heads}",
        f"model.n_layers={args.layers}",
        f"model.vocab_size={args.vocab}",
        f"block.max_len={args.seq_len}",
    ]
    return compose(overrides)


def parallel_of(layout: str, world: int) -> Any:
    from zoo.lab.planning.mesh import ProcessMesh

    return {
        "one": ProcessMesh(),
        "ddp": ProcessMesh(dp_replicate=world),
        "fsdp": ProcessMesh(dp_shard=world),
        "tp": ProcessMesh(tp=world),
    }[layout]


def train_rate(args: argparse.Namespace, layout: str, rank: int, world: int) -> float:
    """Tokens/s of the global batch over ``args.steps`` timed steps (after ``args.warmup``), this rank's view."""
    from zoo.core.auxiliary import aux_weights
    from zoo.lab.planning.run_model import build_run_model
    from zoo.lab.planning.train_config import TrainConfig
    from zoo.lab.tasks import Batch
    from zoo.lab.training.scale import compile_blocks, parallelize
    from zoo.lab.training.step import Stepper
    from zoo.lab.training.trainer import make_optimizer

    device = torch.device(args.device, rank if args.device == "cuda" and world > 1 else 0)
    cfg = config(args)
    torch.manual_seed(0)
    model = core = build_run_model(cfg).to(device)
    parallel = parallel_of(layout, world)
    if layout == "ddp":
        if args.compile:
            compile_blocks(model)
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif parallel.sharded:
        parallelize(model, parallel, parallel.mesh(args.device), compile=args.compile,
                    mixed_precision=args.device == "cuda")  # fmt: skip
    elif args.compile:
        compile_blocks(model)
    train_cfg = TrainConfig(lr=1e-4)
    # The trainer's step (zoo/lab/training/step.py): autocast on CUDA in every layout, as a run trains.
    step_fn = Stepper(model, core, make_optimizer(core, train_cfg), device, train_cfg.grad_clip,
                      aux_weights(core, train_cfg.aux_weights))  # fmt: skip
    rows = args.batch // parallel.dp
    generator = torch.Generator().manual_seed(1 + parallel.dp_rank(rank))
    ids = torch.randint(0, args.vocab, (rows, args.seq_len + 1), generator=generator).to(device)
    batch = Batch(ids[:, :-1], ids[:, 1:])

    def step() -> None:
        step_fn(batch)

    for _ in range(args.warmup):
        step()
    sync(device)
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync(device)
    if world > 1:
        dist.barrier()
    return args.steps * args.batch * args.seq_len / (time.perf_counter() - start)


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, layout: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(max(1, args.threads // world))
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=rank, world_size=world)
    try:
        rate = train_rate(args, layout, rank, world)
        if rank == 0:
            Path(out).write_text(str(rate))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(args: argparse.Namespace, layout: str) -> float:
    """One timed run of ``layout``: in this process for ``one``, else in ``args.world`` fresh processes."""
    if layout == "one":
        torch.set_num_threads(args.threads)
        return train_rate(args, layout, 0, 1)
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "rate")
        mp.start_processes(_worker, args=(args.world, free_port(), args, layout, out), nprocs=args.world,
                           start_method="spawn", join=True)  # fmt: skip
        return float(Path(out).read_text())


def hf_rate(args: argparse.Namespace, hidden: int) -> float:
    """Tokens/s of Hugging Face's LlamaForCausalLM with the same shapes (MLP width ``hidden``), one process."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.d_model, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         intermediate_size=hidden, max_position_embeddings=args.seq_len,
                         attn_implementation="sdpa")  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(args.device)
    if args.compile:
        for layer in model.model.layers:
            layer.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=args.device == "cuda")
    ids = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1)).to(args.device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.device == "cuda")

    def step() -> None:
        with autocast:
            logits = model(ids[:, :-1]).logits
        torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    sync(args.device)
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync(args.device)
    return args.steps * args.batch * args.seq_len / (time.perf_counter() - start)


def peak_flops(args: argparse.Namespace) -> float | None:
    if args.peak_flops:
        return args.peak_flops
    if args.device == "cuda":
        name = torch.cuda.get_device_name()
        return next((peak for key, peak in PEAK_BF16.items() if key in name), None)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    parser.add_argument("--world", type=int, default=2, help="processes of the ddp, fsdp and tp layouts")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8, help="global batch, sequences per step")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation, allocations)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the layouts")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads in all, split by process")
    parser.add_argument("--compile", action="store_true", help="compile each block (compile=true)")
    parser.add_argument("--hf", action="store_true", help="also time LlamaForCausalLM, one process")
    parser.add_argument("--peak-flops", type=float, default=None, help="peak FLOP/s for MFU (default: known GPUs)")
    args = parser.parse_args()
    if args.batch % args.world:
        parser.error(f"--batch {args.batch} must be a multiple of --world {args.world} (the data-parallel split)")
    if args.device == "cuda" and args.world > torch.cuda.device_count() and set(args.layouts) - {"one"}:
        parser.error(f"--world {args.world} needs as many GPUs; this machine has {torch.cuda.device_count()}")

    from zoo import ConfigError
    from zoo.lab.planning.run_model import build_run_model
    from zoo.models.config import block_section, model_options, stack_specs

    if "tp" in args.layouts:  # heads, vocabulary and length must split between the tp ranks: checked up front
        cfg = config(args)
        options = model_options(cfg)
        specs = stack_specs(block_section(cfg), options)
        try:
            parallel_of("tp", args.world).check_model(specs, args.vocab, [args.seq_len])
        except ConfigError as error:
            parser.error(str(error))
    with torch.device("meta"):  # sizes only: no weights allocated
        model = build_run_model(config(args))
    flops_per_token, hidden = model.flops_per_token(args.seq_len), model.blocks[0].mlp.hidden
    print(f"model: preset=llama d_model={args.d_model} layers={args.layers} heads={args.heads}/{args.kv_heads} "
          f"vocab={args.vocab} T={args.seq_len} global batch={args.batch} device={args.device} "
          f"threads={args.threads} world={args.world} compile={args.compile}")  # fmt: skip
    rates: dict[str, list[float]] = {layout: [] for layout in args.layouts}
    if args.hf:
        rates["hf llama"] = []
    for round_ in range(args.repeats):
        for name in rates:
            rate = hf_rate(args, hidden) if name == "hf llama" else measure(args, name)
            rates[name].append(rate)
            print(f"  round {round_ + 1}/{args.repeats} {name}: {rate:,.0f} tokens/s", flush=True)
    peak = peak_flops(args)
    first = args.layouts[0]
    print(f"\n| layout | processes | tokens/s (median) | model TFLOP/s | MFU | vs {first} | vs ddp |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    medians = {name: statistics.median(r) for name, r in rates.items()}
    for name, rate in medians.items():
        flops = rate * flops_per_token
        mfu = f"{flops / peak:.3f}" if peak else "n/a"
        ddp = f"{rate / medians['ddp']:.2f}" if "ddp" in medians else ""
        processes = 1 if name in ("one", "hf llama") else args.world
        ratio = rate / medians[first]
        print(f"| {name} | {processes} | {rate:,.0f} | {flops / 1e12:.4f} | {mfu} | {ratio:.2f} | {ddp} |")
    print(f"\nmedians of {args.repeats} round(s) of {args.steps} timed steps; each round's values: the lines above"
          + ("" if peak else "; MFU needs --peak-flops (peaks are known for GPUs only)"))  # fmt: skip


if __name__ == "__main__":
    main()
