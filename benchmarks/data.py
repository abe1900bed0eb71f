"""Data throughput: task=tokens' memory-mapped loader against in-memory data, and zoo-prepare's speed.

    python benchmarks/data.py                          # the quick sweep's size; the standard library
    python benchmarks/data.py --data data/stdlib-bpe   # the loader on a prepared folder (its vocabulary)
    python benchmarks/data.py --no-prepare --repeats 7 # the loader only

Loader: two Trainers train the quick sweep's model (d_model 64, 4 heads, 2 layers, seq_len 64,
batch 24, threads 1) on the same token folder, one through ``task=tokens`` (shards memory-mapped,
each window read from the file by ``Windows.take``), one on the same tokens held in memory as one
tensor and windows cut from it by indexing. Both draw the same windows (checked equal first) from
the same generator, so they compute the same steps; runs alternate (memmap, memory, memmap, ...)
and the ratio of step times is the median of each round's. Target: <= 1.02.

zoo-prepare: the standard library's ``.py`` sources (``zoo-prepare --stdlib``, what ``task=bytes``
reads, here all of it) prepared in this process (Python's start and imports not counted) with the
byte tokenizer, with a 4,096-token BPE (its training on ``--train-chars`` counted), and with that BPE's
tokenizer.json given, by ``--workers`` processes: input MB per second of wall time (the BPE rows
include bytebpe's check against the library on the first documents). The BPE's ids are checked
against the tokenizers library's. Target: >= 10 MB/s on 2 cores.

Encoders: that BPE's ids of the training split, on one core (one thread, one process), by the
tokenizers library, by bytebpe (fresh caches), and by tiktoken with the BPE's vocabulary as its
ranks where tiktoken is installed (``pip install tiktoken``; its ids are checked against the
library's, after a check that the merges' ids follow merge order, which tiktoken's ranks assume);
and the cost of zoo-prepare's check of bytebpe (``checked_encoder`` on the first documents).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from zoo import compose
from zoo.lab.data.bytebpe import ByteBPEEncoder, byte_chars
from zoo.lab.data.prepare import (
    CHECK_DOCS,
    TRAIN_CHARS,
    LibraryEncoder,
    checked_encoder,
    prepare,
    read_all,
    source_files,
    split_docs,
)
from zoo.lab.data.sources import stdlib_dir
from zoo.lab.planning.run_model import build_run_model
from zoo.lab.planning.train_config import TrainConfig, check_run_config
from zoo.lab.tasks import Batch, build_task
from zoo.lab.training.trainer import Trainer


class InMemory:
    """A tokens task's training windows cut from its tokens held in memory (one tensor per shard)."""

    def __init__(self, task) -> None:
        self.task = task
        self.windows = task.train_windows
        self.data = [
            torch.from_numpy(np.asarray(s.data[s.start : s.end], dtype=np.int64)) for s in self.windows.segments
        ]
        self.offsets = torch.tensor([0, *self.windows.counts[:-1].tolist()])
        self.steps = torch.arange(self.windows.length)

    def train_batch(self, batch_size: int, generator: torch.Generator) -> Batch:
        indices = torch.randint(0, self.windows.n, (batch_size,), generator=generator)  # as TokensTask draws them
        if len(self.data) == 1:  # one shard: one gather
            windows = self.data[0][indices[:, None] + self.steps]  # (b, t + 1)
        else:
            which = torch.searchsorted(torch.from_numpy(self.windows.counts), indices, right=True)
            rows = [self.data[w][i - self.offsets[w] + self.steps] for i, w in zip(indices, which, strict=True)]
            windows = torch.stack(rows)  # (b, t + 1)
        return Batch(windows[:, :-1], windows[:, 1:])

    def __getattr__(self, name: str):
        return getattr(self.task, name)


def step_seconds(raw: dict, task, train_cfg: TrainConfig) -> float:
    """Seconds per training step of a Trainer (its own timing: evaluation excluded)."""
    torch.manual_seed(0)
    trainer = Trainer(build_run_model(raw), task, train_cfg, device=torch.device("cpu"), data_seed=0)
    outcome = trainer.fit()
    return outcome.train_time_s / train_cfg.steps


