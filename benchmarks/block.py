"""Forward+backward time of one block, side by side with the peers a user would pick instead.

    python benchmarks/block.py                      # CPU, float32, batch 8, T 256, d_model 512
    python benchmarks/block.py --memory             # also: peak memory of sdpa vs math at T 4096
    python benchmarks/block.py --parts              # also: alibi and sliding windows beside rotary
    python benchmarks/block.py --mixers             # also: linear attention vs softmax at T 4096, time and memory
    python benchmarks/block.py --cache              # also: decoding-state bytes per token, MLA vs MHA and GQA
    python benchmarks/block.py --moe                # also: mlp=moe (8 experts, top-2) vs per-expert loops and dense
    python benchmarks/block.py --outputs-only --d-model 128 --n-heads 4 --batch 8 --time 256
                                                    # tokens/s of a 2-layer model with each attention output option
    python benchmarks/block.py --residuals-only --d-model 96 --n-heads 4 --batch 24 --time 64 --threads 1
                                                    # tokens/s of the residual sweep's model with each residual option
    python benchmarks/block.py --device cuda --dtype bfloat16 --d-model 2048 --time 2048

Peers come from the ``bench`` extra (``pip install -e ".[bench]"``); a missing peer is skipped.
Prints a Markdown table with each time and the zoo/peer ratio (below 1.0: zoo is faster).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable

import torch
from timing import time_interleaved
from torch import nn

import zoo

Step = Callable[[], None]


def fwd_bwd(module: nn.Module, x: torch.Tensor, call: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Step:
    if x.is_floating_point():
        x = x.detach().requires_grad_()
    run = call or module

    def step() -> None:
        module.zero_grad(set_to_none=True)
        x.grad = None
        run(x).float().square().mean().backward()

    return step


def zoo_block(preset: str, args: argparse.Namespace, *choices: str, **block: object) -> nn.Module:
    overrides = [f"preset={preset}", f"block.d_model={args.d_model}", f"block.n_heads={args.n_heads}", *choices]
    overrides += [f"block.{k}={v}" for k, v in block.items()]
    return zoo.build_block(zoo.compose(overrides).block, context="model")  # positions a model adds: not the block's


def llama_peer(args: argparse.Namespace, d_ff: int) -> tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=args.d_model,
        intermediate_size=d_ff,
        num_attention_heads=args.n_heads,
        num_key_value_heads=2,
        max_position_embeddings=max(args.time, 4096),
    )
    config._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(config, layer_idx=0)
    rotary = LlamaRotaryEmbedding(config)

    def call(x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)[None]
        out = layer(x, position_ids=positions, position_embeddings=rotary(x, positions))
        return out[0] if isinstance(out, tuple) else out

    return layer, call


def gpt_peers(args: argparse.Namespace) -> dict[str, tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor] | None]]:
    peers: dict[str, tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor] | None]] = {}
    torch_layer = nn.TransformerEncoderLayer(
        args.d_model, args.n_heads, 4 * args.d_model, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
    )

    def torch_call(x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device, dtype=x.dtype)
        return torch_layer(x, src_mask=mask, is_causal=True)

    peers["torch TransformerEncoderLayer"] = (torch_layer, torch_call)
    try:
        from x_transformers import Decoder

        peers["x-transformers Decoder"] = (
            Decoder(dim=args.d_model, depth=1, heads=args.n_heads, attn_flash=True),
            None,
        )
    except ImportError:
        print("x-transformers not installed: skipped (pip install -e '.[bench]')", file=sys.stderr)
    return peers


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def run_speed(args: argparse.Namespace) -> None:
    device, dtype = args.device, getattr(torch, args.dtype)
    x = torch.randn(args.batch, args.time, args.d_model, device=device, dtype=dtype)
    llama_block = zoo_block("llama", args)
    # (name, module, call, name of the zoo block it is compared with)
    contenders: list[tuple[str, nn.Module, Callable[[torch.Tensor], torch.Tensor] | None, str | None]] = [
        ("zoo gpt (sdpa)", zoo_block("gpt", args), None, None),
        *[(name, module, call, "zoo gpt (sdpa)") for name, (module, call) in gpt_peers(args).items()],
        ("zoo llama (sdpa)", llama_block, None, None),
    ]
    try:
        module, call = llama_peer(args, llama_block.mlp.down.in_features)
        contenders.append(("HF LlamaDecoderLayer (sdpa)", module, call, "zoo llama (sdpa)"))
    except ImportError:
        print("transformers not installed: skipped (pip install -e '.[bench]')", file=sys.stderr)

    steps = {name: fwd_bwd(module.to(device, dtype), x, call) for name, module, call, _ in contenders}
    seconds = time_interleaved(steps, device, args.repeats, warmup=2)

    print(
        f"\nforward+backward, {args.device} {args.dtype}, batch {args.batch}, T {args.time}, "
        f"d_model {args.d_model}, {args.n_heads} heads, {torch.get_num_threads()} threads, "
        f"median of {args.repeats}\n"
    )
    print("| block | parameters | ms | TFLOP/s | zoo / peer |")
    print("|---|---:|---:|---:|---:|")
    for name, module, _, against in contenders:
        flops = 3 * 2 * count(module) * x.shape[0] * x.shape[1]  # matmul FLOPs of fwd+bwd, attention scores aside
        ratio = f"{seconds[against] / seconds[name]:.2f}" if against else ""
        print(
            f"| {name} | {count(module):,} | {seconds[name] * 1e3:.1f} | {flops / seconds[name] / 1e12:.2f} | {ratio} |"
        )


def fused_only(step: Step) -> str:
    """``fused`` if ``step`` runs with SDPA's materializing math backend disabled, else ``math``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
            step()
    except RuntimeError:
        return "math (fallback)"
    return "fused"


