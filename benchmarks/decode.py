"""Decoding speed and KV-cache memory: zoo with and without its cache, its compiled static-shape
step (zoo.StaticDecoder), and Hugging Face Llama.

    python benchmarks/decode.py                              # 4 layers, d_model 512, 8 heads, 512 + 256 tokens
    python benchmarks/decode.py --prompt 64 --new 16 --contexts 16 128 --steps 8   # a quick check
    python benchmarks/decode.py --device cuda --dtype bfloat16

The zoo model is the llama preset (RMSNorm, rotary, SwiGLU, no biases) with ``--kv-heads``
key/value heads; the peer is ``transformers.LlamaForCausalLM`` of the same sizes, built offline
from a LlamaConfig with zoo's weights copied in, so both do the same arithmetic and must
generate the same greedy tokens. Prints a Markdown table with each measurement and its target.

At batch 1 a step reads every weight and the cache once, so its floor is those bytes over the
memory bandwidth, measured here by summing a tensor far larger than the caches.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
from timing import time_interleaved

import zoo
from zoo.parts.attention import split_qkv
from zoo.parts.mlps import split_gate_up


def row(name: str, value: str, target: str = "") -> None:
    """One table row, printed at once (a full run takes minutes)."""
    print(f"| {name} | {value} | {target} |", flush=True)


def zoo_model(args: argparse.Namespace, kv_heads: int) -> zoo.LanguageModel:
    cfg = zoo.compose(
        [
            "preset=llama",
            f"block.d_model={args.d_model}",
            f"block.n_heads={args.n_heads}",
            f"block.attn.n_kv_heads={kv_heads}",
            f"model.n_layers={args.layers}",
            f"model.vocab_size={args.vocab}",
            "model.tie_embeddings=false",
        ]
    )
    return zoo.build_model(cfg).to(args.device, getattr(torch, args.dtype)).eval()


def hf_llama(model: zoo.LanguageModel, args: argparse.Namespace) -> torch.nn.Module:
    """LlamaForCausalLM of the same sizes holding ``model``'s weights (rotary: split halves in both)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    first = model.blocks[0]
    kv_heads = first.attn.n_kv_heads
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.d_model,
        intermediate_size=first.mlp.down.in_features,
        num_hidden_layers=args.layers,
        num_attention_heads=args.n_heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max(args.prompt + args.new, *args.contexts) + args.steps + 8,
        rms_norm_eps=first.placement.norms[0].eps,
        rope_theta=first.attn.position.base,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
    )
    config._attn_implementation = "sdpa"
    hf = LlamaForCausalLM(config)
    weights = {"model.embed_tokens.weight": model.embed.weight, "lm_head.weight": model.head.weight}
    weights["model.norm.weight"] = model.final_norm.weight
    for i, block in enumerate(model.blocks):
        q, k, v = split_qkv(block.attn.qkv.weight, args.n_heads, kv_heads)
        gate, up = split_gate_up(block.mlp.gate_up.weight)
        prefix = f"model.layers.{i}."
        weights |= {prefix + "self_attn.q_proj.weight": q, prefix + "self_attn.k_proj.weight": k}
        weights |= {prefix + "self_attn.v_proj.weight": v, prefix + "self_attn.o_proj.weight": block.attn.out.weight}
        weights |= {prefix + "mlp.gate_proj.weight": gate, prefix + "mlp.up_proj.weight": up}
        weights |= {prefix + "mlp.down_proj.weight": block.mlp.down.weight}
        weights |= {prefix + "input_layernorm.weight": block.placement.norms[0].weight}
        weights |= {prefix + "post_attention_layernorm.weight": block.placement.norms[1].weight}
    missing, unexpected = hf.load_state_dict({k: v.detach().float() for k, v in weights.items()}, strict=False)
    if unexpected or [m for m in missing if "rotary" not in m]:
        raise RuntimeError(f"weight mapping is off: missing {missing}, unexpected {unexpected}")
    hf.generation_config.eos_token_id = None  # always generate every requested token
    hf.generation_config.pad_token_id = 0
    return hf.to(args.device, getattr(torch, args.dtype)).eval()