def loader(folder: Path, args: argparse.Namespace) -> None:
    task_cfg = {"name": "tokens", "path": str(folder), "seq_len": 64}
    vocab = build_task(task_cfg).vocab_size
    cfg = compose(
        ["task=tokens", f"task.path={folder}", "task.seq_len=64", "block.d_model=64", "block.n_heads=4",
         "model.n_layers=2", f"model.vocab_size={vocab}", "train.batch_size=24", f"train.steps={args.steps}",
         "train.warmup_steps=20", "train.eval_every=0", "train.eval_batches=1", "threads=1", "progress=false"]
    )  # fmt: skip
    raw = OmegaConf.to_container(cfg, resolve=True)
    train_cfg, _ = check_run_config(raw)
    mapped = build_task(raw["task"])
    memory = InMemory(mapped)
    a, b = (t.train_batch(24, torch.Generator().manual_seed(0)) for t in (mapped, memory))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets), "the two loaders differ"
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(200):
        mapped.train_batch(24, g)
    per_batch = (time.perf_counter() - start) / 200
    rounds = [(step_seconds(raw, mapped, train_cfg), step_seconds(raw, memory, train_cfg)) for _ in range(args.repeats)]
    ratio = statistics.median(m / r for m, r in rounds)
    mapped_s, memory_s = statistics.median(m for m, _ in rounds), statistics.median(r for _, r in rounds)
    print(f"loader: {folder} (vocab {vocab}, {sum(map(len, mapped.train)):,} training tokens), quick sweep's model, "
          f"{args.steps} steps x {args.repeats} rounds, threads 1, load {os.getloadavg()[0]:.2f}")  # fmt: skip
    print("| data | ms / step (median) | all rounds |")
    print("|---|---|---|")
    print(f"| task=tokens (memory-mapped) | {1e3 * mapped_s:.2f} | {', '.join(f'{1e3 * m:.2f}' for m, _ in rounds)} |")
    print(f"| in memory | {1e3 * memory_s:.2f} | {', '.join(f'{1e3 * r:.2f}' for _, r in rounds)} |")
    print(f"memory-mapped batch alone: {1e3 * per_batch:.3f} ms ({per_batch / memory_s:.2%} of an in-memory step)")
    print(f"ratio memory-mapped / in memory: {ratio:.4f} median per round (target <= 1.02)")


