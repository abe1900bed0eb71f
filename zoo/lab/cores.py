"""This process's share of the machine, read without torch: the cores it may use (its CPU affinity where the
platform has one), how loaded the machine is, and its rank in a torchrun or submitit job."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on: its affinity set (Linux), else the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def load_average() -> float | None:
    """The machine's 1-minute load average (runnable processes, every user's), None where the platform has none."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def machine_load(start: float | None) -> dict[str, float | int | None]:
    """A run's record of what shared its machine: the load average at the loop's ``start`` and now (its end),
    the cores this process had and the machine's (a load above the machine's cores: processes waited for one)."""
    return {"start": start, "end": load_average(), "cores": usable_cores(), "machine_cores": os.cpu_count()}


def dist_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment, or from the tasks of a submitit
    job (a sweep on ``hydra/launcher=submitit_slurm`` with ``hydra.launcher.tasks_per_node`` > 1: one
    process per task, each running the run); (0, 1, 0) for one process."""
    if "WORLD_SIZE" not in os.environ and submitit_tasks() > 1:
        from submitit.helpers import TorchDistributedEnvironment

        # RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR (the job's first node), MASTER_PORT (from the job id)
        TorchDistributedEnvironment().export(set_cuda_visible_devices=False)  # cuda:LOCAL_RANK is chosen below
    env = os.environ
    return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0))


def submitit_tasks() -> int:
    """Processes in this submitit job (1 outside one)."""
    if "SUBMITIT_EXECUTOR" not in os.environ:
        return 1
    import submitit

    return submitit.JobEnvironment().num_tasks
