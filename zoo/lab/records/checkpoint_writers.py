"""Writing checkpoints (the format is :mod:`zoo.lab.records.checkpoint`'s).

Training hands checkpoints to a :class:`CheckpointWriter`, which copies the state to CPU memory and
writes it in a background thread: the training loop waits only for the copy, not for the disk.

Sharded runs (FSDP2, tensor parallel: ``parallel.*``) write ``dcp/`` instead of the model and
optimizer files: torch.distributed.checkpoint, every rank its shards, collectively
(:func:`save_sharded_checkpoint`), listed in the manifest with their checksums. torch reads
``dcp/.metadata`` with pickle, so such a checkpoint is read only by a run of more than one process
(any world size and layout: DCP reshards on load), only after its manifest matches every file in
``dcp/``; a single process refuses it. Only resume a sharded run from a folder your own runs wrote.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.lab.files import fsync_dir
from zoo.lab.records.checkpoint import (
    DCP,
    TrainState,
    begin_checkpoint,
    checkpoint_meta,
    file_entry,
    finish_checkpoint,
    save_checkpoint,
    sharded_state,
    step_dir,
)


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

    def __init__(self, run_dir: Path, *, config_hash: str, world_size: int = 1, keep: int = 2) -> None:
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


def save_sharded_checkpoint(
    run_dir: Path,
    state: TrainState,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    config_hash: str,
    world_size: int,
    keep: int = 2,
) -> Path:
    """Every rank, collectively: write its shards of the state after ``state.step`` with DCP into a temp
    folder that rank 0 then renames to ``checkpoints/step_<N>`` (with the state files and a manifest of
    every file's sha256); the last ``keep`` stay.
    ``run_dir`` must be the same shared folder on every rank."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    rank = dist.get_rank()
    final = step_dir(run_dir, state.step)
    tmp = final.with_name(f".{final.name}.dcp.tmp")  # the same name on every rank
    if rank == 0:
        begin_checkpoint(run_dir, state.step, tmp.name)
    dist.barrier()
    dcp.save(sharded_state(model, optimizer), checkpoint_id=str(tmp / DCP))  # returns once every rank's is written
    if rank == 0:
        meta = checkpoint_meta(state, config_hash, world_size)
        finish_checkpoint(run_dir, tmp, final, meta, state, files={}, optimizer=None, listed=synced(tmp), keep=keep)
    dist.barrier()
    return final


def synced(tmp: Path) -> dict[str, dict[str, Any]]:
    """The manifest entries of the shards DCP wrote into ``tmp/dcp``, each fsynced first."""
    shards = {}
    for p in sorted(p for p in (tmp / DCP).rglob("*") if not p.is_dir()):
        with open(p, "rb") as f:
            os.fsync(f.fileno())
        shards[p.relative_to(tmp).as_posix()] = file_entry(p)
    fsync_dir(tmp / DCP)
    return shards


class ShardedCheckpointWriter:
    """:class:`CheckpointWriter`'s counterpart for sharded runs: called on every rank, writes at once."""

    def __init__(self, run_dir: Path, *, config_hash: str, world_size: int, keep: int = 2) -> None:
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
