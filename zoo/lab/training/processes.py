"""The processes of a run: rank and world from torchrun or submitit, threads per process, the device each
rank takes, joining the process group, checking that ranks hold the same weights, and what they ran on
(summary.json's ``versions``: the packages, the platform and the CPU with its kernels)."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any

import hydra
import torch
import torch.distributed as dist

from zoo.core.registry import installed_plugins
from zoo.lab.cores import usable_cores
from zoo.lab.planning.plan import RunPlan
from zoo.lab.planning.train_config import TrainConfig
from zoo.lab.records import checkpoint_writers as writers
from zoo.lab.records.summary import RunRecord


def default_threads(parallel_jobs: int = 1) -> int:
    """Cores this process may use, shared among the jobs running beside it on this machine; at most
    ``OMP_NUM_THREADS`` where that is set (torch's own default obeys it, and so does a run)."""
    cores = usable_cores()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    share = max(1, cores // max(1, local * parallel_jobs))
    asked = os.environ.get("OMP_NUM_THREADS", "")
    return min(share, int(asked)) if asked.isdigit() and int(asked) > 0 else share


def take_device(device: torch.device, world: int, local_rank: int) -> torch.device:
    """The device this process trains on (under torchrun on CUDA: its local rank's), made current."""
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", local_rank)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    return device


def join_processes(
    plan: RunPlan,
    train_cfg: TrainConfig,
    device: torch.device,
    out_dir: Path | None,
    resume_from: Path | None,
    record: RunRecord,
    writer: Any,
) -> tuple[Path | None, Any, Any]:
    """Start the process group; every rank learns rank 0's checkpoint to resume from. Under FSDP2 or tensor
    parallelism: the device mesh, and a writer of every rank's shards. Returns (resume_from, mesh, writer)."""
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    shared = [str(resume_from) if resume_from is not None else None, str(out_dir) if out_dir else None]
    dist.broadcast_object_list(shared, src=0)  # rank 0 found it; every rank loads it
    resume_from = Path(shared[0]) if shared[0] is not None else None
    mesh = None
    if plan.mesh.sharded:
        mesh = plan.mesh.mesh(device.type)
        if shared[1] is not None and train_cfg.checkpoint_every > 0:  # every rank writes its shards there
            writer = writers.ShardedCheckpointWriter(
                Path(shared[1]), config_hash=record.config_hash, world_size=record.world_size,
                keep=train_cfg.keep_checkpoints,
            )  # fmt: skip
    return resume_from, mesh, writer


def ranks_in_sync(model: torch.nn.Module) -> bool:
    """Whether every DDP rank ends with the same parameters (same init, averaged gradients)."""
    flat = torch.cat([p.detach().double().flatten() for p in model.parameters()])
    weights = torch.linspace(1, 2, len(flat), dtype=torch.float64, device=flat.device)
    mine = torch.stack([flat.sum(), (flat * weights).sum()])
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return all(torch.equal(every[0], other) for other in every[1:])


def versions() -> dict[str, Any]:
    """What the run ran on: python, torch, zoo, hydra, the platform, the installed part plugins, and the CPU with the
    instruction set torch's kernels use on it (a run's last digits can move with either: docs/results.md)."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "zoo": package_version(),
        "hydra": hydra.__version__,
        "platform": platform.platform(),
        "plugins": installed_plugins(),
        "cpu": {"model": cpu_model(), "kernels": torch.backends.cpu.get_cpu_capability()},
    }


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``'s, else ``platform.processor()``), or ``unknown``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def package_version() -> str:
    try:
        return importlib.metadata.version("zoo")
    except importlib.metadata.PackageNotFoundError:  # imported from a checkout that is not installed
        return "unknown"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
