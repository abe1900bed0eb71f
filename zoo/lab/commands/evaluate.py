"""``zoo-eval DIR``: a run's validation metrics on its own data, at its trained length and others; with
``--harness TASKS``, lm-evaluation-harness tasks. ``zoo-lm-eval``: lm-eval's own command line with the
``zoo`` model registered.

    zoo-eval runs/quick/pos=rotary,mlp=swiglu,seed=0 --lengths 1,2,4
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from zoo.core.errors import ConfigError, install_extra
from zoo.lab.commands.arguments import positive_int


def parse_lengths(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.split(",")]
    except ValueError:
        allowed = "multiples of the trained length separated by commas, e.g. 1,2,4"
        raise ConfigError("--lengths", text, allowed) from None
    return lengths


def main(argv: Sequence[str] | None = None) -> None:
    """``zoo-eval DIR [--lengths 1,2,4]``: the run's validation metrics, one row per length; with
    ``--harness TASKS``: lm-evaluation-harness tasks instead, through the run's tokenizer."""
    parser = argparse.ArgumentParser(prog="zoo-eval", description="Re-evaluate a trained run on its task.")
    parser.add_argument("run", help="a run folder (or one of its checkpoints/step_<N> folders)")
    parser.add_argument("--lengths", default=None, help="multiples of the trained length, e.g. 1,2,4")
    parser.add_argument("--batches", type=positive_int, default=None, help="validation batches (default: the run's)")
    parser.add_argument(
        "--data", default=None, help="the run's data folder or files, moved (default: where the run read them)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--harness", default=None, help='lm-eval tasks separated by commas (pip install -e ".[eval]")')
    parser.add_argument("--include-path", default=None, help="a folder of lm-eval task YAML files (--harness)")
    parser.add_argument(
        "--limit", type=positive_int, default=None, help="at most this many documents per task (--harness)"
    )
    parser.add_argument("--batch-size", type=positive_int, default=8, help="requests per forward pass (--harness)")
    args = parser.parse_args(argv)
    from zoo.lab.planning.train_config import checked_device  # after the arguments: --help answers before torch

    try:
        checked_device(args.device, cpu="--device=cpu")
    except ConfigError as error:
        sys.exit(f"zoo-eval: {error}")
    if args.harness is not None:
        return harness_main(args)
    from zoo.lab.finished.runs import evaluate_run

    try:
        lengths = parse_lengths(args.lengths) if args.lengths else None
        metrics, errors, task = evaluate_run(args.run, lengths, args.device, args.batches, args.data)
    except ConfigError as error:
        sys.exit(f"zoo-eval: {error}")
    names = list(task.metrics)
    print(f"{args.run}: task {task.name}, trained length {task.seq_len}")
    print("| length | tokens | " + " | ".join(f"val_{n}" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for factor in task.eval_lengths:
        suffix = "" if factor == 1 else f"_{factor}x"
        cells = [metrics.get(f"val_{n}{suffix}") for n in names]
        shown = ["n/a" if v is None else f"{v:.4f}" for v in cells]
        print(f"| {factor}x | {factor * task.seq_len} | " + " | ".join(shown) + " |")
    for factor, error in errors.items():
        print(f"{factor}: {error}")


def load_harness() -> Any:
    """zoo.lab.finished.harness, imported when asked for: lm-eval is an optional extra."""
    try:
        from zoo.lab.finished import harness
    except ImportError as e:
        raise ConfigError("lm-eval", None, f"installed: {install_extra('eval')} ({e})") from None
    return harness


def harness_main(args: argparse.Namespace) -> None:
    """``zoo-eval DIR --harness TASKS``: lm-eval's results table for the run (zoo.lab.finished.harness)."""
    tasks = [t for t in args.harness.split(",") if t]
    try:
        if not tasks:
            raise ConfigError("--harness", args.harness, "lm-eval task names separated by commas")
        harness = load_harness()
        results = harness.evaluate(
            args.run, tasks, include_path=args.include_path, limit=args.limit, batch_size=args.batch_size,
            device=args.device,
        )  # fmt: skip
    except ConfigError as error:
        sys.exit(f"zoo-eval: {error}")
    from lm_eval.utils import make_table

    print(make_table(results))


LM_EVAL_USAGE = """usage: zoo-lm-eval [lm-eval's arguments]

lm-eval's own command line with zoo's model registered: score a finished run on lm-eval's tasks.

  zoo-lm-eval --model zoo --model_args run=DIR --tasks hellaswag      # a run folder's model
  zoo-lm-eval run --help                                              # lm-eval's own options

The model options (--model_args, comma-separated): run=DIR (required), device, batch_size,
max_length. zoo-eval DIR --harness TASKS does the same in one line (docs/data.md).
"""


def lm_eval_main() -> None:
    """``zoo-lm-eval ARGS``: lm-eval's own command line with the ``zoo`` model registered
    (``zoo-lm-eval --model zoo --model_args run=DIR --tasks TASKS``). ``--help`` alone answers here,
    without importing lm-eval (and torch with it); lm-eval's own options: ``zoo-lm-eval run --help``."""
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(LM_EVAL_USAGE, end="")
        return
    try:
        harness = load_harness()
    except ConfigError as error:
        sys.exit(f"zoo-lm-eval: {error}")
    harness.main()
