"""Decoding speed and KV-cache memory: zoo with and without its cache, and Hugging Face Llama.

    python benchmarks/decode.py                              # 4 layers, d_model 512, 8 heads, 512 + 256 tokens
    python benchmarks/decode.py --prompt 64 --new 16 --contexts 16 128 --steps 8   # a quick check
    python benchmarks/decode.py --device cuda --dtype bfloat16

The zoo model is the llama preset (RMSNorm, rotary, SwiGLU, no biases) with ``--kv-heads``
key/value heads; the peer is ``transformers.LlamaForCausalLM`` of the same sizes, built offline
from a LlamaConfig with zoo's weights copied in, so both do the same arithmetic and must
generate the same greedy tokens. Prints a Markdown table with each measurement and its target.
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
def per_token_seconds(model: zoo.LanguageModel, context: int, args: argparse.Namespace) -> float:
    """Seconds per cached decoding step with ``context`` tokens already in the cache (median of repeats)."""
    prompt = torch.randint(0, args.vocab, (args.batch, context), device=args.device)
    token = prompt[:, -1:]
    caches = model.new_caches(context + args.steps)

    def run() -> None:
        for cache in caches:
            cache.truncate(context)  # drop the previous run's steps; the prompt stays cached
        for _ in range(args.steps):
            model(token, caches=caches)

    model(prompt, caches=caches)
    return time_interleaved({"steps": run}, args.device, args.repeats)["steps"] / args.steps


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
    t_short, t_long = per_token_seconds(model, short, args), per_token_seconds(model, long, args)
    row(f"zoo per-token time, context {short}", f"{t_short * 1e3:.2f} ms")
    row(f"zoo per-token time, context {long}", f"{t_long * 1e3:.2f} ms")
    row(f"per-token time {long} / {short}", f"{t_long / t_short:.2f}", "<= 2")

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