@torch.no_grad()
def static_per_token_seconds(
    model: zoo.LanguageModel, contexts: list[int], args: argparse.Namespace
) -> dict[int, tuple[float, float]]:
    """Per context: seconds per step of the growing cache (eager) and of StaticDecoder's compiled
    step, timed round-robin (the static cache holds max(contexts) + steps slots at every context)."""
    decoder = zoo.StaticDecoder(model, max(contexts) + args.steps, compile=not args.no_compile)
    out = {}
    for context in contexts:
        steps = decoding_steps(model, decoder, context, args)
        seconds = time_interleaved(steps, args.device, args.repeats)
        out[context] = (seconds["eager"] / args.steps, seconds["static"] / args.steps)
    return out


def decoding_steps(
    model: zoo.LanguageModel, decoder: zoo.StaticDecoder, context: int, args: argparse.Namespace
) -> dict[str, Callable[[], None]]:
    """``args.steps`` decoding steps after ``context`` cached tokens, through the growing cache
    (``eager``) and the decoder's static step (``static``); each run first rewinds to the context."""
    prompt = torch.randint(0, args.vocab, (args.batch, context), device=args.device)
    token = prompt[:, -1:]
    decoder.generate(prompt, 2)  # prefill; compiles the step on the first call
    positions = [torch.full((args.batch, 1), context + i, device=args.device) for i in range(args.steps)]
    caches = model.new_caches(context + args.steps)
    model(prompt, caches=caches)

    def static() -> None:
        for cache in decoder.caches:
            cache.truncate(context)
        for i in range(args.steps):
            decoder.step(token, positions[i], None)

    def eager() -> None:
        for cache in caches:
            cache.truncate(context)
        for _ in range(args.steps):
            model(token, caches=caches)

    return {"eager": eager, "static": static}


