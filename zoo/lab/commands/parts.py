"""``zoo-parts``: every registered extension (parts, tasks, trackers, optimizers, schedules, callbacks) and its
options; the catalogue itself is :mod:`zoo.lab.commands.catalogue`, imported once the arguments are read."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from zoo.core.errors import ConfigError

EPILOG = """examples:
  zoo-parts --check pos=learned block.max_len=512        # valid in a model? (exit 1 and the reason if not)
  zoo-parts --check --block pos=learned                  # ... as a lone block
  zoo-parts --params mlp=gelu,swiglu attn=mha,gqa block.mlp.match=params block.mlp.match_attn=mha
"""


def parts_main(argv: Sequence[str] | None = None) -> None:
    """``zoo-parts``: every axis and its parts; ``--params`` counts parameters of every combination;
    ``--check`` says whether one combination is valid and why not."""
    parser = argparse.ArgumentParser(
        prog="zoo-parts", description=parts_main.__doc__, epilog=EPILOG, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--params",
        action="store_true",
        help="build every combination (restricted by AXIS=a,b; options block.KEY=VALUE) and count parameters",
    )
    parser.add_argument("--check", action="store_true", help="is the combination the overrides compose valid?")
    parser.add_argument("--block", action="store_true", help="with --check: as a lone block (default: in a model)")
    parser.add_argument("--markdown", action="store_true", help="print the catalogue docs/parts.md is made of")
    parser.add_argument("--d-model", type=int, default=256, help="with --params")
    parser.add_argument("--n-heads", type=int, default=8, help="with --params")
    parser.add_argument("--max-len", type=int, default=1024, help="with --params (sizes pos=learned)")
    parser.add_argument("overrides", nargs="*", help="AXIS=NAME (--check: Hydra overrides) or block.KEY=VALUE")
    args = parser.parse_args(argv)
    # imported once the arguments are read: the catalogue imports torch
    from zoo.lab.commands.catalogue import NothingValid, parts_markdown, print_check, print_param_table, print_parts

    if args.check:
        sys.exit(print_check(args.overrides, "block" if args.block else "model"))
    elif args.overrides and not args.params:
        parser.error("overrides go with --check or --params")
    elif args.params:
        try:
            print_param_table(args.d_model, args.n_heads, args.overrides, args.max_len)
        except (ConfigError, NothingValid) as error:
            parser.error(str(error))
    elif args.markdown:
        print(parts_markdown(), end="")
    else:
        print_parts()


