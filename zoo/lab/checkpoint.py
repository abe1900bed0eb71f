"""Training checkpoints and final weights: what a run needs to continue as if it was never stopped.

A checkpoint is a folder ``checkpoints/step_<N>/`` in the run folder, holding the state after step N:

- ``model.safetensors``: the model's weights (metadata: config hash, step);
- ``optimizer.pt``: the optimizer's state dict;
- ``state.pt``: a :class:`TrainState` (the step, the loop's running values, and each rank's random
  generators: the data generator, torch's CPU generator and the CUDA one) with the config hash and
  world size that wrote it.

It is written into a hidden temp folder that is renamed into place once every file is on disk, so
a kill mid-write leaves either the whole checkpoint or none of it (stale temp folders are removed
by the next save or resume). Only the last ``keep`` are kept. A checkpoint whose config hash is not
the run's is refused with an error naming both (:class:`CheckpointMismatch`), never loaded.

Training hands checkpoints to a :class:`CheckpointWriter`, which copies the state to CPU memory and
writes it in a background thread: the training loop waits only for the copy, not for the disk.

The interface, :func:`save_checkpoint` and :func:`load_checkpoint` (model + optimizer + state), is
the one place that knows the file layout.

Sharded runs (FSDP2, tensor parallel: ``parallel.*``) write ``dcp/`` instead of the safetensors and
optimizer files: torch.distributed.checkpoint, every rank its shards, collectively
(:func:`save_sharded_checkpoint`). Such a checkpoint loads at any world size and layout, one process
included (DCP reshards on load); only the per-rank random generators then start afresh.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.core.errors import ConfigError

CHECKPOINTS = "checkpoints"
WEIGHTS = "model.safetensors"
FORMAT = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class TrainState:
    """Everything besides the model and optimizer that decides what the next step computes.

    ``loop``: the training loop's running values that are the same on every rank (first loss, last
    logged loss, last validation, training time). ``ranks``: one dict per rank with its random
    generators' states and its unreduced running loss. ``resumed_from``: the steps earlier processes
    of this run resumed from (the run's history, reported in summary.json).
    """

    step: int
    loop: dict[str, Any] = field(default_factory=dict)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)


class CheckpointMismatch(ConfigError):
    """A checkpoint written by another configuration (or world size) than the run resuming from it."""


def rng_state(data: torch.Generator, device: torch.device) -> dict[str, torch.Tensor]:
    """The states of every generator a training step draws from: the data generator, torch's CPU
    generator (dropout on CPU, anything else random) and the device's CUDA generator."""
    state = {"data": data.get_state(), "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], data: torch.Generator, device: torch.device) -> None:
    """Restore what :func:`rng_state` captured."""
    data.set_state(state["data"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


# -- files ------------------------------------------------------------------------------------------


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step_{step:06d}"


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoints, oldest first (temp folders of interrupted writes excluded)."""
    folder = Path(run_dir) / CHECKPOINTS
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def remove_stale(run_dir: Path) -> None:
    """Delete the temp files and folders left by writes that were killed (``.<name>.<random>.tmp``)."""
    run_dir = Path(run_dir)
    for p in [*run_dir.glob(".*.tmp"), *run_dir.glob(f"{CHECKPOINTS}/.*")]:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def clear_checkpoints(run_dir: Path) -> None:
    """Delete every checkpoint of the run (a fresh start in the same folder)."""
    shutil.rmtree(Path(run_dir) / CHECKPOINTS, ignore_errors=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_weights(
    model: nn.Module, path: Path, metadata: dict[str, str] | None = None, state: dict[str, torch.Tensor] | None = None
) -> None:
    """``model``'s state dict (or ``state``) as safetensors at ``path``, written via a temp file and a rename."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().to("cpu").contiguous() for k, v in (state or model.state_dict()).items()}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 is for the temp file, not the weights
        _fsync(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_weights(model: nn.Module, path: Path) -> dict[str, str]:
    """Load safetensors weights into ``model`` (every key must match); returns the file's metadata."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    device = next(model.parameters()).device
    model.load_state_dict(load_file(path, device=str(device)), strict=True)
    with safe_open(path, framework="pt") as f:
        return dict(f.metadata() or {})


def write_model_optimizer(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict) -> None:
    """Model weights (safetensors) and optimizer state into ``folder`` (rank 0's; replicated runs)."""
    save_weights(model, folder / WEIGHTS, {k: str(v) for k, v in meta.items()})
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")


DCP = "dcp"


def read_model_optimizer(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    if (folder / DCP).is_dir():
        read_sharded(folder / DCP, model, optimizer)
        return
    load_weights(model, folder / WEIGHTS)
    device = next(model.parameters()).device
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location=device, weights_only=True))


def save_checkpoint(
    run_dir: Path,
    state: TrainState,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    config_hash: str,
    world_size: int = 1,
    keep: int = 1,
) -> Path:
    """Write the state after ``state.step`` atomically as ``checkpoints/step_<N>``; keep the last ``keep``."""
    final = step_dir(run_dir, state.step)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(run_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    tmp.chmod(0o755)
    try:
        meta = {"format": FORMAT, "config_hash": config_hash, "world_size": world_size, "step": state.step}
        write_model_optimizer(tmp, model, optimizer, meta)
        torch.save({**meta, "state": state.__dict__}, tmp / "state.pt")
        for p in tmp.iterdir():
            _fsync(p)
        if final.exists():  # the same step written again (a resumed run): swap, never a half folder
            trash = final.with_name(f".{final.name}.old")
            os.replace(final, trash)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def snapshot(value: Any) -> Any:
    """A copy on the CPU of a (nested) state dict's tensors, taken now: training goes on changing the originals."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, Mapping):
        return {k: snapshot(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(snapshot(v) for v in value)
    return value


class _Frozen(nn.Module):
    """A state dict posing as a module, so a snapshot goes through the same writers as a live model."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self._state = state

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return self._state


class _FrozenOptimizer:
    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


class CheckpointWriter:
    """Writes the checkpoints of one run (rank 0): snapshots the state in the caller's thread, writes it
    in a background thread, one write at a time. :meth:`close` waits for the last (and re-raises its
    error); a write that fails is reported at the next call."""

    def __init__(self, run_dir: Path, *, config_hash: str, world_size: int = 1, keep: int = 1) -> None:
        self.run_dir, self.config_hash, self.world_size, self.keep = Path(run_dir), config_hash, world_size, keep
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def __call__(self, state: TrainState, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.close()
        frozen = _Frozen(snapshot(model.state_dict())), _FrozenOptimizer(snapshot(optimizer.state_dict()))
        self._thread = threading.Thread(target=self._write, args=(state, *frozen), daemon=True)
        self._thread.start()

    def _write(self, state: TrainState, model: nn.Module, optimizer: Any) -> None:
        try:
            save_checkpoint(
                self.run_dir, state, model, optimizer,
                config_hash=self.config_hash, world_size=self.world_size, keep=self.keep,
            )  # fmt: skip
        except BaseException as error:  # noqa: BLE001 (handed to the training thread)
            self._error = error

    def close(self) -> None:
        """Wait for the write in flight; raise its error, if any."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def read_state(folder: Path) -> dict[str, Any]:
    """A checkpoint's ``state.pt``: format, config_hash, world_size, step and the TrainState fields."""
    return torch.load(Path(folder) / "state.pt", map_location="cpu", weights_only=True)


def check_checkpoint(folder: Path, *, config_hash: str, world_size: int) -> TrainState:
    """The checkpoint's TrainState, after checking it was written by this config and world size."""
    meta = read_state(folder)
    if meta.get("config_hash") != config_hash:
        raise CheckpointMismatch(
            "checkpoint",
            str(folder),
            f"written by config {meta.get('config_hash')}, this run's config is {config_hash}; "
            f"delete {Path(folder).parent} to start over, or run into another folder",
        )
    if meta.get("world_size") != world_size and not meta.get("sharded"):  # DCP reshards; safetensors do not
        raise CheckpointMismatch(
            "checkpoint",
            str(folder),
            f"written by {meta.get('world_size')} processes, this run has {world_size}; resume with as many",
        )
    return TrainState(**meta["state"])


def load_checkpoint(
    folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, config_hash: str, world_size: int = 1
) -> TrainState:
    """Load model and optimizer state from ``folder`` (after :func:`check_checkpoint`); returns its TrainState."""
    state = check_checkpoint(folder, config_hash=config_hash, world_size=world_size)
    read_model_optimizer(Path(folder), model, optimizer)
    return state


# -- sharded runs: torch.distributed.checkpoint ---------------------------------------------------


def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Model and optimizer state keyed by parameter names, as DTensor shards under FSDP2 / TP (plain
    tensors in one process): what DCP writes and reads."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}


def read_sharded(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load a DCP checkpoint into ``model`` and ``optimizer``, whatever world size and layout wrote it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    state = sharded_state(model, optimizer)
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])


def save_sharded_checkpoint(
    run_dir: Path,
    state: TrainState,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    config_hash: str,
    world_size: int,
    keep: int = 1,
) -> Path:
    """Every rank, collectively: write its shards of the state after ``state.step`` with DCP into a temp
    folder that rank 0 then renames to ``checkpoints/step_<N>`` (with ``state.pt``); the last ``keep`` stay.
    ``run_dir`` must be the same shared folder on every rank."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    rank = dist.get_rank()
    final = step_dir(run_dir, state.step)
    tmp = final.with_name(f".{final.name}.dcp.tmp")  # the same name on every rank
    if rank == 0:
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(run_dir)
        tmp.mkdir(mode=0o755)
    dist.barrier()
    dcp.save(sharded_state(model, optimizer), checkpoint_id=str(tmp / DCP))
    if rank == 0:
        meta = {"format": FORMAT, "config_hash": config_hash, "world_size": world_size, "step": state.step}
        torch.save({**meta, "sharded": True, "state": state.__dict__}, tmp / "state.pt")
        for p in [*tmp.iterdir(), *(tmp / DCP).iterdir()]:
            _fsync(p)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync(final.parent)
        for old in checkpoints(run_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


class ShardedCheckpointWriter:
    """:class:`CheckpointWriter`'s counterpart for sharded runs: called on every rank, writes at once."""

    def __init__(self, run_dir: Path, *, config_hash: str, world_size: int, keep: int = 1) -> None:
        self.run_dir, self.config_hash, self.world_size, self.keep = Path(run_dir), config_hash, world_size, keep

    def __call__(self, state: TrainState, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        save_sharded_checkpoint(
            self.run_dir, state, model, optimizer,
            config_hash=self.config_hash, world_size=self.world_size, keep=self.keep,
        )  # fmt: skip

    def close(self) -> None:
        """Nothing in flight: sharded checkpoints are written synchronously."""


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on the CPU (gathered from the shards: every rank must call it;
    ranks other than 0 get an empty dict), in the one-process layout that :func:`save_weights` writes."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
