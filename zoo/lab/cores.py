"""The cores this process may use (its CPU affinity where the platform has one)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on: its affinity set (Linux), else the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
