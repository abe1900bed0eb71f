"""Training checkpoints and final weights: what a run needs to continue as if it was never stopped.

A checkpoint is a folder ``checkpoints/step_<N>/`` in the run folder, holding the state after step N:

- ``model.safetensors``: the model's weights (metadata: config hash, step, format);
- ``optimizer.safetensors``: the optimizer state's tensors;
- ``state.safetensors``: the :class:`TrainState`'s tensors (each rank's random generators: the data
  generator, torch's CPU generator and the CUDA one; its running loss);
- ``state.json``: format, config hash, world size, step, and the structure and scalars of the
  TrainState and of the optimizer state (the loop's running values, param groups), tensors named;
- ``manifest.json``: the size and sha256 of every file above, written last, after they are fsynced.

Nothing a single process reads is a pickle: only safetensors and JSON, and only after its bytes match
the manifest. Every file is written with :func:`zoo.lab.files.write_atomic`, into a hidden temp
folder that is renamed into place once the manifest is on disk, so a kill mid-write leaves either
the whole checkpoint or none of it (stale temp folders are removed by the next save or resume).
Only the last ``keep`` are kept. Plain and sharded checkpoints are finished by the same
:func:`finish_checkpoint` (state files, manifest, rename, pruning). Resuming
(:func:`choose_checkpoint`) takes the newest checkpoint that passes :func:`verify_checkpoint` and
says why each newer one did not; a checkpoint whose config hash is not the run's is refused with an
error naming both (:class:`CheckpointMismatch`).
A file that fails its check raises :class:`IntegrityError`, naming the file and what is wrong.

The final weights ``model.safetensors`` of a run folder have their ``manifest.json`` beside them
too (:func:`save_weights`, :func:`load_weights`). Weights written before manifests (no manifest,
safetensors format 1 or none) still load, with a warning; their ``state.pt`` and ``optimizer.pt``
(format 1, pickles) are never read: such a checkpoint is not resumed.

The writers (in the background, and sharded) are :mod:`zoo.lab.records.checkpoint_writers`; the state's
trees and tensors :mod:`zoo.lab.records.state_tree`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.core.errors import ConfigError
from zoo.lab.files import fsync_dir, write_atomic, write_json_atomic
from zoo.lab.records.state_tree import IntegrityError, from_tree, parse_json, parse_tensors, tensor_bytes, to_tree

log = logging.getLogger("zoo.lab.records.checkpoint")

CHECKPOINTS = "checkpoints"
WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer.safetensors"
STATE = "state.json"
STATE_TENSORS = "state.safetensors"
MANIFEST = "manifest.json"
DCP = "dcp"
FORMAT = 2
#: Format 1's pickled files: never read.
LEGACY = ("state.pt", "optimizer.pt")
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


def remove_weights(run_dir: Path) -> None:
    """Delete the run folder's final weights and their manifest (a rerun: weights on disk are its config's)."""
    for name in (WEIGHTS, MANIFEST):
        (Path(run_dir) / name).unlink(missing_ok=True)


# -- manifests: the size and sha256 of every file a folder holds ------------------------------------


def entry(data: bytes) -> dict[str, Any]:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def file_entry(path: Path) -> dict[str, Any]:
    """:func:`entry` of a file on disk, read in chunks (DCP's shards may be large)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": digest.hexdigest()}


def write_manifest(folder: Path, files: dict[str, dict[str, Any]]) -> None:
    """``folder/manifest.json``: what each file must be; written after the files are fsynced."""
    write_json_atomic(Path(folder) / MANIFEST, {"format": FORMAT, "files": files})


def read_manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """The files ``folder/manifest.json`` lists, each ``{"bytes", "sha256"}``."""
    path = Path(folder) / MANIFEST
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise IntegrityError(path, "missing") from None
    except ValueError as error:
        raise IntegrityError(path, f"not JSON ({error})") from None
    files = raw.get("files") if isinstance(raw, dict) else None
    ok = isinstance(files, dict) and all(
        isinstance(v, dict) and isinstance(v.get("bytes"), int) and isinstance(v.get("sha256"), str)
        and ".." not in Path(k).parts and not Path(k).is_absolute()
        for k, v in files.items()
    )  # fmt: skip
    if not ok:
        raise IntegrityError(path, 'not a manifest: {"files": {name: {"bytes": N, "sha256": HEX}}} expected')
    return files


def compare(path: Path, got: dict[str, Any], want: dict[str, Any] | None) -> None:
    """Raise :class:`IntegrityError` unless ``got`` (a file's size and sha256) is what the manifest lists."""
    if want is None:
        raise IntegrityError(path, f"not listed in {MANIFEST}")
    if got["bytes"] != want["bytes"]:
        kind = "truncated" if got["bytes"] < want["bytes"] else "altered"
        raise IntegrityError(path, f"{kind}: {got['bytes']:,} bytes, {MANIFEST} lists {want['bytes']:,}")
    if got["sha256"] != want["sha256"]:
        raise IntegrityError(
            path, f"altered: sha256 {got['sha256'][:16]}..., {MANIFEST} lists {want['sha256'][:16]}..."
        )


def read_checked(folder: Path, name: str, files: dict[str, dict[str, Any]]) -> bytes:
    """The bytes of ``folder/name``, once they match ``files`` (its manifest)."""
    path = Path(folder) / name
    if name not in files:
        raise IntegrityError(path, f"not listed in {MANIFEST}")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise IntegrityError(path, f"missing (listed in {MANIFEST})") from None
    compare(path, entry(data), files[name])
    return data


def write_files(folder: Path, files: dict[str, bytes], more: dict[str, dict[str, Any]] | None = None) -> None:
    """Each of ``files`` into ``folder`` (:func:`write_atomic`), then the manifest of them (and of ``more``)."""
    for name, data in files.items():
        write_atomic(Path(folder) / name, data)
    write_manifest(folder, {**(more or {}), **{name: entry(data) for name, data in files.items()}})


# -- state as safetensors + JSON -------------------------------------------------------------------


# -- final weights -----------------------------------------------------------------------------------


def save_weights(
    model: nn.Module, path: Path, metadata: dict[str, str] | None = None, state: dict[str, torch.Tensor] | None = None
) -> None:
    """``model``'s state dict (or ``state``) as safetensors at ``path`` (:func:`write_atomic`), then the
    ``manifest.json`` beside it that lists its size and sha256."""
    data = tensor_bytes(state or model.state_dict(), {**(metadata or {}), "format": str(FORMAT)})
    write_files(Path(path).parent, {Path(path).name: data})


def read_weights(path: Path, *, unverified_ok: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of safetensors weights, checked against the ``manifest.json`` beside them.
    ``unverified_ok``: weights written before manifests (none beside them, format 1 or none) load too, with
    a warning."""
    path = Path(path)
    if not unverified_ok or (path.parent / MANIFEST).exists():
        return parse_tensors(read_checked(path.parent, path.name, read_manifest(path.parent)), path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise IntegrityError(path, "missing") from None
    tensors, meta = parse_tensors(data, path)
    if meta.get("format", "1") != "1":
        raise IntegrityError(path, f"no {MANIFEST} beside it, though its format {meta['format']} writes one")
    log.warning("%s: written before checksums (no %s beside it): loaded unverified", path, MANIFEST)
    return tensors, meta


def load_weights(model: nn.Module, path: Path, *, unverified_ok: bool = False) -> dict[str, str]:
    """Load checked safetensors weights (:func:`read_weights`) into ``model`` (every key and shape must
    match); returns the file's metadata."""
    tensors, meta = read_weights(path, unverified_ok=unverified_ok)
    own = model.state_dict()
    reshaped = [k for k in own if k in tensors and own[k].shape != tensors[k].shape]
    wrong = sorted(set(own) ^ set(tensors)) + reshaped
    if wrong:
        listed = ", ".join(wrong[:5]) + (f" and {len(wrong) - 5} more" if len(wrong) > 5 else "")
        raise ConfigError("weights", str(path), f"do not fit the model: missing, extra or reshaped {listed}")
    model.load_state_dict(tensors, strict=True)
    return meta


# -- checkpoints -------------------------------------------------------------------------------------


def state_files(meta: dict[str, Any], state: TrainState, optimizer: dict[str, Any] | None) -> dict[str, bytes]:
    """``state.json`` and ``state.safetensors`` (and ``optimizer.safetensors``, given its state dict)."""
    tensors: dict[str, torch.Tensor] = {}
    record = {**meta, "state": to_tree(dict(state.__dict__), tensors)}
    files = {STATE_TENSORS: tensor_bytes(tensors)}
    if optimizer is not None:
        optim_tensors: dict[str, torch.Tensor] = {}
        record["optimizer"] = to_tree(optimizer, optim_tensors)
        files[OPTIMIZER] = tensor_bytes(optim_tensors)
    files[STATE] = json.dumps(record, allow_nan=False).encode()
    return files


def publish(tmp: Path, final: Path) -> None:
    """Rename the written folder ``tmp`` to ``final`` (the same step written again: swap, never a half folder)."""
    fsync_dir(tmp)
    if final.exists():
        trash = final.with_name(f".{final.name}.old")
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(final, trash)
        os.replace(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_dir(final.parent)


def prune(run_dir: Path, keep: int) -> None:
    for old in checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def checkpoint_meta(state: TrainState, config_hash: str, world_size: int) -> dict[str, Any]:
    """What every checkpoint records of its writer (in state.json, and in its weights' metadata)."""
    return {"format": FORMAT, "config_hash": config_hash, "world_size": world_size, "step": state.step}


def begin_checkpoint(run_dir: Path, step: int, tmp_name: str | None = None) -> tuple[Path, Path]:
    """``checkpoints/step_<N>`` and a fresh hidden temp folder beside it to write into (named ``tmp_name``,
    else a random name), after removing what killed writes left."""
    final = step_dir(run_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(run_dir)
    if tmp_name is None:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
        tmp.chmod(0o755)
    else:
        tmp = final.with_name(tmp_name)
        tmp.mkdir(mode=0o755)
    return final, tmp


def finish_checkpoint(
    run_dir: Path,
    tmp: Path,
    final: Path,
    meta: dict[str, Any],
    state: TrainState,
    *,
    files: dict[str, bytes],
    optimizer: dict[str, Any] | None,
    listed: dict[str, dict[str, Any]] | None = None,
    keep: int,
) -> Path:
    """The one way a checkpoint is finished, plain or sharded: ``files`` and the state files (``state.json``
    with ``meta``; the optimizer's, given its state dict) into ``tmp``, then the manifest of them and of
    ``listed`` (files already there: DCP's shards), then ``tmp`` renamed to ``final``; the last ``keep`` stay."""
    sharded = listed is not None
    write_files(tmp, {**files, **state_files({**meta, "sharded": sharded}, state, optimizer)}, more=listed)
    publish(tmp, final)
    prune(run_dir, keep)
    return final


def save_checkpoint(
    run_dir: Path,
    state: TrainState,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    config_hash: str,
    world_size: int = 1,
    keep: int = 2,
) -> Path:
    """Write the state after ``state.step`` atomically as ``checkpoints/step_<N>``; keep the last ``keep``."""
    final, tmp = begin_checkpoint(run_dir, state.step)
    try:
        meta = checkpoint_meta(state, config_hash, world_size)
        weights = tensor_bytes(model.state_dict(), {k: str(v) for k, v in meta.items()})
        files = {WEIGHTS: weights}
        return finish_checkpoint(
            run_dir, tmp, final, meta, state, files=files, optimizer=optimizer.state_dict(), keep=keep
        )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_state(folder: Path) -> dict[str, Any]:
    """A checkpoint's ``state.json`` (format, config_hash, world_size, step, sharded; ``state``: the
    TrainState's fields, its tensors from ``state.safetensors``), after both match the manifest."""
    folder = Path(folder)
    files = read_manifest(folder)
    meta = parse_json(read_checked(folder, STATE, files), folder / STATE)
    if meta.get("format") != FORMAT or not isinstance(meta.get("state"), dict):
        raise IntegrityError(folder / STATE, f"not a format {FORMAT} checkpoint state (format {meta.get('format')!r})")
    tensors, _ = parse_tensors(read_checked(folder, STATE_TENSORS, files), folder / STATE_TENSORS)
    try:
        meta["state"] = from_tree(meta["state"], tensors, folder / STATE)
    except IntegrityError:
        raise
    except (ValueError, TypeError, AttributeError) as error:  # a tag holding what its writer never writes
        raise IntegrityError(folder / STATE, f"not a checkpoint state ({error})") from None
    if set(meta["state"]) != {f.name for f in TrainState.__dataclass_fields__.values()}:
        raise IntegrityError(folder / STATE, f"its state has the keys {sorted(meta['state'])}, not a TrainState's")
    return meta


def check_dcp(folder: Path, files: dict[str, dict[str, Any]]) -> None:
    """Every file of a sharded checkpoint's ``dcp/`` is one its manifest lists, as listed (and none is missing)."""
    present = {p.relative_to(folder).as_posix() for p in (Path(folder) / DCP).rglob("*") if not p.is_dir()}
    listed = {name for name in files if name.startswith(f"{DCP}/")}
    for name in sorted(present | listed):
        if name not in present:
            raise IntegrityError(Path(folder) / name, f"missing (listed in {MANIFEST})")
        compare(Path(folder) / name, file_entry(Path(folder) / name), files.get(name))
    if not listed:
        raise IntegrityError(Path(folder) / DCP, f"a sharded checkpoint's {MANIFEST} lists no {DCP}/ file")


def verify_checkpoint(folder: Path) -> str | None:
    """Why the checkpoint in ``folder`` cannot be resumed from (a file missing, truncated or altered,
    or format 1's pickles), or None when every file it needs matches its manifest."""
    folder = Path(folder)
    if not (folder / MANIFEST).exists() and any((folder / name).exists() for name in LEGACY):
        return f"format 1 ({' and '.join(LEGACY)} are pickles, which zoo does not read)"
    try:
        meta = read_state(folder)
        files = read_manifest(folder)
        if meta.get("sharded"):
            check_dcp(folder, files)
        else:
            for name in (WEIGHTS, OPTIMIZER):
                parse_tensors(read_checked(folder, name, files), folder / name)
    except IntegrityError as error:
        return str(error)
    return None


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
    if meta.get("sharded") and world_size == 1:  # torch reads dcp/.metadata with pickle
        raise CheckpointMismatch(
            "checkpoint",
            str(folder),
            f"sharded ({DCP}/, written by {meta.get('world_size')} processes), which only a run of several "
            f"processes reads; resume under torchrun, or delete {Path(folder).parent} to start over",
        )
    if meta.get("world_size") != world_size and not meta.get("sharded"):  # DCP reshards; safetensors do not
        raise CheckpointMismatch(
            "checkpoint",
            str(folder),
            f"written by {meta.get('world_size')} processes, this run has {world_size}; resume with as many",
        )
    return TrainState(**meta["state"])


def choose_checkpoint(run_dir: Path, *, config_hash: str, world_size: int) -> tuple[Path | None, dict[str, str]]:
    """The newest checkpoint of ``run_dir`` that passes :func:`verify_checkpoint` (None: none does), and
    why each newer one failed. Those are deleted (the resumed run writes its steps again); a checkpoint
    of another config or world size raises :class:`CheckpointMismatch` first, nothing deleted."""
    failed: dict[str, str] = {}
    chosen = None
    for folder in reversed(checkpoints(run_dir)):
        problem = verify_checkpoint(folder)
        if problem is None:
            check_checkpoint(folder, config_hash=config_hash, world_size=world_size)
            chosen = folder
            break
        failed[folder.name] = problem
    for name in failed:
        shutil.rmtree(Path(run_dir) / CHECKPOINTS / name, ignore_errors=True)
    return chosen, failed


def read_model_optimizer(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, world_size: int) -> None:
    """Model and optimizer state from a checkpoint, each file checked against the manifest: safetensors
    (and the optimizer's structure from ``state.json``), or ``dcp/`` for a run of ``world_size`` > 1."""
    folder = Path(folder)
    files = read_manifest(folder)
    meta = parse_json(read_checked(folder, STATE, files), folder / STATE)
    if meta.get("sharded"):
        if world_size == 1:
            raise CheckpointMismatch("checkpoint", str(folder), f"sharded ({DCP}/): read only by several processes")
        check_dcp(folder, files)
        read_sharded(folder / DCP, model, optimizer)
        return
    load_weights(model, folder / WEIGHTS)
    tensors, _ = parse_tensors(read_checked(folder, OPTIMIZER, files), folder / OPTIMIZER)
    if "optimizer" not in meta:
        raise IntegrityError(folder / STATE, "holds no optimizer state")
    optimizer.load_state_dict(from_tree(meta["optimizer"], tensors, folder / STATE))


def load_checkpoint(
    folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, config_hash: str, world_size: int = 1
) -> TrainState:
    """Load model and optimizer state from ``folder`` (after :func:`check_checkpoint`); returns its TrainState."""
    state = check_checkpoint(folder, config_hash=config_hash, world_size=world_size)
    read_model_optimizer(Path(folder), model, optimizer, world_size=world_size)
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


