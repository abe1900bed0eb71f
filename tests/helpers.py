"""What the test modules share: tiny run configs, the command lines run in a subprocess, fake and
interrupted run folders, the documented init's draws. Test modules import from here, never from
each other."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

import zoo
from zoo import compose
from zoo.core.registry import AXES, Registry
from zoo.lab.files import write_json_atomic
from zoo.lab.records import checkpoint as ckpt
from zoo.lab.records.summary import read_summary

#: The checkout (or installed tree) the tests run: its conf/, sweeps/, examples/ and docs/.
ROOT = Path(zoo.__file__).resolve().parent.parent

#: A model and training run small enough for a few seconds (train.* over zoo's defaults).
TINY = [
    "block.d_model=32",
    "block.n_heads=4",
    "model.n_layers=2",
    "train.steps=12",
    "train.batch_size=4",
    "train.warmup_steps=3",
    "train.log_every=4",
    "train.eval_every=6",
    "train.eval_batches=2",
    "threads=1",
    "progress=false",
]
#: The bytes task at a size that reads in milliseconds.
BYTES = ["task.max_bytes=30000", "task.seq_len=32", "task.val_fraction=0.1"]

#: A sweep's runs on the command line: four steps each (zoo_cli).
SMALL = [
    "block.d_model=32",
    "block.n_heads=4",
    "model.n_layers=2",
    *BYTES,
    "train.steps=4",
    "train.batch_size=4",
    "train.log_every=2",
    "train.eval_every=2",
    "train.eval_batches=2",
    "threads=1",
]


def tiny(*overrides: str, task: str = "bytes") -> dict:
    """A run config small enough for a few seconds' training, composed as ``zoo-train`` would: a copy of its
    composition, which runs once per test process for these overrides and the parts registered then."""
    data = BYTES if task in ("bytes", "lengthgen") else []
    return copy.deepcopy(composed((f"task={task}", *TINY, *data, *overrides), registered_parts()))


@functools.cache
def composed(overrides: tuple[str, ...], parts: tuple) -> dict:
    """``compose(overrides)`` as a plain dict (``parts``: :func:`registered_parts`, what its check read)."""
    return OmegaConf.to_container(compose(list(overrides)), resolve=True)


def registered_parts() -> tuple:
    """Every registered part as compose checks it: a part registered or unregistered since is another key."""
    return tuple((p.axis, p.name, p.cls, repr(p.defaults), repr(p.variants)) for r in AXES.values() for p in r.parts())


def tiny_cli(*, d_model: int = 16, steps: int = 2, **more: Any) -> dict[str, str]:
    """The smallest run a command line trains (one layer, 16-token windows, a 2-sequence batch), as
    ``{key: value}``; ``more`` adds or replaces keys (``train__log_every=3`` is ``train.log_every=3``)."""
    keys = {
        "block.d_model": d_model,
        "block.n_heads": 4,
        "model.n_layers": 1,
        "task.max_bytes": 20000,
        "task.seq_len": 16,
        "train.steps": steps,
        "train.batch_size": 2,
        "train.eval_batches": 1,
        "threads": 1,
    }
    keys.update({key.replace("__", "."): value for key, value in more.items()})
    return {key: str(value) for key, value in keys.items()}


def as_overrides(keys: dict[str, str]) -> list[str]:
    """``{"train.steps": "2"}`` -> ``["train.steps=2"]``."""
    return [f"{key}={value}" for key, value in keys.items()]


def without_timings(records: list[dict]) -> list[dict]:
    """Metrics records without their wall-clock rates (the rest is deterministic)."""
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in records]


def zoo_cli(
    module: str, *args: str, cwd: Path, launcher: list[str] | None = None, returncode: int = 0, timeout: int = 300
) -> subprocess.CompletedProcess:
    """Run ``python -m <module> args`` (or under ``launcher``) with this checkout first on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [*(launcher or [sys.executable]), "-m", module, *args]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == returncode, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@contextlib.contextmanager
