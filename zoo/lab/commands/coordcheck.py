"""``zoo-coordcheck``: the coordinate check the ``mup`` package prescribes before trusting a μP model.

    zoo-coordcheck attn=gqa mlp=swiglu --widths 64,128,256,512,1024 --steps 5 --out runs/coordcheck

For a config (overrides as for ``zoo-train``), trains ``--steps`` steps at each width (``block.d_model``)
under both parametrizations (``param=standard`` and ``param=mup`` with the first width as base), for
``--seeds`` seeds (``seed=0, 1, ...``), on ``threads`` threads (default 1), and records before each
step the mean |x| of the embedding output, of every block's output, of every softmax attention's
scores (its logits, scale included) and of the output logits, averaged over the seeds. Under μP they
stay flat as width grows; under the standard parametrization they grow. Writes ``coordcheck.csv``
and ``coordcheck.png`` into ``--out`` and exits 1 when a μP curve's slope of log mean|x| against log
width exceeds ``--tolerance`` at any step (``--check standard`` judges the standard curves instead).
``--covering`` runs the check on every row of the contract's covering set (the overrides
applied to each) and exits 1 when one fails. A curve that shrinks with width passes: μP's attention
and output logits start near zero at large width and grow to a width-independent size as they train.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from zoo.lab.commands.arguments import positive_int
from zoo.lab.keys import PARAM_VALUES

#: The largest slope of log mean|x| against log width a flat curve may have.
TOLERANCE = 0.25


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zoo-coordcheck", description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="config overrides, as for zoo-train")
    p.add_argument("--widths", type=width_list, default="64,128,256,512,1024",
                   help="block.d_model values, two or more; the smallest is μP's base")  # fmt: skip
    p.add_argument("--steps", type=positive_int, default=5, help="training steps recorded at each width")
    p.add_argument("--seeds", type=positive_int, default=3, help="seeds each mean |x| is averaged over")
    p.add_argument("--out", type=Path, default=Path("runs/coordcheck"), help="folder for coordcheck.csv and .png")
    p.add_argument("--tolerance", type=float, default=TOLERANCE, help="largest μP slope against log width")
    p.add_argument("--covering", action="store_true", help="every row of the contract's covering set (no files)")
    p.add_argument(
        "--check", choices=PARAM_VALUES, default="mup", help="whose curves must be flat (standard: to see it fail)"
    )
    return p


def width_list(text: str) -> list[int]:
    """``--widths 64,128,256`` -> [64, 128, 256] (sorted), or argparse's error naming the value."""
    try:
        widths = sorted(int(w) for w in text.split(","))
    except ValueError:
        widths = []
    if len(widths) < 2 or len(set(widths)) < len(widths) or widths[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: block.d_model values, two or more distinct positive integers "
                                         "separated by commas (64,128,256)")  # fmt: skip
    return widths


#: Keys the command sets itself, per width and parametrization.
OWN_KEYS = {"block.d_model": "the widths are --widths", "param": "it runs both parametrizations (--check picks whose "
            "curves must be flat)", "param.base_width": "μP's base width is the smallest of --widths"}  # fmt: skip


def check_arguments(overrides: Sequence[str], widths: list[int]) -> None:
    """Raise ConfigError for a misspelt or misplaced override, a key this command sets, or a config that does not
    plan at some width under either parametrization: before any model is built."""
    from zoo.core.errors import ConfigError
    from zoo.lab.commands.argv import check_overrides
    from zoo.lab.planning.plan import plan_run
    from zoo.lab.studies.coordcheck import PARAMS, config

    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key in OWN_KEYS:
            raise ConfigError(key, value, f"set by zoo-coordcheck: {OWN_KEYS[key]}")
    check_overrides(overrides)
    for param in PARAMS:
        for width in widths:
            plan_run(*config(overrides, param, width, widths[0]))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; 0 when every μP curve is flat within the tolerance, 1 when one is not; 2 for bad arguments."""
    args = parser().parse_intermixed_args(argv)
    from hydra.errors import HydraException

    from zoo.core.errors import ConfigError
    from zoo.lab.studies.coordcheck import PARAMS, averaged, covering, plot, verdict, write_csv  # torch

    widths = args.widths
    try:
        check_arguments(args.overrides, widths)
    except (ConfigError, HydraException) as error:  # Hydra's: an override its grammar cannot read
        print(f"zoo-coordcheck: {error}".splitlines()[0], file=sys.stderr)
        return 2
    if args.covering:
        return covering(args, widths)
    runs = [averaged(args.overrides, p, w, widths[0], args.steps, args.seeds) for p in PARAMS for w in widths]
    rows = [row for run in runs for row in run]
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.out / "coordcheck.csv")
    plot(rows, args.out / "coordcheck.png", args.steps)
    failures = verdict(rows, args.tolerance, args.check)
    print(f"tolerance: a {args.check} slope of log mean|x| against log width above {args.tolerance:+.3f} fails")
    for line in failures:
        print(f"{args.check} FAIL {line}")
    print(
        f"coordcheck {'FAILED' if failures else 'passed'}: {args.out / 'coordcheck.png'}, {args.out / 'coordcheck.csv'}"
    )
    return 1 if failures else 0


def entry() -> None:
    """The console script: exits with :func:`main`'s status."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
