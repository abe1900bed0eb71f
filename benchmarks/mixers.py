"""Training tokens/s of whole small models that differ only in their sequence mixer, in one process.

    python benchmarks/mixers.py                       # CPU, 2 layers, d_model 128, 4 heads, T 256, batch 8
    python benchmarks/mixers.py --seq-len 1024 --chunk 64
    python benchmarks/mixers.py --device cuda --dtype bfloat16 --seq-len 2048 --batch 16
    python benchmarks/mixers.py --layers 4 --match     # with the 3:1 hybrid, every MLP matched to mha's block

Each model (``preset=llama`` with the mixer swapped in) runs the same training step: forward, cross
entropy, backward and an AdamW step, on the same random batch. Steps are timed round-robin (drift in
machine load hits every model alike); the table gives the median's tokens/s, each model's over the
first's, its FLOPs per token (``model.flops_per_token``) and the rate they make. From 4 layers on, a hybrid
joins them: Gated DeltaNet with full attention (mha) at every fourth layer (3 : 1, as Qwen3.5). ``--match``
sizes every MLP so each block has the parameters of an mha block (``block.mlp.match=params``).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from timing import time_interleaved
from torch import nn

import zoo

#: The mixers compared (the first is the baseline of the ratios).
MIXERS = {
    "mha (softmax, sdpa)": ["attn=mha"],
    "linear (chunked)": ["attn=linear"],
    "linear, gated (chunked)": ["attn=linear", "block.attn.decay=gated"],
    "gated_deltanet (chunked)": ["attn=gated_deltanet"],
}


#: The hybrid's name: Gated DeltaNet, every fourth layer full attention.
HYBRID = "hybrid 3 gated_deltanet : 1 mha"


def mixers(layers: int) -> dict[str, list[str]]:
    """The mixers compared at ``layers`` layers: :data:`MIXERS`, and the 3 : 1 hybrid from 4 layers on."""
    full = [f"+model.layers.{i}.attn=mha" for i in range(3, layers, 4)]
    return {**MIXERS, HYBRID: ["attn=gated_deltanet", *full]} if full else dict(MIXERS)


def build(args: argparse.Namespace, choices: list[str]) -> nn.Module:
    overrides = ["preset=llama", f"block.d_model={args.d_model}", f"block.n_heads={args.heads}"]
    overrides += [f"model.n_layers={args.layers}", f"model.vocab_size={args.vocab}", *choices]
    if args.match:
        overrides += ["block.mlp.match=params", "block.mlp.match_attn=mha"]
    if args.chunk and choices != MIXERS["mha (softmax, sdpa)"]:
        overrides.append(f"block.attn.chunk={args.chunk}")
    torch.manual_seed(0)
    return zoo.build_model(zoo.compose(overrides)).to(args.device, getattr(torch, args.dtype))


def training_step(model: nn.Module, ids: torch.Tensor):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        logits = model(ids[:, :-1])
        F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten()).backward()
        optimizer.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=None, help="block.attn.chunk of the linear mixers")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--match", action="store_true", help="every block at an mha block's parameters")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), device=args.device)
    models = {name: build(args, choices) for name, choices in mixers(args.layers).items()}
    seconds = time_interleaved({name: training_step(m, ids) for name, m in models.items()}, args.device, args.repeats)
    tokens = args.batch * args.seq_len
    base = next(iter(MIXERS))
    print(f"\ntraining step (forward, backward, AdamW), {args.layers} layers, d_model {args.d_model}, {args.heads} "
          f"heads, batch {args.batch}, T {args.seq_len} ({args.device} {args.dtype}, {torch.get_num_threads()} "
          f"threads, median of {args.repeats}{'; MLPs matched to mha blocks' if args.match else ''})\n")  # fmt: skip
    print(f"| mixer | parameters | tokens/s | / {base} | FLOPs / token | GFLOP/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, model in models.items():
        rate = tokens / seconds[name]
        flops = model.flops_per_token(args.seq_len)
        print(f"| {name} | {model.num_parameters():,} | {rate:,.0f} | {seconds[base] / seconds[name]:.2f} | "
              f"{flops:,} | {rate * flops / 1e9:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