@torch.no_grad()
def matvec_seconds(model: zoo.LanguageModel, args: argparse.Namespace) -> float:
    """Seconds for one product of every weight matrix but the embedding with a batch-1 vector: what a
    step costs on this device's matrix-vector kernels, with no other op and no Python around them."""
    weights = [m.weight for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    weights += [model.embed.weight] if model.head is None else []  # a tied head reads the embedding
    vectors = [torch.randn(args.batch, w.shape[1], device=args.device, dtype=w.dtype) for w in weights]

    def products() -> None:
        for w, x in zip(weights, vectors, strict=True):
            torch.nn.functional.linear(x, w)

    return time_interleaved({"products": products}, args.device, args.repeats)["products"]


def read_bandwidth(device: str, megabytes: int = 1024) -> float:
    """Bytes per second read by summing a float32 tensor of ``megabytes`` (median of 5)."""
    x = torch.ones(megabytes * 2**20 // 4, device=device)
    seconds = time_interleaved({"sum": x.sum}, device, 5)["sum"]
    return x.numel() * 4 / seconds


def bytes_per_step(model: zoo.LanguageModel, context: int, args: argparse.Namespace) -> int:
    """Bytes a decoding step must read at batch ``args.batch``: every weight but the embedding table
    (one row of it) and the state of ``context`` cached tokens."""
    weights = sum(p.numel() * p.element_size() for name, p in model.named_parameters() if not name.startswith("embed"))
    element = next(model.parameters()).element_size()
    state = sum(block.attn.state_size(context) for block in model.blocks) * args.batch * element
    return weights + model.embed.weight[0].numel() * element + state


@torch.no_grad()
def cache_bytes(model: zoo.LanguageModel, args: argparse.Namespace) -> int:
    caches = model.new_caches(args.prompt + args.new)
    model(torch.randint(0, args.vocab, (args.batch, args.prompt), device=args.device), caches=caches)
    return sum(cache.nbytes for cache in caches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--n-heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2, help="key/value heads of the timed models")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    parser.add_argument("--new", type=int, default=256, help="generated tokens")
    parser.add_argument("--contexts", type=int, nargs=2, default=[64, 1024], help="short and long cached contexts")
    parser.add_argument("--steps", type=int, default=32, help="decoding steps timed at each context")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--uncached-repeats", type=int, default=1, help="repeats of the (slow) uncached run; 0 skips it"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face peer")
    parser.add_argument("--no-compile", action="store_true", help="time the static step uncompiled")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model = zoo_model(args, args.kv_heads)
    prompt = torch.randint(0, args.vocab, (args.batch, args.prompt), device=args.device)
    print(
        f"\ndecoding, {args.device} {args.dtype}, {torch.get_num_threads()} threads, batch {args.batch}, "
        f"{args.layers} layers, d_model {args.d_model}, {args.n_heads} heads ({args.kv_heads} kv), "
        f"vocab {args.vocab}, prompt {args.prompt}, {args.new} new tokens, greedy\n"
    )
    print("| measurement | value | target |\n|---|---:|---:|", flush=True)

    steps: dict[str, Callable[[], object]] = {"zoo": lambda: model.generate(prompt, args.new)}
    if not args.no_hf:
        try:
            hf = hf_llama(model, args)
        except ImportError:
            print("transformers not installed: HF peer skipped (pip install -e '.[bench]')", file=sys.stderr)
        else:
            mask = torch.ones_like(prompt)

            def hf_generate() -> torch.Tensor:
                kwargs = {"max_new_tokens": args.new, "do_sample": False, "use_cache": True}
                return hf.generate(prompt, attention_mask=mask, **kwargs)[:, args.prompt :]

            steps["hf"] = hf_generate
    seconds = time_interleaved(steps, args.device, args.repeats)
    row(f"zoo generate {args.new} tokens, cache", f"{seconds['zoo']:.3f} s")
    if "hf" in seconds:
        same = torch.equal(steps["hf"](), steps["zoo"]())
        row(f"HF LlamaForCausalLM generate {args.new} tokens, cache", f"{seconds['hf']:.3f} s")
        row("zoo / HF time", f"{seconds['zoo'] / seconds['hf']:.2f}", "<= 1.0")
        row("same greedy tokens as HF (same weights)", "yes" if same else "no", "yes")

    short, long = args.contexts
    per_token = static_per_token_seconds(model, [short, long], args)  # growing cache and static step, per context
    (t_short, _), (t_long, _) = per_token[short], per_token[long]
    row(f"per-token time {long} / {short}", f"{t_long / t_short:.2f}", "<= 2")

    bandwidth = read_bandwidth(args.device)
    row("measured read bandwidth", f"{bandwidth / 1e9:.1f} GB/s")
    kind = "eager static step" if args.no_compile else "compiled static step"
    products = matvec_seconds(model, args)
    row("matrix-vector products alone (every weight once)", f"{products * 1e3:.2f} ms")
    for context, (eager, static) in per_token.items():
        floor = bytes_per_step(model, context, args) / bandwidth
        row(f"floor per token, context {context} (bytes read / bandwidth)", f"{floor * 1e3:.2f} ms")
        row(f"growing cache (eager), context {context}", f"{eager * 1e3:.2f} ms ({eager / floor:.2f}x floor)")
        row(f"{kind}, context {context}", f"{static * 1e3:.2f} ms ({static / floor:.2f}x floor)", "<= 1.5x (GPU)")
        row(f"{kind} / growing cache, context {context}", f"{static / eager:.2f}", "< 1")
        row(f"{kind} / matrix-vector products alone, context {context}", f"{static / products:.2f}")

    mha = cache_bytes(zoo_model(args, args.n_heads), args)
    gqa = cache_bytes(zoo_model(args, 2), args)
    row(f"KV cache bytes, MHA ({args.n_heads} kv heads)", f"{mha:,}")
    row("KV cache bytes, GQA (2 kv heads)", f"{gqa:,}")
    row("GQA / MHA cache bytes", f"{gqa / mha:.4f}", f"{2 / args.n_heads:.4f}")

    # Last: minutes at full size. No warm-up run; each run is long enough for that not to matter.
    if args.uncached_repeats < 1:
        return
    uncached = time_interleaved(
        {"uncached": lambda: model.generate(prompt, args.new, use_cache=False)},
        args.device,
        args.uncached_repeats,
        warmup=0,
    )["uncached"]
    row(f"zoo generate {args.new} tokens, no cache", f"{uncached:.3f} s")
    row("speedup of the cache", f"{uncached / seconds['zoo']:.1f}x", ">= 10x")


if __name__ == "__main__":
    main()