def preparing(inputs: list[str], pattern: str, args: argparse.Namespace) -> None:
    files = source_files(inputs, pattern)
    mb = sum(f.stat().st_size for f in files) / 1e6
    print(f"\nzoo-prepare: {len(files)} files, {mb:.1f} MB ({inputs[0]}, {pattern}), load {os.getloadavg()[0]:.2f}")
    print("| tokenizer | workers | seconds | MB/s |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as keep:
        trained = Path(keep) / "tokenizer.json"
        for tokenizer in ("bytes", "bpe", "file"):
            for workers in args.workers:
                with tempfile.TemporaryDirectory() as out:
                    spec = str(trained) if tokenizer == "file" else tokenizer
                    start = time.perf_counter()
                    meta = prepare(inputs, out, tokenizer=spec, vocab_size=args.vocab_size, pattern=pattern,
                                   workers=workers, train_chars=args.train_chars, progress=False)  # fmt: skip
                    seconds = time.perf_counter() - start
                    if tokenizer == "bpe":
                        shutil.copyfile(Path(out) / "tokenizer.json", trained)
                        exact(inputs, pattern, Path(out))
                names = {"bytes": "bytes", "bpe": f"bpe {meta['vocab_size']:,}, trained", "file": "that bpe's json"}
                name = names[tokenizer]
                print(f"| {name} | {workers} | {seconds:.2f} | {mb / seconds:.1f} |")
        print(f"bpe trained on --train-chars {args.train_chars:,} characters; target: >= 10 MB/s on 2 cores")
        encoders(inputs, pattern, trained)


def exact(inputs: list[str], pattern: str, folder: Path) -> None:
    """Check that the folder's training ids are the fast encoder's, and those the tokenizers library's
    own encoding on every 16th document (all of them would take a minute)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    docs, _ = read_all(source_files(inputs, pattern), set(), "text", 1, False)
    train, _ = split_docs(docs, 0.02)
    ids = np.fromfile(folder / "train_000.bin", dtype=np.uint16)
    fast = ByteBPEEncoder(tok)
    for i in range(0, len(train) - 1, 16):
        assert fast.encode(train[i]) == tok.encode(train[i], add_special_tokens=False).ids, train[i][:80]
    assert np.array_equal(ids, fast.encode_all(train)), "the folder's ids are not the encoder's"
    print(f"(ids checked: the folder's against the fast encoder, {len(train[::16])} documents against the library)")


#: The ByteLevel pre-tokenizer's pattern (GPT-2's), for tiktoken.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def tiktoken_of(tok):
    """A tiktoken Encoding with ``tok``'s vocabulary as ranks, or why there is none: tiktoken is not
    installed, or the merges' ids do not follow merge order (tiktoken merges by the rank of a pair's
    result, the library by the pair's place among the merges)."""
    try:
        import tiktoken
    except ImportError:
        return None, "not installed (pip install tiktoken)"
    model = json.loads(tok.to_str())["model"]
    vocab, merges = model["vocab"], [m if isinstance(m, list) else m.split(" ") for m in model["merges"]]
    made = np.array([vocab[a + b] for a, b in merges], dtype=np.int64)  # (n_merges,) each merge's result
    parts = np.array([[vocab[a], vocab[b]] for a, b in merges], dtype=np.int64).reshape(-1, 2)  # (n_merges, 2)
    to_byte = {c: b for b, c in byte_chars().items()}
    every_byte = all(c in vocab for c in to_byte) and len(vocab) == 256 + len(merges)
    if not (every_byte and (np.diff(made) > 0).all() and (parts.max(axis=1, initial=-1) < made).all()):
        return None, "the merges' ids do not follow merge order"
    ranks = {bytes(to_byte[c] for c in token): rank for token, rank in vocab.items()}
    encoding = tiktoken.Encoding("run", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
    return encoding, tiktoken.__version__


def timed(encode, docs):
    """``encode(docs)`` as an int64 array, and its seconds."""
    start = time.perf_counter()
    ids = np.asarray(encode(docs), dtype=np.int64)
    return ids, time.perf_counter() - start


def encoders(inputs: list[str], pattern: str, trained: Path) -> None:
    """The encoders of the trained BPE on the training split, one core each, and the check's cost."""
    import tokenizers
    from tokenizers import Tokenizer

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the library on one thread, as each worker runs it
    tok = Tokenizer.from_file(str(trained))
    docs, _ = read_all(source_files(inputs, pattern), set(), "text", 1, False)
    train, _ = split_docs(docs, 0.02)
    mb = sum(len(d.encode()) for d in train) / 1e6
    print(f"\nencoders: that bpe's ids of the training split ({len(train)} documents, {mb:.1f} MB), one core each")
    print("| encoder | seconds | MB/s | M tokens/s | ids |")
    print("|---|---|---|---|---|")
    want, seconds = timed(LibraryEncoder(tok).encode_all, train)
    rows = [(f"tokenizers {tokenizers.__version__}", seconds, "the reference")]
    got, seconds = timed(ByteBPEEncoder(tok).encode_all, train)
    rows.append(("bytebpe", seconds, same(got, want)))
    fast_s = seconds
    encoding, note = tiktoken_of(tok)
    if encoding is not None:
        got, seconds = timed(lambda d: [i for doc in d for i in encoding.encode_ordinary(doc)], train)
        rows.append((f"tiktoken {note}, the BPE's vocabulary as ranks", seconds, same(got, want)))
    for name, seconds, ids in rows:
        print(f"| {name} | {seconds:.2f} | {mb / seconds:.2f} | {len(want) / seconds / 1e6:.2f} | {ids} |")
    if encoding is None:
        print(f"tiktoken: {note}; skipped")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fast, said = checked_encoder(tok, train[:CHECK_DOCS])
        times.append(time.perf_counter() - start)
        assert fast, said
    check_s = statistics.median(times)
    print(f"zoo-prepare's check, {said}: {check_s:.3f} s (median of 3), {check_s / fast_s:.1%} of bytebpe's time")


def same(got: np.ndarray, want: np.ndarray) -> str:
    """Whether ``got`` are the library's ids ``want``, or where they first differ."""
    if len(got) == len(want) and np.array_equal(got, want):
        return "the library's"
    n = min(len(got), len(want))
    wrong = np.flatnonzero(got[:n] != want[:n])
    return f"differ from token {int(wrong[0]) if len(wrong) else n}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None, help="a zoo-prepare folder for the loader (default: the stdlib, bytes)")
    parser.add_argument("--input", default=None, help="the text zoo-prepare reads (default: the standard library)")
    parser.add_argument("--glob", default="*.py")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--train-chars", type=int, default=TRAIN_CHARS)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--no-prepare", action="store_true", help="time the loader only")
    args = parser.parse_args()
    inputs = [args.input or str(stdlib_dir())]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.data) if args.data else Path(tmp) / "tokens"
        if not args.data:
            prepare(inputs, folder, pattern=args.glob, progress=False)
        loader(folder, args)
    if not args.no_prepare:
        preparing(inputs, args.glob, args)


if __name__ == "__main__":
    main()
