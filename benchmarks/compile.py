"""torch.compile's capture of zoo's blocks: einops traced by Dynamo against zoo.core.reshape's static plans.

    python benchmarks/compile.py                  # every part once (the compile test's traced rows), 3 repeats
    python benchmarks/compile.py --rows 4 --repeats 1

Each step resets Dynamo, compiles each block of the rows (``compile_block``: one graph, ``fullgraph=True``) with the
``eager`` backend, so that the time is Dynamo's capture and nothing else, and runs it once on a float64 batch.
``einops traced`` turns zoo.core.reshape's static plans off (``STATIC_PLANS = False``: every call is einops' own,
which Dynamo traces through its pattern parser); ``static plans`` is the default. The two are timed round-robin in
one process. Prints a Markdown table of median seconds and einops traced / static plans (above 1: the static plans
capture faster), with the number of einops calls the blocks' forwards make, and checks that both compiled blocks
compute what the eager block does.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable

import einops
import torch
from timing import time_interleaved

import zoo.core.reshape
from zoo.lab.training.scale import compile_block
from zoo.testing.combos import block_config, build, context_of, covering_combinations, every_part_once, randomize


def blocks(rows: int) -> list[torch.nn.Module]:
    """The eager blocks of the first ``rows`` rows in which every registered part appears once."""
    made = []
    for combo in every_part_once(covering_combinations())[:rows]:
        cfg = block_config(combo)
        context, _ = context_of(cfg)
        if context is not None:
            block = build(cfg, context).double().eval()
            randomize(block)
            made.append(block)
    return made


def capture(eager: list[torch.nn.Module], x: torch.Tensor, static_plans: bool) -> Callable[[], None]:
    """A step that compiles a copy of each block with ``static_plans`` set and checks it against the eager block."""

    def step() -> None:
        zoo.core.reshape.STATIC_PLANS = static_plans
        for block in eager:
            torch._dynamo.reset()  # each block its own capture, as the compile test's (one code object: Block.forward)
            compiled = copy.deepcopy(block)
            compile_block(compiled, backend="eager")
            with torch.no_grad():
                torch.testing.assert_close(compiled(x), block(x), rtol=1e-12, atol=1e-12)

    return step


def einops_calls(eager: list[torch.nn.Module], x: torch.Tensor) -> int:
    """How many einops reductions (rearrange, repeat, reduce) one eager forward of every block makes."""
    calls, original = [0], einops.reduce

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls[0] += 1
        return original(*args, **kwargs)

    einops.reduce = counted
    try:
        with torch.no_grad():
            for block in eager:
                block(x)
    finally:
        einops.reduce = original
    return calls[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=None, help="the first N rows of every part once (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not zoo.core.reshape.STATIC_PLANS:
        raise SystemExit("this einops has no internals zoo.core.reshape can plan with: nothing to compare")
    torch.manual_seed(0)
    eager = blocks(args.rows if args.rows is not None else 10**9)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    torch.compile(lambda t: t + 1, backend="eager")(x)  # Dynamo's one-time start, outside either timing
    steps = {"einops traced": capture(eager, x, False), "static plans": capture(eager, x, True)}
    try:
        seconds = time_interleaved(steps, "cpu", repeats=args.repeats, warmup=0)
    finally:
        zoo.core.reshape.STATIC_PLANS = True
    print(f"{len(eager)} blocks, {einops_calls(eager, x)} einops calls in one forward of them all; Dynamo capture only")
    print("| blocks | einops traced (s) | static plans (s) | einops traced / static plans |")
    print("|---|---:|---:|---:|")
    ratio = seconds["einops traced"] / seconds["static plans"]
    print(f"| {len(eager)} | {seconds['einops traced']:.2f} | {seconds['static plans']:.2f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
