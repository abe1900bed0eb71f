"""``zoo-prepare``: local text to zoo's token format (train/val shards of raw uint16/uint32 tokens and a
``meta.json``), for ``zoo-train task=tokens task.path=DIR``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from zoo.core.errors import ConfigError
from zoo.lab.cores import usable_cores
from zoo.lab.data.prepare import SHARD_TOKENS, TRAIN_CHARS, prepare
from zoo.lab.data.sources import META, stdlib_dir


def split_text(folder: str | Path, split: str) -> str:
    """The text of a prepared split, decoded from its shards (the round trip of :func:`prepare`)."""
    folder = Path(folder)
    meta = json.loads((folder / META).read_text())
    ids = np.concatenate([np.fromfile(folder / f, dtype=meta["dtype"]) for f in meta["splits"][split]["files"]])
    if "tokenizer_file" not in meta:
        return ids.astype(np.uint8).tobytes().decode()
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / meta["tokenizer_file"])).decode(ids.tolist(), skip_special_tokens=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zoo-prepare", description=__doc__)
    parser.add_argument(
        "inputs", nargs="*", metavar="INPUT", help="text, .jsonl or .parquet files, datasets folders, folders"
    )
    parser.add_argument("--stdlib", action="store_true", help="read this Python's standard library too (as task=bytes)")
    parser.add_argument("--out", required=True, help="the output folder (shards, meta.json, tokenizer.json)")
    parser.add_argument(
        "--tokenizer", default="bytes", help="bytes, bpe (trained on the input), a tokenizer.json or its folder"
    )
    parser.add_argument("--vocab-size", type=int, default=4096, help="the BPE's vocabulary size (--tokenizer bpe)")
    parser.add_argument("--val-fraction", type=float, default=0.02, help="the text's tail held out for validation")
    parser.add_argument(
        "--glob", default=None, help="the files to read from a folder (default: all; *.py with --stdlib)"
    )
    parser.add_argument("--text-field", default="text", help="the text field of .jsonl, .parquet and datasets inputs")
    parser.add_argument(
        "--workers",
        type=int,
        default=usable_cores(),
        help="processes parsing JSONL/Parquet/datasets files and tokenizing (all cores)",
    )
    parser.add_argument(
        "--train-chars",
        type=int,
        default=TRAIN_CHARS,
        help="characters a bpe trains on (0: all)",
    )
    parser.add_argument("--shard-tokens", type=int, default=SHARD_TOKENS, help="the most tokens in one shard file")
    args = parser.parse_args(argv)
    inputs = [*args.inputs, *([str(stdlib_dir())] if args.stdlib else [])]
    if not inputs:
        parser.error("give INPUT files or folders, or --stdlib")
    try:
        meta = prepare(
            inputs, args.out, tokenizer=args.tokenizer, vocab_size=args.vocab_size, val_fraction=args.val_fraction,
            pattern=args.glob or ("*.py" if args.stdlib else "*"), text_field=args.text_field, workers=args.workers,
            train_chars=args.train_chars, shard_tokens=args.shard_tokens,
        )  # fmt: skip
    except ConfigError as e:
        print(f"zoo-prepare: {e}", file=sys.stderr)
        return 2
    splits = ", ".join(f"{k} {v['tokens']} tokens / {v['bytes']} bytes" for k, v in meta["splits"].items())
    skipped = f"; {meta['skipped_not_utf8']} files skipped (not UTF-8)" if meta.get("skipped_not_utf8") else ""
    asked = meta.get("vocab_size_requested", meta["vocab_size"])
    short = f" (of {asked} asked for: the training text ran out of merges)" if meta["vocab_size"] < asked else ""
    print(f"{args.out}: vocab_size {meta['vocab_size']}{short}; {splits}{skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
