"""A run's setting of a key as a sweep's report reads it (its override, its group choice, else its config
value), for a finished run's record and for a sweep's job checked before it runs alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: A run's value for a key it leaves unset (null or absent in its config: a run that is not a branch has no
#: ``train.branch.step``), so that it reads as a value of its own rather than an empty cell.
UNSET = "unset"


def parse_overrides(overrides: Sequence[str]) -> dict[str, str]:
    """``["+sweeps=quick", "norm=rmsnorm"]`` -> ``{"sweeps": "quick", "norm": "rmsnorm"}``."""
    out = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep:
            out[key.lstrip("+~")] = value
    return out


def config_value(config: Mapping[str, Any] | None, key: str) -> Any:
    """``config``'s value at the dotted ``key`` (``train.steps``); None when it has none."""
    node: Any = config or {}
    for part in key.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def setting(key: str, overrides: Mapping[str, str], choices: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """The run's setting of ``key``: its override (``overrides``: :func:`parse_overrides`'), its group choice,
    or its config value; :data:`UNSET` for one its config leaves null or does not have."""
    if key in overrides:
        return overrides[key]
    if key in choices:
        return str(choices[key])
    node = config_value(config, key)
    return UNSET if node is None else str(node)