def command_state(cwd: Path) -> Iterator[None]:
    """What a zoo command changes in the process that runs it, put back afterwards: the working folder,
    ``sys.argv``, torch's threads, Hydra's global state and the root logger's handlers and level."""
    import logging

    from hydra.core.global_hydra import GlobalHydra

    root, argv, threads, here = logging.getLogger(), list(sys.argv), torch.get_num_threads(), Path.cwd()
    handlers, level = list(root.handlers), root.level
    GlobalHydra.instance().clear()
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(here)
        sys.argv[:] = argv
        torch.set_num_threads(threads)
        GlobalHydra.instance().clear()
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


def zoo_in_process(program: str, args: list[str], cwd: Path) -> int:
    """Run ``zoo-train`` or ``zoo-sweep`` with ``args`` in this process, through the entry point its console
    script calls (torch and zoo already imported: seconds, where a new interpreter takes several more); its exit
    code. For what a command line does inside one run (not for what needs a process of its own: signals,
    torchrun, another interpreter's environment)."""
    from zoo.lab.commands.sweep import sweep_main
    from zoo.lab.commands.train import main as train_main

    with command_state(cwd):
        try:
            if program == "zoo-sweep":
                sweep_main(args)
            else:
                sys.argv[:] = ["zoo-train", *args]
                train_main()
        except SystemExit as done:
            return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


def folder_bytes(folder: Path) -> dict[Path, bytes]:
    """Every file under ``folder`` and its bytes: equal before and after, nothing in it was written."""
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def summaries(folder: Path) -> dict[str, dict]:
    """Every run's summary in a sweep folder, by run folder name."""
    return {p.parent.name: json.loads(p.read_text()) for p in folder.glob("*/summary.json")}


def interrupt(src: Path, dst: Path, at_step: int) -> None:
    """``dst``: ``src`` as a run killed after writing the checkpoint at ``at_step`` would leave it:
    later checkpoints gone, no final weights, summary ``running``, metrics past the checkpoint and a
    line cut short."""
    shutil.copytree(src, dst)
    for folder in ckpt.checkpoints(dst):
        if int(folder.name.removeprefix("step_")) > at_step:
            shutil.rmtree(folder)
    (dst / ckpt.WEIGHTS).unlink()
    summary = read_summary(dst)
    summary.update(status="running", final=None)
    (dst / "summary.json").write_text(json.dumps(summary))
    with open(dst / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 1')


def fake_run(root: Path, overrides: list[str], status: str = "ok", value: float | None = None, **extra: Any) -> None:
    """A run folder as zoo-train leaves it: summary.json and metrics.jsonl."""
    folder = root / ",".join(overrides)
    metric = extra.pop("metric", {"name": "val_bpb", "mode": "min"})
    summary = {
        "status": status,
        "error": "ConfigError: block.n_heads=5: must divide d_model=32" if status == "failed" else None,
        "overrides": overrides,
        "choices": {},
        "config": {"seed": int(dict(o.split("=") for o in overrides).get("seed", 0))},
        "parameters": {"total": 1000},
        "metric": {**metric, "value": value},
        "final": {} if value is None else {metric["name"]: value, "val_loss": value * 0.69},
        "tokens_per_s": 5000.0,
        "wall_time_s": 10.0,
        **extra,
    }
    write_json_atomic(folder / "summary.json", summary)
    steps = [{"kind": "train", "step": s, "tokens": 100 * s, "loss": 5.0 - s / 10} for s in (1, 5, 10)]
    steps += [{"kind": "val", "step": s, "tokens": 100 * s, "val_loss": 4.5 - s / 10} for s in (5, 10)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))


def seeded_draws(model: torch.nn.Module, seed: int, residual_std, embed_std: float = 0.02) -> dict[str, torch.Tensor]:
    """What the documented init gives each matrix and bias, drawn here from (seed, full name, shape) alone:
    Normal(0, 0.02) (the token embedding: Normal(0, embed_std)), residual outputs (attn.out, cross_attn.out,
    mlp.down) Normal(0, residual_std) (a number, or a function of the name), zero biases."""
    from zoo.assembly.init import parameter_seed

    expected = {}
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            expected[name] = torch.zeros_like(p)
        elif p.ndim >= 2:
            std = embed_std if name == "embed.weight" else 0.02
            if name.endswith(("attn.out.weight", "mlp.down.weight")):
                std = residual_std(name) if callable(residual_std) else residual_std
            generator = torch.Generator().manual_seed(parameter_seed(seed, name, p.shape))
            expected[name] = torch.empty(p.shape).normal_(0, std, generator=generator)
    return expected


