"""Command-line entry points that need no training: ``zoo-parts``."""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Sequence

from zoo.build import build_block, option_defaults
from zoo.registry import AXES


def parts_main(argv: Sequence[str] | None = None) -> None:
    """``zoo-parts``: every axis and its parts; ``--params`` builds every combination and counts."""
    parser = argparse.ArgumentParser(prog="zoo-parts", description=parts_main.__doc__)
    parser.add_argument("--params", action="store_true", help="build every combination and print parameter counts")
    parser.add_argument("--markdown", action="store_true", help="print the catalogue docs/parts.md is made of")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-heads", type=int, default=8)
    args = parser.parse_args(argv)
    if args.params:
        print_param_table(args.d_model, args.n_heads)
    elif args.markdown:
        print(parts_markdown(), end="")
    else:
        print_parts()


def print_parts() -> None:
    for axis, registry in AXES.items():
        print(f"{axis}:")
        width = max(len(name) for name in registry.names())
        for part in registry.parts():
            options = ", ".join(f"{k}={v}" for k, v in option_defaults(part).items())
            print(f"  {part.name:<{width}}  {part.summary}" + (f"  [{options}]" if options else ""))


def parts_markdown() -> str:
    """The parts catalogue as Markdown (``zoo-parts --markdown > docs/parts.md``)."""
    lines = [
        "# Parts catalogue",
        "",
        "Generated from the registry by `zoo-parts --markdown > docs/parts.md`; a test fails when it is stale.",
        "Choose a part on the command line with `<axis>=<name>`; set an option with `block.<axis>.<option>=...`.",
    ]
    for axis, registry in AXES.items():
        lines += [
            "",
            f"## `{axis}`",
            "",
            "| name | what | formula | options (default) | reference |",
            "|---|---|---|---|---|",
        ]
        for part in registry.parts():
            options = ", ".join(f"`{k}={v}`" for k, v in option_defaults(part).items()) or "-"
            lines.append(f"| `{part.name}` | {part.summary} | `{part.formula}` | {options} | {part.reference} |")
    return "\n".join(lines) + "\n"


def print_param_table(d_model: int, n_heads: int) -> None:
    names = [registry.names() for registry in AXES.values()]
    print(f"| {' | '.join(AXES)} | parameters |")
    print("|" + "---|" * (len(AXES) + 1))
    for combo in itertools.product(*names):
        block = build_block({"d_model": d_model, "n_heads": n_heads, **dict(zip(AXES, combo, strict=False))})
        count = sum(p.numel() for p in block.parameters())
        print(f"| {' | '.join(combo)} | {count:,} |")