def run_parts(args: argparse.Namespace) -> None:
    """Position schemes and windows beside rotary, on the llama block: time and SDPA path."""
    device, dtype = args.device, getattr(torch, args.dtype)
    x = torch.randn(args.batch, args.time, args.d_model, device=device, dtype=dtype)
    window = max(1, args.time // 4)
    variants = {
        "rotary": [],
        "alibi": ["pos=alibi"],
        "none": ["pos=none"],
        f"rotary, window {window}": [f"block.attn.window={window}"],
        f"alibi, window {window}": ["pos=alibi", f"block.attn.window={window}"],
        "rotary, qk_norm": ["block.attn.qk_norm=rmsnorm"],
        "rotary, rotary_fraction 0.25": ["block.pos.rotary_fraction=0.25"],
    }
    steps = {name: fwd_bwd(zoo_block("llama", args, *c).to(device, dtype), x) for name, c in variants.items()}
    paths = {name: fused_only(step) for name, step in steps.items()}
    seconds = time_interleaved(steps, device, args.repeats, warmup=2)
    print(f"\nzoo llama block by position scheme, forward+backward, T {args.time} ({args.device} {args.dtype})\n")
    print("| pos / attention | ms | / rotary | SDPA path |\n|---|---:|---:|---|")
    for name in variants:
        ratio = seconds[name] / seconds["rotary"]
        print(f"| {name} | {seconds[name] * 1e3:.1f} | {ratio:.2f} | {paths[name]} |")


def moe_loops(layer: nn.Module) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Two per-expert loops over ``layer``'s own router and experts, the way one writes a mixture of
    experts first: every expert on every token, weighted by a gate that is zero where it was not
    chosen (dense), or every expert on the tokens that chose it, found with a mask (masked)."""
    from zoo.parts.moe import route

    def gates(flat: torch.Tensor) -> torch.Tensor:
        logits = flat.float() @ layer.router.weight.float().T
        weights, chosen, _ = route(logits, layer.top_k, layer.routing)
        dense = torch.zeros_like(logits).scatter(1, chosen, weights)  # (n, experts), zero where not chosen
        return dense.to(flat.dtype)

    def dense_loop(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (b t, d)
        gate = gates(flat)
        y = torch.zeros_like(flat)
        for e, expert in enumerate(layer.experts):
            y = y + gate[:, e : e + 1] * expert(flat)
        return y.view_as(x)

    def masked_loop(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (b t, d)
        gate = gates(flat)
        y = torch.zeros_like(flat)
        for e, expert in enumerate(layer.experts):
            tokens = gate[:, e].nonzero().squeeze(-1)
            y = y.index_add(0, tokens, gate[tokens, e : e + 1] * expert(flat[tokens]))
        return y.view_as(x)

    return {"per-expert loop, every token (dense gates)": dense_loop, "per-expert loop, masked tokens": masked_loop}


def run_moe(args: argparse.Namespace) -> None:
    """mlp=moe (grouped by expert) against per-expert loops over the same weights, and against the dense
    SwiGLU MLP with as many active parameters (hidden width top_k x the expert's)."""
    device, dtype = args.device, getattr(torch, args.dtype)
    x = torch.randn(args.batch, args.time, args.d_model, device=device, dtype=dtype)
    options = [f"block.mlp.n_experts={args.experts}", f"block.mlp.top_k={args.top_k}"]
    layer = zoo_block("llama", args, "mlp=moe", *options).mlp.to(device, dtype)
    dense = zoo_block("llama", args, "mlp=swiglu", d_ff=args.top_k * layer.hidden).mlp.to(device, dtype)
    loops = moe_loops(layer)
    with torch.no_grad():
        for name, loop in loops.items():  # the same function, or the timing compares nothing
            error = (loop(x).float() - layer(x).float()).abs().max().item()
            assert error < (1e-4 if dtype == torch.float32 else 5e-2), f"{name} differs from mlp=moe by {error}"
    steps = {"zoo mlp=moe (grouped)": fwd_bwd(layer, x)}
    steps |= {name: fwd_bwd(layer, x, loop) for name, loop in loops.items()}
    steps[f"dense swiglu, d_ff {dense.hidden} (equal active)"] = fwd_bwd(dense, x)
    seconds = time_interleaved(steps, device, args.repeats, warmup=2)
    active = layer.active_parameters()
    print(
        f"\nmlp=moe, {args.experts} experts, top-{args.top_k}, swiglu experts of width {layer.hidden}: fwd+bwd, "
        f"{args.device} {args.dtype}, batch {args.batch}, T {args.time}, d_model {args.d_model}, "
        f"{torch.get_num_threads()} threads, median of {args.repeats}\n"
    )
    print("| MLP | parameters | active | ms | time / zoo mlp=moe |\n|---|---:|---:|---:|---:|")
    fast = seconds["zoo mlp=moe (grouped)"]
    for name, step_seconds in seconds.items():
        total = count(dense) if name.startswith("dense") else count(layer)
        used = total if name.startswith("dense") else active
        print(f"| {name} | {total:,} | {used:,} | {step_seconds * 1e3:.1f} | {step_seconds / fast:.2f} |")
    dense_loop = seconds["per-expert loop, every token (dense gates)"]
    print(f"\nspeedup over the per-expert loop on every token: {dense_loop / fast:.2f}x (target >= 3)")
    print(f"moe / dense MLP of equal active parameters: {fast / seconds[next(iter(reversed(seconds)))]:.2f}")


#: The attention output options --outputs times (zoo.parts.head_outputs), each against none.
OUTPUT_OPTIONS = {
    "none": [],
    "gate=headwise": ["block.attn.gate=headwise"],
    "gate=elementwise": ["block.attn.gate=elementwise"],
    "sink=learned": ["block.attn.sink=learned"],
    "xsa=true": ["block.attn.xsa=true"],
    "all three (elementwise)": ["block.attn.gate=elementwise", "block.attn.sink=learned", "block.attn.xsa=true"],
    "none, again": [],  # the same model twice: how far apart equal work times here
}


#: The residual-stream options --residuals times (block.residual, the value residual, value embeddings), each
#: against add, in the residual sweep's model (sweeps/residual.yaml: 4 layers, rotary, GELU, MHA).
RESIDUAL_OPTIONS = {
    "add": [],
    "scaled": ["residual=scaled"],
    "hyper (4 streams)": ["residual=hyper"],
    "hyper, dynamic": ["residual=hyper", "block.residual.dynamic=true"],
    "mHC (hyper, 20 Sinkhorn iterations)": ["residual=hyper", "block.residual.sinkhorn_iters=20"],
    "value residual (learned)": ["block.attn.value_residual=learned"],
    "value embeddings": ["model.value_embeddings=true"],
    "add, again": [],  # the same model twice: how far apart equal work times here
}


def run_outputs(args: argparse.Namespace) -> None:
    """The attention output options in a 2-layer llama model, each against none."""
    base = ["preset=llama", "model.n_layers=2"]
    time_options(args, "attention output options, 2-layer llama model", "block.attn", OUTPUT_OPTIONS, base)


def run_residuals(args: argparse.Namespace) -> None:
    """The residual-stream options in the residual sweep's 4-layer model, each against add."""
    base = ["pos=rotary", "model.n_layers=4"]
    time_options(args, "residual-stream options, the residual sweep's 4-layer model", "option", RESIDUAL_OPTIONS, base)


def time_options(
    args: argparse.Namespace, title: str, column: str, options: dict[str, list[str]], base: list[str]
) -> None:
    """Training tokens/s (forward + backward over next-token logits) of a model with each option against the
    first, in one process, round-robin; beside each, its flops_per_token over the first's."""
    device, dtype = args.device, getattr(torch, args.dtype)
    ids = torch.randint(0, 256, (args.batch, args.time), device=device)
    steps, models = {}, {}
    for name, chosen in options.items():
        overrides = [*base, f"block.d_model={args.d_model}", f"block.n_heads={args.n_heads}", *chosen]
        torch.manual_seed(0)
        model = zoo.build_model(zoo.compose([*overrides, "model.vocab_size=256"]))
        models[name] = model.to(device, dtype)
        steps[name] = fwd_bwd(model, ids, lambda tokens, m=model: m(tokens))
    seconds = time_interleaved(steps, device, args.repeats, warmup=2)
    tokens = args.batch * args.time
    print(
        f"\n{title}, training forward+backward, {device} {args.dtype}, batch {args.batch}, T {args.time}, "
        f"d_model {args.d_model}, {args.n_heads} heads, {torch.get_num_threads()} threads, median of {args.repeats}\n"
    )
    first = next(iter(options))
    print(f"| {column} | parameters | tokens/s | tokens/s / {first} | flops_per_token / {first} |")
    print("|---|---:|---:|---:|---:|")
    base_flops = models[first].flops_per_token(args.time)
    for name, model in models.items():
        rate, flops = tokens / seconds[name], model.flops_per_token(args.time) / base_flops
        ratio = seconds[first] / seconds[name]
        print(f"| {name} | {count(model):,} | {rate:,.0f} | {ratio:.3f} | {flops:.4f} |")


def rss_bytes(field: str) -> int:
    """A memory field of /proc/self/status (VmRSS: now, VmHWM: peak since the last reset), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_memory_child(args: argparse.Namespace) -> None:
    """Run one fwd+bwd at --time and print the peak memory it needed above the model's (bytes)."""
    device = args.device
    block = zoo_block("gpt", args, **{"attn.backend": args.backend}).to(device)
    x = torch.randn(1, args.time, args.d_model, device=device, requires_grad=True)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = rss_bytes("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak-RSS high-water mark (Linux)
    block(x).square().mean().backward()
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = rss_bytes("VmHWM") - base
    print(json.dumps({"peak_bytes": peak}))


def run_memory(args: argparse.Namespace) -> None:
    peaks = {}
    for backend in ("sdpa", "math"):
        command = [
            sys.executable,
            __file__,
            "--memory-child",
            "--backend",
            backend,
            "--device",
            args.device,
            "--time",
            str(args.memory_time),
            "--d-model",
            str(args.d_model),
            "--n-heads",
            str(args.n_heads),
        ]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        peaks[backend] = json.loads(out.strip().splitlines()[-1])["peak_bytes"]
    print(f"\npeak memory of one fwd+bwd, batch 1, T {args.memory_time}, gpt block ({args.device})\n")
    print("| backend | peak MiB |\n|---|---:|")
    for backend, peak in peaks.items():
        print(f"| {backend} | {peak / 2**20:.0f} |")
    print(f"\nsdpa / math peak memory: {peaks['sdpa'] / peaks['math']:.2f}")


#: Sequence mixers compared by --mixers: softmax attention (fused SDPA) and linear attention's chunked form.
MIXERS = {
    "softmax gqa (sdpa)": [],
    "linear (chunked)": ["attn=linear"],
    "linear, gated (chunked)": ["attn=linear", "block.attn.decay=gated"],
}


def mixer_peak_child(args: argparse.Namespace) -> None:
    """One fwd+bwd of the mixer --mixer alone at --time, batch 1: print its peak memory above the model's."""
    attn = zoo_block("llama", args, *MIXERS[args.mixer]).attn.to(args.device)
    x = torch.randn(1, args.time, args.d_model, device=args.device, requires_grad=True)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = rss_bytes("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    attn(x).square().mean().backward()
    peak = torch.cuda.max_memory_allocated() - base if args.device == "cuda" else rss_bytes("VmHWM") - base
    print(json.dumps({"peak_bytes": peak}))


def run_mixers(args: argparse.Namespace) -> None:
    """Linear attention's chunked form vs softmax attention (fused SDPA), the mixer alone: fwd+bwd time
    at --mixer-time, and peak memory at a quarter, half and all of it (linear in T: doubling T doubles it)."""
    device, dtype, time = args.device, getattr(torch, args.dtype), args.mixer_time
    x = torch.randn(1, time, args.d_model, device=device, dtype=dtype)
    steps = {name: fwd_bwd(zoo_block("llama", args, *c).attn.to(device, dtype), x) for name, c in MIXERS.items()}
    seconds = time_interleaved(steps, device, args.mixer_repeats, warmup=1)
    lengths = [time // 4, time // 2, time]
    peaks: dict[str, list[int]] = {}
    for name in MIXERS:
        for length in lengths:
            command = [sys.executable, __file__, "--mixer-child", "--mixer", name, "--device", device]
            command += ["--time", str(length), "--d-model", str(args.d_model), "--n-heads", str(args.n_heads)]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            peaks.setdefault(name, []).append(json.loads(out.strip().splitlines()[-1])["peak_bytes"])
    softmax = next(iter(MIXERS))
    print(
        f"\nsequence mixer alone, forward+backward, batch 1, T {time}, d_model {args.d_model}, {args.n_heads} heads "
        f"({device} {args.dtype}, {torch.get_num_threads()} threads, median of {args.mixer_repeats}; "
        f"peak memory float32)\n"
    )
    head = " | ".join(f"peak MiB T {n}" for n in lengths)
    print(f"| mixer | ms | softmax / this | {head} | memory T {time} / T {time // 2} |")
    print("|---|---:|---:|" + "---:|" * len(lengths) + "---:|")
    for name in MIXERS:
        mib = " | ".join(f"{p / 2**20:.0f}" for p in peaks[name])
        growth = peaks[name][2] / peaks[name][1]
        print(f"| {name} | {seconds[name] * 1e3:.1f} | {seconds[softmax] / seconds[name]:.2f} | {mib} | {growth:.2f} |")


def run_cache(args: argparse.Namespace) -> None:
    """Bytes of decoding state per token and layer, measured from a 1-layer model after --cache-tokens tokens."""
    tokens, batch = args.cache_tokens, 1
    choices = {
        "mha": ["attn=mha"],
        "gqa (2 kv heads)": ["attn=gqa"],
        "mqa": ["attn=mqa"],
        "mla (kv_rank 4 d_head)": ["attn=mla"],
        "mla (kv_rank 2 d_head)": ["attn=mla", f"block.attn.kv_rank={2 * args.d_model // args.n_heads}"],
        "linear (constant)": ["attn=linear"],
    }
    measured = {}
    for name, chosen in choices.items():
        overrides = ["preset=llama", f"block.d_model={args.d_model}", f"block.n_heads={args.n_heads}", *chosen]
        overrides += ["model.n_layers=1", "model.vocab_size=256"]
        model = zoo.build_model(zoo.compose(overrides)).eval()
        caches = model.new_caches(max_len=tokens)
        with torch.no_grad():
            model(torch.randint(0, 256, (batch, tokens)), caches=caches)
        measured[name] = caches[0].nbytes / (batch * tokens)
    print(f"\ndecoding state per token and layer after {tokens} tokens, d_model {args.d_model}, {args.n_heads} heads, "
          "float32\n")  # fmt: skip
    print("| mixer | bytes / token | / mha | / gqa |\n|---|---:|---:|---:|")
    for name, size in measured.items():
        ratio_mha, ratio_gqa = size / measured["mha"], size / measured["gqa (2 kv heads)"]
        print(f"| {name} | {size:.1f} | {ratio_mha:.3f} | {ratio_gqa:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--time", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--n-heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--memory", action="store_true", help="also measure sdpa vs math peak memory")
    parser.add_argument("--memory-time", type=int, default=4096)
    parser.add_argument("--parts", action="store_true", help="also time alibi and windows beside rotary")
    parser.add_argument("--mixers", action="store_true", help="also time linear attention against softmax")
    parser.add_argument("--mixer-time", type=int, default=4096)
    parser.add_argument("--mixer-repeats", type=int, default=3)
    parser.add_argument("--cache", action="store_true", help="also measure decoding-state bytes per token")
    parser.add_argument("--cache-tokens", type=int, default=256)
    parser.add_argument("--moe", action="store_true", help="also time mlp=moe against per-expert loops and dense")
    parser.add_argument("--moe-only", action="store_true", help="time only mlp=moe (no block peers)")
    parser.add_argument("--outputs", action="store_true", help="also time the attention output options")
    parser.add_argument("--outputs-only", action="store_true", help="time only the attention output options")
    parser.add_argument("--residuals-only", action="store_true", help="time only the residual-stream options")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mixer-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mixer", default=next(iter(MIXERS)), help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="sdpa", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        peak_memory_child(args)
        return
    if args.mixer_child:
        mixer_peak_child(args)
        return
    torch.manual_seed(0)
    if args.residuals_only:
        run_residuals(args)
        return
    if not (args.moe_only or args.outputs_only):
        run_speed(args)
    if args.outputs or args.outputs_only:
        run_outputs(args)
    if args.moe or args.moe_only:
        run_moe(args)
    if args.parts:
        run_parts(args)
    if args.memory:
        run_memory(args)
    if args.mixers:
        run_mixers(args)
    if args.cache:
        run_cache(args)


if __name__ == "__main__":
    main()
