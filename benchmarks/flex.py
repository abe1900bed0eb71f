"""block.attn.backend=flex against sdpa with an explicit mask: a sliding window and packed documents.

    python benchmarks/flex.py --device cuda --dtype bfloat16 --backward    # the device check (a CUDA GPU)
    python benchmarks/flex.py --lengths 64 128 --heads 2 --head-dim 16     # CPU, forward only, unfused-scale sizes
    python benchmarks/flex.py --uncompiled --lengths 6 --heads 4 --kv-heads 4 --head-dim 4 --window 3 --docs 2
                                                                           # the contract's sizes, uncompiled
    python benchmarks/flex.py --uncompiled-paths --lengths 6 --heads 4 --kv-heads 4 --head-dim 4 --window 3 --docs 2

Each step is one causal self-attention of ``--heads`` query heads over ``--kv-heads`` key/value heads: ``sdpa``
builds zoo's boolean mask (zoo.parts.kernels.allowed_mask, and the document mask), turns it into the additive
float mask and calls torch's scaled_dot_product_attention with it, as ``block.attn.backend=sdpa`` does; ``flex``
is zoo's FlexAttention path (zoo.parts.flex: the block mask from the slots, the window and the documents, made
each step) under ``torch.compile(fullgraph=True)``, its tensors the compiled function's inputs. Documents are
``--docs`` of equal length per sample. Prints a Markdown table of median milliseconds and sdpa / flex (above 1:
flex is faster), and the largest difference of the outputs (both compute the same function).

On CPU torch has no FlexAttention backward (``--backward`` is refused) and inductor's CPU kernel is a
reference for correctness more than speed; on CUDA flex is the path for windows and document masks.

``--uncompiled`` times zoo's flex path as it runs uncompiled (the contract's "backends agree"): its block mask with
every block partial (zoo.parts.flex.block_mask_of) against torch's ``create_block_mask`` of the same mask, which
evaluates the mask once more to find blocks torch's unfused implementation never skips; the ratio is
create_block_mask / zoo's (above 1: zoo's is faster).

``--uncompiled-paths`` times the same uncompiled call two ways: its masks reading their captured tensors with ``[]``
(torch turns each into a differentiable indexing Function) through the Dynamo trace torch wraps an uncompiled call
in, against zoo's masks (``zoo.parts.flex.at``) in torch's unfused implementation called directly, as the contract
calls it (zoo.testing.contract.flex_without_dynamo); the ratio is the first / the second.
"""

from __future__ import annotations

import argparse

import torch
from einops import rearrange, repeat
from timing import time_interleaved
from torch.nn.attention.flex_attention import and_masks, flex_attention

from zoo.parts.flex import block_mask_of, flex_attend, slot_mask
from zoo.parts.kernels import additive, allowed_mask, attend
from zoo.testing.contract import flex_without_dynamo


def flex_kernel(q, k, v, slots, same, window: int | None) -> torch.Tensor:  # noqa: ANN001
    """zoo's flex path for a causal mask with ``window`` and the document mask ``same`` (or None)."""
    mod = slot_mask(slots, causal=True, window=window, key_mask=None, documents=same)
    return flex_attend(q, k, v, mask_mod=mod, batched=same is not None)


def sparse_kernel(q, k, v, slots, same, window: int | None) -> torch.Tensor:  # noqa: ANN001
    """zoo's flex mask, its block mask torch's create_block_mask (compiled zoo's; uncompiled, its path until the
    all-partial block mask)."""
    mod = slot_mask(slots, causal=True, window=window, key_mask=None, documents=same)
    batch = None if same is None else q.shape[0]
    mask = block_mask_of(mod, batch, q.shape[-2], k.shape[-2], q.device, sparse=True)
    return flex_attention(q, k, v, block_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


def bracket_kernel(q, k, v, slots, same, window: int | None) -> torch.Tensor:  # noqa: ANN001
    """:func:`flex_kernel`'s mask read with ``[]``, through the Dynamo trace of an uncompiled call (torch's default)."""
    mods = [lambda b, h, i, kv: kv <= slots[i]]
    if window is not None:
        mods.append(lambda b, h, i, kv: (slots[i] - kv).abs() < window)
    if same is not None:
        pairs = same[:, 0]  # (b, t_q, t_k)
        mods.append(lambda b, h, i, kv: pairs[b, i, kv])
    return flex_attend(q, k, v, mask_mod=and_masks(*mods), batched=same is not None)


def direct_kernel(q, k, v, slots, same, window: int | None) -> torch.Tensor:  # noqa: ANN001
    """:func:`flex_kernel` in torch's unfused implementation called directly, as the contract calls it."""
    with flex_without_dynamo():
        return flex_kernel(q, k, v, slots, same, window)


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
    parser.add_argument("--uncompiled", action="store_true",
                        help="zoo's uncompiled flex path against create_block_mask's block mask (both uncompiled)")
    parser.add_argument("--uncompiled-paths", action="store_true",
                        help="masks read by [] through Dynamo against zoo's, called directly (both uncompiled)")
    args = parser.parse_args()
    if args.backward and args.device == "cpu":
        parser.error("--backward needs a CUDA device: torch has no FlexAttention backward on CPU")
    dtype = getattr(torch, args.dtype)
    if args.uncompiled:  # (name, kernel) pairs: the first / the second is the ratio
        pair = ("create_block_mask", sparse_kernel), ("zoo", flex_kernel)
    elif args.uncompiled_paths:
        pair = ("[] through Dynamo", bracket_kernel), ("at, direct", direct_kernel)
    else:
        pair = ("sdpa", sdpa_kernel), ("flex", torch.compile(flex_kernel, fullgraph=True, dynamic=False))
    (first, first_kernel), (second, second_kernel) = pair
    mode = "forward + backward" if args.backward else "forward"
    print(f"{args.device} {args.dtype}, batch {args.batch}, {args.heads} heads over {args.kv_heads}, "
          f"head_dim {args.head_dim}, {mode}, median of {args.repeats}\n")  # fmt: skip
    print(f"| mask | length | {first} ms | {second} ms | {first} / {second} | max abs difference |")
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

            times = time_interleaved({first: lambda: step(first_kernel), second: lambda: step(second_kernel)},
                                     args.device, args.repeats)  # fmt: skip
            with torch.no_grad():
                diff = (step(first_kernel).float() - step(second_kernel).float()).abs().max().item()
            print(f"| {mask_name} | {length} | {times[first] * 1e3:.3f} | {times[second] * 1e3:.3f} | "
                  f"{times[first] / times[second]:.2f} | {diff:.2e} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
