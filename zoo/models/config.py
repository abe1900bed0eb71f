"""Model-level config: the ``model`` section and per-layer block overrides, validated before any tensor work.

A stack's blocks all start from ``block``; ``layers`` maps a layer index to overrides of that
block, so a mixed stack is one line on the command line (``+model.layers.3.attn=mqa``). An axis
given as a name (``attn: mqa``) replaces that axis (with the part's own defaults); a node with the
same ``name`` (or none) changes only the options it lists (``attn: {n_kv_heads: 1}``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zoo.assembly.spec import BlockSpec, resolve_block, to_dict
from zoo.core.errors import ConfigError
from zoo.core.registry import AXES

#: ``model`` keys and their defaults.
MODEL_DEFAULTS: dict[str, Any] = {"vocab_size": None, "n_layers": 4, "tie_embeddings": True, "layers": {}}
#: ``model.vocab_size: null`` outside a run (a run takes its task's vocabulary: zoo.lab.planning.run_model): bytes.
DEFAULT_VOCAB = 256

#: ``encoder`` keys (read by build_seq2seq only); ``n_layers`` defaults to the decoder's.
ENCODER_DEFAULTS: dict[str, Any] = {"n_layers": None, "block": {}, "layers": {}}


def section(raw: Mapping[str, Any], name: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """``raw[name]`` merged over ``defaults``; an unknown key is a ConfigError naming it."""
    node = raw.get(name) or {}
    if not isinstance(node, Mapping):
        raise ConfigError(name, node, f"must be a mapping with keys {', '.join(defaults)}")
    for key, value in node.items():
        if key not in defaults:
            raise ConfigError(f"{name}.{key}", value, f"unknown key; allowed: {', '.join(defaults)}")
    return {**defaults, **node}


def positive_int(field: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(field, value, "must be a positive integer")
    return value


def model_options(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The validated ``model`` section: vocab_size (null: :data:`DEFAULT_VOCAB`), n_layers, tie_embeddings, layers."""
    options = section(raw, "model", MODEL_DEFAULTS)
    if options["vocab_size"] is None:
        options["vocab_size"] = DEFAULT_VOCAB
    positive_int("model.vocab_size", options["vocab_size"])
    positive_int("model.n_layers", options["n_layers"])
    if not isinstance(options["tie_embeddings"], bool):
        raise ConfigError("model.tie_embeddings", options["tie_embeddings"], "must be true or false")
    return options


def merge_block(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` block config with ``changes`` applied (axes by the rule in the module docstring)."""
    merged = dict(base)
    for key, value in changes.items():
        if key in AXES and isinstance(value, Mapping):
            old = merged.get(key)
            old = {"name": old} if isinstance(old, str) else dict(old or {})
            same = "name" not in value or value["name"] == old.get("name")
            merged[key] = {**old, **value} if same else dict(value)
        else:
            merged[key] = value
    return merged


def layer_specs(
    block: Mapping[str, Any], n_layers: int, layers: Mapping[Any, Any] | None, field: str
) -> list[BlockSpec]:
    """One validated BlockSpec per layer: ``block`` with ``layers[i]`` applied to layer i.

    field: where ``layers`` sits in the config (``model.layers``), for error messages.
    """
    base = resolve_block(block)
    if layers is not None and not isinstance(layers, Mapping):
        raise ConfigError(field, layers, "must map layer indices to block overrides, e.g. {3: {attn: mqa}}")
    specs = [base] * n_layers
    for key, changes in (layers or {}).items():
        index = _layer_index(f"{field}.{key}", key, n_layers)
        if not isinstance(changes, Mapping):
            raise ConfigError(f"{field}.{key}", changes, "must be a mapping of block overrides, e.g. {attn: mqa}")
        if "d_model" in changes and changes["d_model"] != base.dims.d_model:
            raise ConfigError(
                f"{field}.{key}.d_model", changes["d_model"], f"must equal block.d_model={base.dims.d_model}"
            )
        try:
            specs[index] = resolve_block(merge_block(block, changes))
        except ConfigError as error:  # name the layer's field, not the shared block's
            name = f"{field}.{key}.{error.field.removeprefix('block.')}"
            raise ConfigError(name, error.value, error.allowed) from None
    return specs


def _layer_index(field: str, key: Any, n_layers: int) -> int:
    allowed = f"a layer index in 0..{n_layers - 1}"
    if isinstance(key, bool) or not (isinstance(key, int) or (isinstance(key, str) and key.isdigit())):
        raise ConfigError(field, key, f"must be {allowed}")
    index = int(key)
    if not 0 <= index < n_layers:
        raise ConfigError(field, index, f"must be {allowed}")
    return index


def block_section(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The ``block`` section as a plain dict (empty when absent)."""
    return to_dict(raw.get("block") or {})
