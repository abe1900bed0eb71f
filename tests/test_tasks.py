"""Tasks: shapes, determinism, held-out validation data, MQAR answers correct by construction."""

from __future__ import annotations

import math

import pytest
import torch

from zoo import ConfigError
from zoo.lab.tasks import IGNORE, TASKS, build_task
from zoo.lab.tasks.text import read_corpus


def small_bytes(tmp_path, **options):
    path = tmp_path / "corpus.txt"
    path.write_bytes(bytes(range(32, 127)) * 50)  # 4750 bytes of text
    return build_task({"name": "bytes", "path": str(path), "seq_len": 16, "val_fraction": 0.2, **options})


def test_registered_tasks():
    assert {"bytes", "mqar"} <= set(TASKS.names())


def test_bytes_batches_are_next_byte_shifted(tmp_path):
    task = small_bytes(tmp_path)
    batch = task.train_batch(3, torch.Generator().manual_seed(0))
    assert batch.inputs.shape == batch.targets.shape == (3, 16)
    assert batch.inputs.dtype == torch.long and 0 <= batch.inputs.min() and batch.inputs.max() < 256
    torch.testing.assert_close(batch.inputs[:, 1:], batch.targets[:, :-1])


def test_bytes_same_seed_same_batches_other_seed_other(tmp_path):
    task = small_bytes(tmp_path)
    a, b, c = (task.train_batch(4, torch.Generator().manual_seed(s)) for s in (0, 0, 1))
    assert torch.equal(a.inputs, b.inputs) and not torch.equal(a.inputs, c.inputs)


def test_bytes_validation_is_held_out_and_fixed(tmp_path):
    task = small_bytes(tmp_path)
    assert len(task.train) + len(task.val) == 4750 and len(task.val) == 950
    first, again = task.val_batches(2, 3), task.val_batches(2, 3)
    assert len(first) == 3 and all(torch.equal(x.inputs, y.inputs) for x, y in zip(first, again, strict=True))
    long = task.val_batches(2, 1, factor=4)[0]
    assert long.inputs.shape == (2, 64)


def test_bytes_metrics_are_bits_per_byte(tmp_path):
    task = small_bytes(tmp_path)
    metrics = task.compute({"loss_sum": 10 * math.log(2), "count": 10, "correct": 0})
    assert metrics == pytest.approx({"bpb": 1.0, "loss": math.log(2)})
    assert task.metric == "val_bpb" and task.mode() == "min"


def test_stdlib_corpus_is_deterministic_and_hashed():
    a = read_corpus(None, None, 50_000)
    read_corpus.cache_clear()
    b = read_corpus(None, None, 50_000)
    assert a.data == b.data and len(a.data) == 50_000 and a.files >= 1
    assert len(a.sha256) == 64 and a.sha256 == b.sha256


def test_bytes_folder_skips_binaries(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"hello world\n" * 200)
    (tmp_path / "b.bin").write_bytes(b"\0\1\2" * 1000)
    corpus = read_corpus(str(tmp_path), None, 10**6)
    assert corpus.files == 1 and b"\0" not in corpus.data


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"path": "/no/such/place"}, "task.path='/no/such/place'"),
        ({"seq_len": 0}, "task.seq_len=0"),
        ({"val_fraction": 1.5}, "task.val_fraction=1.5"),
        ({"seq_len": 2000}, "too little data"),
        ({"metric": "val_acc"}, "task.metric='val_acc': one of val_bpb, val_loss"),
        ({"eval_lengths": [1, 0]}, "task.eval_lengths"),
        ({"seq_lne": 16}, "task.seq_lne=16: not an option of task 'bytes'"),
    ],
)
def test_bytes_bad_options_name_the_field(tmp_path, options, field):
    with pytest.raises(ConfigError) as error:
        small_bytes(tmp_path, **options)
    assert field in str(error.value), str(error.value)


def test_unknown_task_suggests_the_closest():
    with pytest.raises(ConfigError, match="task.name='mqra': unknown task; did you mean 'mqar'"):
        build_task({"name": "mqra"})


def mqar(**options):
    return build_task({"name": "mqar", "n_pairs": 6, "n_queries": 4, "n_keys": 24, "n_values": 10, **options})


def test_mqar_shapes_and_vocabulary():
    task = mqar()
    batch = task.train_batch(5, torch.Generator().manual_seed(0))
    assert task.seq_len == 20 and batch.inputs.shape == batch.targets.shape == (5, 20)
    assert task.vocab_size == 34 and batch.inputs.max() < 34
    assert (batch.targets != IGNORE).sum(dim=1).tolist() == [4] * 5


@pytest.mark.parametrize("factor", [1, 2, 4])
def test_mqar_answers_correct_by_construction(factor):
    task = mqar(eval_lengths=[1, 2, 4])
    batch = task.val_batches(8, 1, factor)[0]
    pairs = 6 * factor
    for seq, targets in zip(batch.inputs.tolist(), batch.targets.tolist(), strict=True):
        keys, values = seq[0 : 2 * pairs : 2], seq[1 : 2 * pairs : 2]
        assert len(set(keys)) == pairs and all(k < 24 for k in keys) and all(24 <= v < 34 for v in values)
        store = dict(zip(keys, values, strict=True))
        scored = [i for i, t in enumerate(targets) if t != IGNORE]
        assert scored == list(range(2 * pairs, len(seq), 2))  # every query key, nothing else
        for i in scored:
            assert seq[i] in store and targets[i] == store[seq[i]] == seq[i + 1]
        asked = [seq[i] for i in scored]
        assert len(set(asked)) == len(asked) == 4 * factor


def test_mqar_deterministic_validation_and_seeded_training():
    task = mqar()
    assert torch.equal(task.val_batches(4, 2)[1].inputs, mqar().val_batches(4, 2)[1].inputs)
    a, b = (task.train_batch(4, torch.Generator().manual_seed(7)) for _ in range(2))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)


def test_mqar_metrics_and_lengths():
    task = mqar(eval_lengths=[2, 1])
    assert task.eval_lengths == (1, 2)
    assert task.metric_names() == ["val_accuracy", "val_accuracy_2x", "val_loss", "val_loss_2x"]
    assert task.mode() == "max" and task.mode("val_loss_2x") == "min"
    assert task.compute({"loss_sum": 8.0, "count": 4, "correct": 3}) == {"accuracy": 0.75, "loss": 2.0}


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"n_queries": 7}, "task.n_queries=7: at most n_pairs=6"),
        ({"eval_lengths": [1, 8]}, "task.n_keys=24: at least n_pairs x max(eval_lengths) = 48"),
        ({"n_pairs": 0}, "task.n_pairs=0"),
        ({"n_keys": "many"}, "task.n_keys='many': must be int"),
    ],
)
def test_mqar_bad_options_name_the_field(options, field):
    with pytest.raises(ConfigError) as error:
        mqar(**options)
    assert field in str(error.value), str(error.value)