@contextlib.contextmanager
def registered(*entries: tuple[Registry, str, type]) -> Iterator[None]:
    """Throwaway parts (or tasks, trackers, ...) registered for the ``with`` block, gone after it."""
    for registry, name, cls in entries:
        registry.register(name)(cls)
    try:
        yield
    finally:
        for registry, name, _ in entries:
            if name in registry:
                registry.unregister(name)


class Float64Torch(types.ModuleType):
    """``torch`` as a transformers module sees it, with ``torch.float32`` and ``torch.float`` read as float64."""

    def __getattr__(self, name: str) -> Any:
        return torch.float64 if name in ("float32", "float") else getattr(torch, name)


def lift_to_float64(monkeypatch: Any, module: types.ModuleType) -> None:
    """A transformers modeling ``module``'s float32 casts compute in float64 for this test (``monkeypatch``'s):
    its ``torch.float32`` and ``torch.float``, and ``Tensor.float()`` everywhere, keep float64."""
    monkeypatch.setattr(module, "torch", Float64Torch("torch"))
    monkeypatch.setattr(torch.Tensor, "float", lambda self, *args, **kwargs: self)


def fla_naive(op: str) -> types.ModuleType:
    """fla-core's pure-PyTorch references of ``op`` (fla/ops/<op>/naive.py: ``gated_delta_rule``, ``kda``), loaded by
    file path: ``import fla`` needs triton, which a CPU machine lacks; these files need torch and einops."""
    import importlib.util

    import pytest

    found = importlib.util.find_spec("fla")
    if found is None or not found.submodule_search_locations:
        pytest.skip("fla-core is not installed: pip install -e '.[reference]' (dev includes it)")
    path = Path(next(iter(found.submodule_search_locations))) / "ops" / op / "naive.py"
    spec = importlib.util.spec_from_file_location(f"fla_{op}_naive", path)
    assert spec is not None and spec.loader is not None, f"fla-core has no {path}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def two_steps_by_hand(log_decay: torch.Tensor, k_1: list[float]) -> tuple[torch.Tensor, ...]:
    """The two-step delta-rule case worked by hand in the tests (one head, 2 key channels, 2 values): q = (1, 1),
    (1, 0); keys ``k_1``, (0.6, 0.8); v = (2, 3), (1, -1); beta = 0.5, 1 (so the state returns v_2 for k_2); the
    decay ``log_decay`` (1, 1, 2) or (1, 1, 2, 2). Returns the recurrent form's and the chunked form's (chunks of 1
    and 2) outputs and final states, by name, and k."""
    from zoo.parts.gated_deltanet import delta_chunked, delta_recurrent

    q = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)[None, None]
    k = torch.tensor([k_1, [0.6, 0.8]], dtype=torch.float64)[None, None]
    v = torch.tensor([[2.0, 3.0], [1.0, -1.0]], dtype=torch.float64)[None, None]
    beta = torch.tensor([0.5, 1.0], dtype=torch.float64)[None, None]
    forms = {"recurrent": delta_recurrent(q, k, v, beta, log_decay, None)}
    return forms | {f"chunk {c}": delta_chunked(q, k, v, beta, log_decay, None, c) for c in (1, 2)}, k, v


def assert_forms_equal(forms: dict, k: torch.Tensor, v: torch.Tensor, y: list, state: list) -> None:
    """Every form of :func:`two_steps_by_hand` gives the outputs ``y`` and final state ``state`` (to 1e-12), and,
    beta being 1 at the second step, the state returns v_2 for k_2 (the delta rule overwrites)."""
    for name, (got_y, got_state) in forms.items():
        expected_y = torch.tensor(y, dtype=torch.float64)[None, None]
        torch.testing.assert_close(got_y, expected_y, rtol=0, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")
        torch.testing.assert_close(got_state, torch.tensor(state, dtype=torch.float64)[None, None], rtol=0, atol=1e-12)
        torch.testing.assert_close(got_state[0, 0].T @ k[0, 0, 1], v[0, 0, 1], rtol=0, atol=1e-12)
