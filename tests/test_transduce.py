"""The seq2seq task (zoo/lab/tasks/transduce.py) and encoder-decoder training: data computed
independently, exact match of greedy cached decoding, and a tiny end-to-end run."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny

from zoo import ConfigError, build_seq2seq, compose
from zoo.lab.records.metrics import read_metrics
from zoo.lab.tasks import IGNORE, build_task
from zoo.lab.tasks.transduce import BOS, EOS, PAD
from zoo.lab.training.run import run


@pytest.mark.parametrize("op", ["reverse", "sort", "copy"])
def test_targets_are_the_transformed_source_then_eos_with_teacher_forcing(op):
    task = build_task({"name": "transduce", "op": op, "min_len": 2, "max_len": 6})
    batch = task.train_batch(16, torch.Generator().manual_seed(0))
    for i in range(16):
        symbols = [t for t, real in zip(batch.source[i].tolist(), batch.source_mask[i].tolist(), strict=True) if real]
        assert 2 <= len(symbols) <= 6 and PAD not in symbols
        assert batch.source[i, len(symbols) :].eq(PAD).all() and not batch.source_mask[i, len(symbols) :].any()
        expected = {"reverse": symbols[::-1], "sort": sorted(symbols), "copy": symbols}[op] + [EOS]
        row = batch.targets[i].tolist()
        assert row[: len(expected)] == expected and all(t == IGNORE for t in row[len(expected) :])
        assert batch.inputs[i, 0] == BOS and batch.inputs[i, 1 : len(expected)].tolist() == expected[:-1]


def test_bad_lengths_are_refused():
    with pytest.raises(ConfigError, match="task.max_len=2: at least task.min_len=3"):
        build_task({"name": "transduce", "min_len": 3, "max_len": 2})


def test_exact_match_counts_greedy_cached_decodings_right_up_to_eos():
    task = build_task({"name": "transduce", "min_len": 2, "max_len": 5, "n_symbols": 4})
    cfg = compose(["task=transduce", "pos=rotary", "block.d_model=16", "block.n_heads=2", "model.n_layers=1",
                   f"model.vocab_size={task.vocab_size}"])  # fmt: skip
    torch.manual_seed(0)
    model = build_seq2seq(cfg).eval()
    batch = task.val_batches(32, 1)[0]
    # Independently: greedy decoding without the cache, compared up to and including EOS.
    plain = model.generate(
        batch.source, batch.targets.shape[1], src_mask=batch.source_mask, bos_id=BOS, use_cache=False
    )
    expected = sum(
        all(p == t for p, t in zip(plain[i].tolist(), batch.targets[i].tolist(), strict=True) if t != IGNORE)
        for i in range(32)
    )
    assert task.exact_matches(model, batch) == expected
    # A model forced to emit each target (the teacher's logits): every row is an exact match.
    oracle = type("Oracle", (), {"generate": lambda self, *a, **k: batch.targets.clamp(min=0)})()
    assert task.exact_matches(oracle, batch) == 32


@pytest.mark.slow
def test_zoo_train_trains_an_encoder_decoder_on_the_task(tmp_path):
    summary = run(tiny("pos=rotary", "train.steps=6", "train.eval_every=3", task="transduce"), tmp_path)
    assert summary["status"] == "ok", summary["error"]
    assert summary["parameters"]["attention"] > 0 and 0 <= summary["final"]["val_exact_match"] <= 1
    assert summary["metric"]["name"] == "val_exact_match" and summary["metric"]["mode"] == "max"
    vals = [r for r in read_metrics(tmp_path) if r["kind"] == "val"]
    assert [r["step"] for r in vals] == [0, 3, 6] and all("val_accuracy" in r for r in vals)
