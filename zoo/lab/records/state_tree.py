"""A training state as JSON and safetensors, never a pickle: nested values become a JSON tree with tensors
named (:func:`to_tree`, :func:`from_tree`), tensors become safetensors bytes, and both are parsed back
checked (:class:`IntegrityError` names the file and what is wrong). Also the random generators' state
of a rank."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from zoo.core.errors import ConfigError

_TAGS = ("__tensor__", "__int_keys__", "__tuple__", "__float__")


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


def to_tree(value: Any, tensors: dict[str, torch.Tensor], path: str = "") -> Any:
    """``value`` as JSON: its tensors moved into ``tensors`` (named by their path); tuples, int keys and
    non-finite floats tagged, so :func:`from_tree` gives back exactly ``value``."""
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().to("cpu").contiguous()
        return {"__tensor__": path}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, (list, tuple)):
        items = [to_tree(v, tensors, f"{path}/{i}") for i, v in enumerate(value)]
        return {"__tuple__": items} if isinstance(value, tuple) else items
    if isinstance(value, Mapping) and all(isinstance(k, str) and k not in _TAGS for k in value):
        return {k: to_tree(v, tensors, f"{path}/{k}") for k, v in value.items()}
    if isinstance(value, Mapping) and all(isinstance(k, int) and not isinstance(k, bool) for k in value):
        return {"__int_keys__": {str(k): to_tree(v, tensors, f"{path}/{k}") for k, v in value.items()}}
    raise TypeError(f"{path or '/'}: a {type(value).__name__} is not saved (tensors, JSON values, tuples only)")


def from_tree(value: Any, tensors: dict[str, torch.Tensor], path: Path) -> Any:
    """What :func:`to_tree` was given; ``path`` (the JSON file) names the file in errors."""
    if isinstance(value, list):
        return [from_tree(v, tensors, path) for v in value]
    if not isinstance(value, dict):
        return value
    tag = next(iter(value)) if len(value) == 1 and next(iter(value)) in _TAGS else None
    if tag is None:
        return {k: from_tree(v, tensors, path) for k, v in value.items()}
    inner = value[tag]
    if tag == "__tensor__":
        if inner not in tensors:
            raise IntegrityError(path, f"names tensor {inner!r}, which its safetensors file does not hold")
        return tensors[inner]
    if tag == "__int_keys__":
        return {int(k): from_tree(v, tensors, path) for k, v in inner.items()}
    if tag == "__tuple__":
        return tuple(from_tree(v, tensors, path) for v in inner)
    return float(inner)  # "nan", "inf", "-inf"


def tensor_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, metadata=metadata)


def parse_tensors(data: bytes, path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A safetensors file's tensors and metadata, from its bytes (nothing is executed: a JSON header, raw data)."""
    from safetensors.torch import load

    try:
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + size])
        tensors = load(data)
    except Exception as error:  # noqa: BLE001 (safetensors raises its own error types)
        reason = (str(error).splitlines() or [type(error).__name__])[0]
        raise IntegrityError(path, f"not a safetensors file ({reason})") from None
    return tensors, dict(header.get("__metadata__") or {})


def parse_json(data: bytes, path: Path) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as error:
        raise IntegrityError(path, f"not JSON ({error})") from None
    if not isinstance(value, dict):
        raise IntegrityError(path, "not a JSON object")
    return value


class IntegrityError(ConfigError):
    """A file of a run folder that cannot be trusted: missing, truncated, altered (its sha256 is not the
    one its manifest lists), not listed, unreadable as safetensors or JSON, or a format zoo no longer reads."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__("file", str(path), problem)
