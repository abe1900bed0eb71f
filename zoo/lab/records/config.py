"""What a run computes, named: the config less its runtime keys (:func:`semantic_config`), its short hash
(:func:`config_hash`, a run folder's identity) and the differences between two configs, for refusals."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from zoo.lab.files import clean
from zoo.lab.keys import (
    NEUTRAL_ATTN,
    NEUTRAL_BLOCK,
    NEUTRAL_MLP,
    NEUTRAL_NORM,
    NEUTRAL_OBJECTIVE,
    NEUTRAL_OPTIM,
    NEUTRAL_STACK,
    NEUTRAL_TASK,
    NEUTRAL_TOP,
    NEUTRAL_TRAIN,
    PARAM,
    RECIPE,
    RUNTIME,
    RUNTIME_TRAIN,
    STACKS,
)


def semantic_config(config: dict[str, Any], *, branch_path: bool = False) -> dict[str, Any]:
    """What a run computes: its resolved config less the runtime-only keys, and less the keys added since
    at their neutral values (:data:`zoo.lab.keys.NEUTRAL_TRAIN`, ``NEUTRAL_TOP``, ``NEUTRAL_BLOCK``,
    ``NEUTRAL_NORM``, ``NEUTRAL_ATTN``, ``NEUTRAL_MLP``, ``NEUTRAL_OBJECTIVE``, ``NEUTRAL_OPTIM``,
    ``NEUTRAL_STACK`` and ``NEUTRAL_TASK``, the default recipe, ``param=standard``).

    A branch's source is not named by its path (``train.branch.from``, left out): the branch records the
    source's config hash, step and checkpoint checksum instead (zoo.lab.planning.branch), so a source and its branches
    moved together are the same runs. ``branch_path``: keep the path, as hashes recorded before did."""
    from zoo.lab.recipe import is_default, param

    semantic = without_neutral({k: v for k, v in config.items() if k not in RUNTIME}, NEUTRAL_TOP)
    for key in RECIPE:
        if key in semantic and is_default(key, semantic[key]):
            del semantic[key]
    if PARAM in semantic and param.is_default(semantic[PARAM]):
        del semantic[PARAM]
    if isinstance(semantic.get("optim"), dict):
        semantic["optim"] = without_neutral(semantic["optim"], NEUTRAL_OPTIM)
    if isinstance(semantic.get("objective"), dict):
        semantic["objective"] = without_neutral(semantic["objective"], NEUTRAL_OBJECTIVE)
    branch = (semantic.get("train") or {}).get("branch") if isinstance(semantic.get("train"), dict) else None
    if isinstance(branch, dict) and not branch_path:
        semantic["train"] = {**semantic["train"], "branch": {**branch, "from": None}}
    block = semantic.get("block")
    if isinstance(block, dict):
        block = without_neutral(block, NEUTRAL_BLOCK)
        for axis, neutral in (("norm", NEUTRAL_NORM), ("attn", NEUTRAL_ATTN), ("mlp", NEUTRAL_MLP)):
            if isinstance(block.get(axis), dict):
                block = {**block, axis: without_neutral(block[axis], neutral)}
        semantic["block"] = block
    if isinstance(semantic.get("task"), dict):
        semantic["task"] = without_neutral(semantic["task"], NEUTRAL_TASK)
    for stack in STACKS:
        if isinstance(semantic.get(stack), dict):
            semantic[stack] = without_neutral(semantic[stack], NEUTRAL_STACK)
    if isinstance(semantic.get("train"), dict):
        train = {k: v for k, v in semantic["train"].items() if k not in RUNTIME_TRAIN}
        semantic["train"] = without_neutral(train, NEUTRAL_TRAIN)
    return semantic


def without_neutral(section: dict[str, Any], neutral: dict[str, Any]) -> dict[str, Any]:
    """``section`` less the keys at their ``neutral`` value (keys added after runs were recorded)."""
    return {k: v for k, v in section.items() if not (k in neutral and v == neutral[k])}


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 0.1}}`` -> ``{"train.lr": 0.1}`` (lists are values)."""
    if not isinstance(node, Mapping):
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def config_differences(theirs: dict[str, Any], mine: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The dotted keys where two run configs compute differently (:func:`semantic_config`), each with
    (theirs, mine); ``"unset"`` for a key one of them does not have."""
    a, b = flatten(semantic_config(theirs)), flatten(semantic_config(mine))
    keys = sorted(set(a) | set(b))
    return {k: (a.get(k, "unset"), b.get(k, "unset")) for k in keys if a.get(k, "unset") != b.get(k, "unset")}


def differences_text(differ: Mapping[str, tuple[Any, Any]], most: int) -> str:
    """``train.lr: 0.003 there, 0.01 here; ...``: the first ``most`` of :func:`config_differences`."""
    shown = "; ".join(f"{k}: {theirs!r} there, {mine!r} here" for k, (theirs, mine) in list(differ.items())[:most])
    return shown + (f" and {len(differ) - most} more" if len(differ) > most else "")


def config_hash(config: dict[str, Any], *, branch_path: bool = False) -> str:
    """A short hash of what a run computes (:func:`semantic_config`; ``branch_path``: as recorded before
    branches were named by their source's identity)."""
    text = json.dumps(clean(semantic_config(config, branch_path=branch_path)), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
