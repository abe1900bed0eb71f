"""Model-level config: the ``model`` section and per-layer block overrides, validated before any tensor work.

A stack's blocks all start from ``block``; ``pattern`` is a list of overrides of that block repeated
over the depth (layer i takes ``pattern[i % len(pattern)]``, truncated at the depth: a 3:1 hybrid is
``[{attn: gated_deltanet}, {attn: gated_deltanet}, {attn: gated_deltanet}, {}]``), and ``layers`` maps a
layer index to overrides applied on top, so a mixed stack is one line on the command line
(``+model.layers.3.attn=mqa``). An axis given as a name (``attn: mqa``) replaces that axis (with the
part's own defaults); a node with the same ``name`` (or none) changes only the options it lists
(``attn: {n_kv_heads: 1}``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zoo.assembly.spec import BlockSpec, resolve_block, to_dict
from zoo.core.errors import ConfigError
from zoo.core.interface import hook
from zoo.core.registry import AXES
from zoo.models.ngram import ngram_options
from zoo.models.stack import check_positions, embeds_positions

#: ``model`` keys and their defaults.
MODEL_DEFAULTS: dict[str, Any] = {
    "vocab_size": None, "n_layers": 4, "tie_embeddings": True, "layers": {}, "pattern": [], "value_embeddings": False,
    "logit_softcap": None, "embedding_norm": False, "scale_embedding": False, "smear": False, "backout": False,
    "ngram": None, "ngram_table": None, "ngram_scale": 0.1,
    "kv_share": 1,
}  # fmt: skip
#: ``model`` keys of a decoder-only model's own (zoo.models.language), refused away from their defaults elsewhere.
DECODER_ONLY = (
    "value_embeddings", "logit_softcap", "embedding_norm", "scale_embedding", "smear", "backout", "kv_share", "ngram",
    "ngram_table", "ngram_scale",
)  # fmt: skip
#: ``model.vocab_size: null`` outside a run (a run takes its task's vocabulary: zoo.lab.planning.run_model): bytes.
DEFAULT_VOCAB = 256

#: ``encoder`` keys (read by build_seq2seq only); ``n_layers`` defaults to the decoder's.
ENCODER_DEFAULTS: dict[str, Any] = {"n_layers": None, "block": {}, "layers": {}, "pattern": []}
#: What a ``pattern`` is, for errors.
PATTERN_FORM = (
    "must be a list of block overrides repeated over the depth (layer i takes pattern[i % len(pattern)]), "
    "e.g. [{attn: gated_deltanet}, {attn: gated_deltanet}, {attn: gated_deltanet}, {}], or [] for none"
)


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
    """The validated ``model`` section: vocab_size (null: :data:`DEFAULT_VOCAB`), n_layers, tie_embeddings,
    layers, pattern, value_embeddings, logit_softcap (null, or c > 0), embedding_norm, scale_embedding, smear,
    backout, kv_share (a positive integer), ngram (null, 2, 3), ngram_table (null, rows >= 2), ngram_scale (> 0)."""
    options = section(raw, "model", MODEL_DEFAULTS)
    if options["vocab_size"] is None:
        options["vocab_size"] = DEFAULT_VOCAB
    positive_int("model.vocab_size", options["vocab_size"])
    positive_int("model.n_layers", options["n_layers"])
    positive_int("model.kv_share", options["kv_share"])
    ngram_options(options)
    for key in ("tie_embeddings", "value_embeddings", "embedding_norm", "scale_embedding", "smear", "backout"):
        if not isinstance(options[key], bool):
            raise ConfigError(f"model.{key}", options[key], "must be true or false")
    cap = options["logit_softcap"]
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int | float) or not cap > 0):
        raise ConfigError("model.logit_softcap", cap, "a number > 0, or null for no cap")
    options["logit_softcap"] = None if cap is None else float(cap)
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
    block: Mapping[str, Any],
    n_layers: int,
    layers: Mapping[Any, Any] | None,
    field: str,
    pattern: Sequence[Any] | None = (),
) -> list[BlockSpec]:
    """One validated BlockSpec per layer: ``block`` with ``pattern[i % len(pattern)]``, then ``layers[i]``,
    applied to layer i (a pattern that does not divide the depth is truncated at it).

    field: where ``layers`` sits in the config (``model.layers``), for error messages; the pattern sits
    beside it (``model.pattern``). Positions added at the token embedding must agree on every layer
    (:func:`zoo.models.stack.check_positions`): a layer that differs is named by where its ``pos`` came from.
    """
    base = resolve_block(block)
    if layers is not None and not isinstance(layers, Mapping):
        raise ConfigError(field, layers, "must map layer indices to block overrides, e.g. {3: {attn: mqa}}")
    section = field.rpartition(".")[0]
    if pattern and isinstance(pattern, Sequence) and not isinstance(pattern, str | bytes) and len(pattern) > n_layers:
        raise ConfigError(f"{section}.pattern[{n_layers}]", pattern[n_layers], f"past the depth: {section}.n_layers="
                          f"{n_layers} takes pattern[0] to pattern[{n_layers - 1}]; drop the entries past it or raise "
                          f"{section}.n_layers")  # fmt: skip
    merged, fields = _pattern_blocks(block, base, pattern, f"{section}.pattern")
    specs = [merged[i % len(merged)][1] for i in range(n_layers)]
    origins = [fields[i % len(fields)] if pattern else f"{field}.{i}" for i in range(n_layers)]
    for key, changes in (layers or {}).items():
        index = _layer_index(f"{field}.{key}", key, n_layers)
        specs[index] = _override(merged[index % len(merged)][0], changes, base, f"{field}.{key}")[1]
        origins[index] = f"{field}.{key}"
    check_positions(specs, origins)
    return specs


def stack_specs(block: Mapping[str, Any], options: Mapping[str, Any], section: str = "model") -> list[BlockSpec]:
    """:func:`layer_specs` of a validated section (``model``, ``encoder``): its n_layers, layers and pattern."""
    return layer_specs(block, options["n_layers"], options["layers"], f"{section}.layers", options["pattern"])


def _pattern_blocks(
    block: Mapping[str, Any], base: BlockSpec, pattern: Sequence[Any] | None, field: str
) -> tuple[list[tuple[Mapping[str, Any], BlockSpec]], list[str]]:
    """Each pattern entry's block config and spec, resolved once, and its field (``model.pattern[1]``);
    the block alone for an empty pattern (or none)."""
    if pattern is not None and (isinstance(pattern, str | bytes | Mapping) or not isinstance(pattern, Sequence)):
        raise ConfigError(field, pattern, PATTERN_FORM)
    if not pattern:
        return [(block, base)], [field]
    fields = [f"{field}[{j}]" for j in range(len(pattern))]
    return [_override(block, changes, base, name) for changes, name in zip(pattern, fields, strict=True)], fields


def _changes(changes: Any, base: BlockSpec, field: str) -> Mapping[str, Any]:
    """``changes`` checked as one layer's block overrides (a mapping keeping block.d_model, and the block's
    position when that is added at the token embedding, or when it would be)."""
    if not isinstance(changes, Mapping):
        raise ConfigError(field, changes, "must be a mapping of block overrides, e.g. {attn: mqa}, or {} for none")
    if "d_model" in changes and changes["d_model"] != base.dims.d_model:
        raise ConfigError(f"{field}.d_model", changes["d_model"], f"must equal block.d_model={base.dims.d_model}")
    pos = changes.get("pos")
    name = pos.get("name") if isinstance(pos, Mapping) else pos
    block_pos = base["pos"].part.name
    if isinstance(name, str) and name != block_pos and name in AXES["pos"].names():
        if embeds_positions(base) or "embedding" in hook(AXES["pos"].get(name).cls, "needs"):
            raise ConfigError(f"{field}.pos", name, f"positions added at the token embedding (learned, sinusoidal) "
                              f"apply to every layer: set them once with block.pos (pos={block_pos} here), not per "
                              "layer")  # fmt: skip
    return changes


def _override(
    block: Mapping[str, Any], changes: Any, base: BlockSpec, field: str
) -> tuple[Mapping[str, Any], BlockSpec]:
    """``block`` with one layer's ``changes``, and its spec; an error names ``field`` (``model.layers.3``)."""
    config = merge_block(block, _changes(changes, base, field))
    try:
        return config, resolve_block(config)
    except ConfigError as error:  # name the layer's field, not the shared block's
        name = f"{field}.{error.field.removeprefix('block.')}"
        raise ConfigError(name, error.value, error.allowed) from None


def layer_field(options: Mapping[str, Any], index: int, section: str = "model") -> str:
    """Where layer ``index``'s overrides sit in a validated section, for errors: its pattern entry
    (``model.pattern[1]``) when a pattern gives it and ``model.layers`` does not, else ``model.layers.3``."""
    if any(str(key) == str(index) for key in options["layers"] or {}) or not options["pattern"]:
        return f"{section}.layers.{index}"
    return f"{section}.pattern[{index % len(options['pattern'])}]"


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
