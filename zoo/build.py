"""The one place where config names become classes.

``resolve_block`` validates a block config (a dict or an OmegaConf node) without touching
tensors; ``build_block`` turns the result into a :class:`~zoo.block.Block`.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cache
from typing import Any, Literal, Union

from omegaconf import DictConfig, OmegaConf

import zoo.parts  # noqa: F401  (registers the built-in parts)
from zoo.block import Block
from zoo.compat import Context, unmet_need
from zoo.dims import BlockDims
from zoo.errors import ConfigError
from zoo.match import mlp_dims
from zoo.parts.cross_attention import CrossAttention
from zoo.registry import AXES, Part

SIZE_FIELDS = {"d_model", "n_heads", "d_ff", "max_len"}


@dataclass(frozen=True)
class PartChoice:
    """A chosen part and the options it is built with (registry defaults, then the config's)."""

    part: Part
    options: dict[str, Any]

    def build(self, *args: Any) -> Any:
        return self.part.cls(*args, **self.options)


@dataclass(frozen=True)
class BlockSpec:
    """A validated block config: sizes plus one choice per axis."""

    dims: BlockDims
    choices: dict[str, PartChoice]

    def __getitem__(self, axis: str) -> PartChoice:
        return self.choices[axis]

    @property
    def names(self) -> dict[str, str]:
        return {axis: choice.part.name for axis, choice in self.choices.items()}


def to_dict(cfg: Mapping[str, Any] | DictConfig) -> dict[str, Any]:
    """A plain dict of a config, with interpolations resolved."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    if not isinstance(cfg, Mapping):
        raise ConfigError("block", cfg, "must be a mapping of block settings")
    return dict(cfg)


def resolve_block(cfg: Mapping[str, Any] | DictConfig) -> BlockSpec:
    """Validate a block config. Raises ConfigError naming the field, value and what is allowed.

    An axis may be given as a node (``{"name": "rmsnorm", "eps": 1e-6}``) or just a name.
    """
    raw = to_dict(cfg)
    known = {f.name for f in fields(BlockDims)} | set(AXES)
    for key in raw:
        if key not in known:
            raise ConfigError(f"block.{key}", raw[key], f"unknown key; allowed: {', '.join(sorted(known))}")
    dims = _resolve_dims(raw)
    choices = {axis: _resolve_part(axis, raw.get(axis), dims) for axis in AXES}
    return BlockSpec(dims, choices)


def build_block(cfg: Mapping[str, Any] | DictConfig | BlockSpec, *, context: Context = "block") -> Block:
    """Build a block from a config (``cfg.block`` as composed, or a plain dict with its keys).

    ``context``: where the block lives (``block``: alone; ``model``: in a model, which provides
    the token embedding that absolute positions need). A part whose needs the context does not
    meet raises ConfigError (zoo.compat).
    """
    spec = cfg if isinstance(cfg, BlockSpec) else resolve_block(cfg)
    error = unmet_need(spec, context)
    if error is not None:
        raise error
    dims = spec.dims
    position = spec["pos"].build(dims)
    attn = spec["attn"].build(dims, position)
    mlp = spec["mlp"].build(mlp_dims(spec))  # the matched width under block.mlp.match=params
    cross = None
    if dims.cross_attention:  # same key/value heads and backend as the self-attention
        options = spec["attn"].options
        cross = CrossAttention(dims, n_kv_heads=options.get("n_kv_heads"), backend=options.get("backend", "sdpa"))
    n_branches = 3 if cross is not None else 2
    placement = spec["placement"].build(dims, lambda: spec["norm"].build(dims), n_branches)
    return Block(placement, attn, mlp, dims.d_model, cross_attn=cross)


def _resolve_dims(raw: dict[str, Any]) -> BlockDims:
    values = {}
    for f in fields(BlockDims):
        if f.name in raw:
            values[f.name] = check_type(f"block.{f.name}", raw[f.name], _hints(BlockDims)[f.name])
    dims = BlockDims(**values)
    for name in SIZE_FIELDS:
        value = getattr(dims, name)
        if value is not None and value < 1:
            raise ConfigError(f"block.{name}", value, "must be a positive integer")
    if not 0 <= dims.dropout < 1:
        raise ConfigError("block.dropout", dims.dropout, "must be in [0, 1)")
    if dims.d_model % dims.n_heads:
        raise ConfigError(
            "block.n_heads", dims.n_heads, f"must divide d_model={dims.d_model} (head size = d_model / n_heads)"
        )
    return dims


def _resolve_part(axis: str, node: Any, dims: BlockDims) -> PartChoice:
    registry = AXES[axis]
    if node is None:
        raise ConfigError(f"block.{axis}", None, f"missing; choose one of: {', '.join(registry.names())}")
    node = {"name": node} if isinstance(node, str) else to_dict(node)
    if "name" not in node:
        raise ConfigError(f"block.{axis}", node, f"needs a 'name': one of {', '.join(registry.names())}")
    part = registry.get(node["name"])
    params = part_options(part.cls)
    options = dict(part.defaults)
    for key, value in node.items():
        if key == "name":
            continue
        if key not in params:
            allowed = ", ".join(params) or "none"
            raise ConfigError(
                f"block.{axis}.{key}", value, f"not an option of {axis} {part.name!r}; options: {allowed}"
            )
        options[key] = check_type(f"block.{axis}.{key}", value, params[key])
    check = getattr(part.cls, "check", None)
    if check is not None:
        check(dims, **options)
    return PartChoice(part, options)


@cache
def part_options(cls: type) -> dict[str, Any]:
    """A part's config options: its constructor's keyword-only parameters, with their types."""
    hints = _hints(cls.__init__)
    return {
        p.name: hints.get(p.name, Any)
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def option_defaults(part: Part) -> dict[str, Any]:
    """Every option of a part with the value it gets when a config leaves it out."""
    signature = inspect.signature(part.cls.__init__).parameters
    return {name: part.defaults.get(name, signature[name].default) for name in part_options(part.cls)}


@cache
def _hints(obj: Any) -> dict[str, Any]:
    return typing.get_type_hints(obj)


def check_type(field: str, value: Any, annotation: Any) -> Any:
    """``value`` if it fits ``annotation`` (int, float, bool, str, Literal, Optional); else ConfigError.

    Ints are accepted for floats (and converted); bools are not accepted for numbers.
    """
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return value
    if origin is Literal:
        choices = typing.get_args(annotation)
        if value not in choices:
            raise ConfigError(field, value, f"must be one of {', '.join(map(repr, choices))}")
        return value
    if origin in (Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is not type(None):
                try:
                    return check_type(field, value, option)
                except ConfigError:
                    pass
        names = ["null" if o is type(None) else getattr(o, "__name__", str(o)) for o in options]
        raise ConfigError(field, value, f"must be {' or '.join(names)}")
    if annotation is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if annotation is bool and isinstance(value, bool):
        return value
    if annotation in (int, str) and isinstance(value, annotation) and not isinstance(value, bool):
        return value
    raise ConfigError(field, value, f"must be {annotation.__name__}, got {type(value).__name__}")
