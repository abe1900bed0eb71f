"""Timing shared by the benchmark scripts: side by side, round-robin, median."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def sync(device: str | torch.device) -> None:
    """Wait for queued GPU work, so a timer measures it (no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(
    steps: dict[str, Callable[[], object]], device: str | torch.device, repeats: int, warmup: int = 1
) -> dict[str, float]:
    """Median seconds of each step, timed round-robin so drift in machine load hits all alike."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    sync(device)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}
