"""A run's throughput in model FLOPs: ``flops_per_second`` over its steady steps (after the first step this
process trained, which holds compile and kernel warm-up; evaluation is never training time) and ``mfu``,
that rate over the dense bf16 peak of the devices it ran on (:data:`PEAKS`; none on a CPU)."""

from __future__ import annotations

from typing import Any

import torch

#: Dense bf16 tensor-core peaks in FLOP/s per device, from the vendors' data sheets (the "with sparsity"
#: figures halved), matched against ``torch.cuda.get_device_name`` by the longest name it contains.
PEAKS: dict[str, float] = {
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,  # SXM (``NVIDIA H100 80GB HBM3``)
    "H200": 989e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
}


def peak_of(name: str) -> tuple[str, float] | None:
    """The :data:`PEAKS` entry whose name ``name`` (a CUDA device's) contains, the longest first; None: unknown."""
    found = [key for key in PEAKS if key.lower() in name.lower()]
    if not found:
        return None
    key = max(found, key=len)
    return key, PEAKS[key]


#: What :func:`throughput` measures: summary.json's fields, in order.
MEASURED = ("flops_per_second", "mfu", "mfu_peak", "mfu_reason")


def throughput(flops: float, seconds: float, device: torch.device, world: int = 1) -> dict[str, Any]:
    """``flops_per_second`` (``flops`` model FLOPs over ``seconds`` of training; None without a second of it),
    and ``mfu`` against the peak of ``world`` devices like ``device`` with the peak used (``mfu_peak``), or None
    with ``mfu_reason``."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return measured(flops, seconds, device.type, name, world)


def measured(flops: float, seconds: float, device: str, name: str | None, world: int = 1) -> dict[str, Any]:
    """:func:`throughput` on a device of type ``device`` (``cuda``, ``cpu``) named ``name`` (a CUDA device's)."""
    rate = flops / seconds if seconds > 0 and flops > 0 else None
    out: dict[str, Any] = {"flops_per_second": rate, "mfu": None}
    if device != "cuda":
        return out | {"mfu_reason": f"no peak for a {device} device: mfu is measured on CUDA devices only"}
    peak = peak_of(name or "")
    if peak is None:
        return out | {"mfu_reason": f"{name!r} is not in the table of dense bf16 peaks ({', '.join(PEAKS)})"}
    if rate is None:
        return out | {"mfu_reason": "no steady training time measured (a run of one step)"}
    return out | {"mfu": rate / (peak[1] * world), "mfu_peak": {"device": peak[0], "flops_per_second": peak[1]}}
