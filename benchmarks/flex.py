"""block.attn.backend=flex against sdpa with an explicit mask: a sliding window and packed documents.

    python benchmarks/flex.py --device cuda --dtype bfloat16 --backward    # the device check (a CUDA GPU)
    python benchmarks/flex.py --lengths 64 128 --heads 2 --head-dim 16     # CPU, forward only, unfused-scale sizes

Each step is one causal self-attention of ``--heads`` query heads over ``--kv-heads`` key/value heads: ``sdpa``
builds zoo's boolean mask (zoo.parts.kernels.allowed_mask, and the document mask), turns it into the additive
float mask and calls torch's scaled_dot_product_attention with it, as ``block.attn.backend=sdpa`` does; ``flex``
is zoo's FlexAttention path (zoo.parts.flex: the block mask from the slots, the window and the documents, made
each step) under ``torch.compile(fullgraph=True)``, its tensors the compiled function's inputs. Documents are
``--docs`` of equal length per sample. Prints a Markdown table of median milliseconds and sdpa / flex (above 1:
flex is faster), and the largest difference of the outputs (both compute the same function).

On CPU torch has no FlexAttention backward (``--backward`` is refused) and inductor's CPU kernel is a
reference for correctness more than speed; on CUDA flex is the path for windows and document masks.
"""

from __future__ import annotations

import argparse

import torch
from einops import rearrange, repeat
from timing import time_interleaved

from zoo.parts.flex import flex_attend, slot_mask
from zoo.parts.kernels import additive, allowed_mask, attend


def flex_kernel(q, k, v, slots, same, window: int | None) -> torch.Tensor:  # noqa: ANN001
    """zoo's flex path for a causal mask with ``window`` and the document mask ``same`` (or None)."""
    mod = slot_mask(slots, causal=True, window=window, key_mask=None, documents=same)
    return flex_attend(q, k, v, mask_mod=mod, batched=same is not None)


def sdpa_kernel(q, k, v, slots, same, window: int | None) -> torch.Tensor:  # noqa: ANN001
    """zoo's sdpa path: the boolean mask, the additive float mask, then SDPA with it."""
    mask = allowed_mask(slots, slots, True, None, window)
    mask = mask if same is None else mask & same
    return attend(q, k, v, additive(mask, None, q.dtype), is_causal=False, backend="sdpa")


def documents(batch: int, length: int, docs: int, device: str) -> torch.Tensor:
    """(b, 1, t, t) bool: ``docs`` documents of equal length per sample (the last one takes the remainder)."""
    ids = (torch.arange(length, device=device) * docs // length).clamp(max=docs - 1)
    ids = repeat(ids, "t -> b t", b=batch)
    return rearrange(ids, "b q -> b 1 q 1") == rearrange(ids, "b k -> b 1 1 k")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--window", type=int, default=512, help="the sliding window (keys per query)")
    parser.add_argument("--docs", type=int, default=8, help="documents per sample")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--backward", action="store_true", help="time forward and backward (CUDA only)")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if args.backward and args.device == "cpu":
        parser.error("--backward needs a CUDA device: torch has no FlexAttention backward on CPU")
    dtype = getattr(torch, args.dtype)
    compiled = torch.compile(flex_kernel, fullgraph=True, dynamic=False)
    mode = "forward + backward" if args.backward else "forward"
    print(f"{args.device} {args.dtype}, batch {args.batch}, {args.heads} heads over {args.kv_heads}, "
          f"head_dim {args.head_dim}, {mode}, median of {args.repeats}\n")  # fmt: skip
    print("| mask | length | sdpa ms | flex ms | sdpa / flex | max abs difference |")
    print("|---|---|---|---|---|---|")
    for mask_name in ("window", "documents"):
        for length in args.lengths:
            torch.manual_seed(0)
            shape = (args.batch, args.heads, length, args.head_dim)
            kv = (args.batch, args.kv_heads, length, args.head_dim)
            q, k, v = (torch.randn(s, device=args.device, dtype=dtype, requires_grad=args.backward)
                       for s in (shape, kv, kv))  # fmt: skip
            slots = torch.arange(length, device=args.device)
            window = args.window if mask_name == "window" else None
            same = documents(args.batch, length, args.docs, args.device) if mask_name == "documents" else None

            def step(kernel, q=q, k=k, v=v, slots=slots, same=same, window=window):  # noqa: ANN001, ANN202
                with torch.set_grad_enabled(args.backward):
                    y = kernel(q, k, v, slots, same, window)
                    if args.backward:
                        y.float().square().sum().backward()
                return y

            times = time_interleaved({"sdpa": lambda: step(sdpa_kernel), "flex": lambda: step(compiled)},
                                     args.device, args.repeats)  # fmt: skip
            with torch.no_grad():
                diff = (step(sdpa_kernel).float() - step(compiled).float()).abs().max().item()
            print(f"| {mask_name} | {length} | {times['sdpa'] * 1e3:.3f} | {times['flex'] * 1e3:.3f} | "
                  f"{times['sdpa'] / times['flex']:.2f} | {diff:.2e} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
