"""SIGKILL a 2-run sweep at random moments (some while a checkpoint is being written), damage the latest
checkpoint after each kill (three ways in turn), rerun it until it is done: every run ends as the
uninterrupted sweep's did, to the last bit, no file left is corrupt, no run is lost."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT, as_overrides, tiny_cli, without_timings
from safetensors.torch import load_file

from zoo import compose
from zoo.lab.records import checkpoint as ckpt
from zoo.lab.records.metrics import read_metrics
from zoo.lab.training.run import run

SWEEP = [
    "-m",
    *as_overrides(
        tiny_cli(d_model=32, steps=30, train__batch_size=4, task__val_fraction=0.1, train__log_every=3,
                 train__eval_every=10, train__checkpoint_every=3, train__keep_checkpoints=2, block__dropout=0.1)
    ),
    "seed=0,1",
]  # fmt: skip
KILLS = 5  # 3 the moment a checkpoint write begins, 2 at random moments


def zero_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 1000] = bytes(1000)
    path.write_bytes(bytes(data))


#: After a kill, the latest checkpoint of the run in progress is damaged one of these ways, in turn.
DAMAGES = {
    "garbage state file": lambda folder: (folder / ckpt.STATE).write_bytes(os.urandom(300)),
    "garbage model.safetensors": lambda folder: (folder / ckpt.WEIGHTS).write_bytes(os.urandom(300)),
    "1,000 zeroed bytes in model.safetensors": lambda folder: zero_bytes(folder / ckpt.WEIGHTS),
}
SAME = ("status", "steps", "tokens", "final", "metric", "config_hash", "parameters", "reason")


def start(folder: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "zoo.train", *SWEEP, f"hydra.sweep.dir={folder}"]
    return subprocess.Popen(command, cwd=folder.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def temp_folders(folder: Path) -> set[Path]:
    """Checkpoints being written (or left half-written by a kill) in the sweep's runs."""
    return set(folder.glob(f"*/{ckpt.CHECKPOINTS}/.step_*"))


def writing_beside_two(writes: set[Path]) -> bool:
    """Whether one of these checkpoint writes has begun in a run holding two complete checkpoints."""
    return any(len(ckpt.checkpoints(tmp.parent.parent)) >= 2 for tmp in writes)


def kill_when(proc: subprocess.Popen, due) -> bool:  # noqa: ANN001
    """SIGKILL ``proc`` as soon as ``due()``; False when it ended first."""
    while proc.poll() is None:
        if due():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.002)  # a checkpoint write takes milliseconds (fsyncs): this catches it
    return False


def damage_latest(folder: Path, how: str) -> bool:
    """Damage the latest checkpoint of the sweep's run in progress (summary not ``ok``); False if it has none."""
    for run_dir in folder.iterdir() if folder.is_dir() else []:
        summary = run_dir / "summary.json"
        latest = ckpt.latest_checkpoint(run_dir)
        if latest is not None and summary.exists() and json.loads(summary.read_text())["status"] != "ok":
            DAMAGES[how](latest)
            assert ckpt.verify_checkpoint(latest) is not None
            return True
    return False


def runs_by_seed(folder: Path) -> dict[int, Path]:
    return {json.loads((p / "summary.json").read_text())["config"]["seed"]: p for p in folder.iterdir() if p.is_dir()}


@pytest.mark.slow
def test_sigkill_at_random_moments_changes_no_result(tmp_path):
    whole = tmp_path / "whole"  # the uninterrupted runs, trained here
    for seed in (0, 1):
        overrides = [a for a in SWEEP if a != "-m" and not a.startswith("seed=")]
        assert run(compose([*overrides, f"seed={seed}"]), whole / str(seed))["status"] == "ok"

    killed, rng = tmp_path / "killed", random.Random(0)
    kills, during_writes, attempts, damaged = 0, 0, 0, []
    while True:
        attempts += 1
        assert attempts < 40, f"the sweep never finished ({kills} kills)"
        proc = start(killed)
        if kills >= KILLS and len(set(damaged)) == len(DAMAGES):  # enough: let it finish
            assert proc.wait(timeout=300) == 0, proc.stderr.read()[-3000:]
            break
        stale = temp_folders(killed)  # left by earlier kills (the resumed run deletes them)
        if kills % 2 == 0:  # the moment a checkpoint write begins, beside two complete ones (one to fall back to)
            hit = kill_when(proc, lambda stale=stale: writing_beside_two(temp_folders(killed) - stale))
            during_writes += hit and bool(temp_folders(killed) - stale)  # it was still half-written
        else:  # any moment: imports, training, evaluation, summary or weights writes
            deadline = time.monotonic() + rng.uniform(0.5, 3.0)  # well before a fresh sweep ends
            hit = kill_when(proc, lambda deadline=deadline: time.monotonic() >= deadline)
        if not hit:
            assert proc.returncode == 0, proc.stderr.read()[-3000:]
            break
        kills += 1
        how = list(DAMAGES)[len(damaged) % len(DAMAGES)]
        if damage_latest(killed, how):
            damaged.append(how)
    print(f"{kills} kills ({during_writes} mid checkpoint write), {attempts} starts, damaged: {damaged}")
    assert kills >= 5 and during_writes >= 2, (kills, during_writes)
    assert set(damaged) == set(DAMAGES), damaged  # each way at least once

    expected, got = runs_by_seed(whole), runs_by_seed(killed)
    assert sorted(got) == sorted(expected) and len(got) == 2  # no run lost
    for name, folder in got.items():
        a = json.loads((expected[name] / "summary.json").read_text())
        b = json.loads((folder / "summary.json").read_text())  # parses: not corrupt
        assert {k: b.get(k) for k in SAME} == {k: a.get(k) for k in SAME}, name
        assert without_timings(read_metrics(folder)) == without_timings(read_metrics(expected[name]))
        lines = (folder / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == len(read_metrics(folder))  # every line whole
        wa, wb = load_file(expected[name] / ckpt.WEIGHTS), load_file(folder / ckpt.WEIGHTS)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
        for step in ckpt.checkpoints(folder):  # every checkpoint left is intact (damaged ones were replaced)
            assert ckpt.verify_checkpoint(step) is None, step
            assert ckpt.read_state(step)["config_hash"] == b["config_hash"]
        assert ckpt.read_manifest(folder)[ckpt.WEIGHTS] == ckpt.file_entry(folder / ckpt.WEIGHTS)
        assert not list(folder.glob(".*.tmp")) and not list(folder.glob(f"{ckpt.CHECKPOINTS}/.*"))
