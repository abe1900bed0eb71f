"""A block config validated into a tensor-free spec: sizes, one chosen part per axis, and the
options of each, checked against the parts' own declarations before anything is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf
from torch import nn

import zoo.parts  # noqa: F401  (registers the built-in parts)
from zoo.core.dims import BlockDims, block_fields
from zoo.core.errors import ConfigError
from zoo.core.interface import hook
from zoo.core.options import check_type, option_defaults, resolve_options, type_hints
from zoo.core.registry import ATTENTIONS, AXES, MLPS, Part
from zoo.parts.canon import SITES, applied_sites, canon_sites, out_conv_sites, unapplied_site
from zoo.parts.norms import build_norm

SIZE_FIELDS = {"d_model", "n_heads", "d_ff", "max_len"}

Match = Literal["none", "params", "active_params"]


@dataclass(frozen=True)
class MatchOptions:
    """``block.mlp.match``, ``match_mlp``, ``match_attn``: options of the MLP axis that parameter
    matching reads (:mod:`zoo.assembly.match`); every MLP accepts them, none receives them.

    match: ``none`` (the width as configured) or ``params`` (the width that gives the block the
    parameter count of the same block with ``mlp=match_mlp`` at block.d_ff or its default width, and
    with ``attn=match_attn`` when set: e.g. ``mha`` gives GQA's savings back to the MLP), or
    ``active_params`` (the same, counting the parameters one token uses: a mixture of experts' router,
    top_k experts and shared expert, rather than all its experts).
    """

    match: Match = "none"
    match_mlp: str = "gelu"
    match_attn: str | None = None

    def check(self) -> None:
        if self.match_mlp not in MLPS:
            raise ConfigError("block.mlp.match_mlp", self.match_mlp, f"a registered MLP: {', '.join(MLPS.names())}")
        if self.match_attn is not None and self.match_attn not in ATTENTIONS:
            raise ConfigError(
                "block.mlp.match_attn",
                self.match_attn,
                f"null or a registered attention: {', '.join(ATTENTIONS.names())}",
            )


#: Options every part of an axis accepts, read by the assembly rather than by the part.
AXIS_OPTIONS: dict[str, type[MatchOptions]] = {"mlp": MatchOptions}


@dataclass(frozen=True)
class PartChoice:
    """A chosen part and every option it is built with (defaults filled in, checked)."""

    part: Part
    options: dict[str, Any]

    def build(self, *args: Any) -> Any:
        return self.part.cls(*args, **self.options)


@dataclass(frozen=True)
class BlockSpec:
    """A validated block config: sizes, one choice per axis, and the MLP's matching options."""

    dims: BlockDims
    choices: dict[str, PartChoice]
    match: MatchOptions = field(default_factory=MatchOptions)

    def __getitem__(self, axis: str) -> PartChoice:
        return self.choices[axis]

    @property
    def names(self) -> dict[str, str]:
        return {axis: choice.part.name for axis, choice in self.choices.items()}

    def settings(self) -> dict[str, Any]:
        """Every setting of the block under the config key that sets it, defaults filled in: the sizes
        (``block.d_model``), each axis's part (``block.attn``: its name) and that part's options
        (``block.attn.window``), and the MLP's matching options (``block.mlp.match``)."""
        found: dict[str, Any] = {f"block.{f.name}": getattr(self.dims, f.name) for f in block_fields()}
        for axis, choice in self.choices.items():
            found[f"block.{axis}"] = choice.part.name
            found.update({f"block.{axis}.{key}": value for key, value in choice.options.items()})
        found.update({f"block.mlp.{f.name}": getattr(self.match, f.name) for f in fields(MatchOptions)})
        return found

    def default_settings(self) -> dict[str, Any]:
        """What each key of :meth:`settings` holds when a config leaves it out: the sizes' defaults, an axis's
        default part (None where the axis must be named), the chosen part's option defaults."""
        found: dict[str, Any] = {f"block.{f.name}": f.default for f in block_fields()}
        for axis, choice in self.choices.items():
            found[f"block.{axis}"] = AXES[axis].default
            found.update({f"block.{axis}.{key}": value for key, value in option_defaults(choice.part).items()})
        found.update({f"block.mlp.{f.name}": f.default for f in fields(MatchOptions)})
        return found

    def make_norm(self) -> nn.Module:
        """A new norm of the block's ``norm`` choice, with its options (zoo.parts.norms.build_norm)."""
        norm = self.choices["norm"]
        return build_norm(norm.part.name, self.dims, shared=norm.options)


def to_dict(cfg: Mapping[str, Any] | DictConfig) -> dict[str, Any]:
    """A plain dict of a config, with interpolations resolved."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    if not isinstance(cfg, Mapping):
        raise ConfigError("block", cfg, "must be a mapping of block settings")
    return dict(cfg)


def resolve_block(cfg: Mapping[str, Any] | DictConfig) -> BlockSpec:
    """Validate a block config. Raises ConfigError naming the field, value and what is allowed.

    An axis may be given as a node (``{"name": "rmsnorm", "eps": 1e-6}``) or just a name; an axis with a default
    (``residual``: ``add``) may be left out.
    """
    raw = to_dict(cfg)
    known = {f.name for f in block_fields()} | set(AXES)
    for key in raw:
        if key not in known:
            raise ConfigError(f"block.{key}", raw[key], f"unknown key; allowed: {', '.join(sorted(known))}")
    dims = _resolve_dims(raw)
    nodes = {axis: _node(axis, raw.get(axis)) for axis in AXES}
    match = MatchOptions(**_axis_options("mlp", nodes["mlp"]))
    match.check()
    attn = resolve_part("attn", nodes["attn"], dims)
    dims = attention_dims(dims, attn.options)
    choices = {axis: attn if axis == "attn" else resolve_part(axis, node, dims) for axis, node in nodes.items()
               if axis != "pos"}  # fmt: skip
    choices["pos"] = resolve_part("pos", nodes["pos"], position_dims(dims, attn.options))
    choices = {axis: choices[axis] for axis in nodes}
    check_canon(dims, choices)
    return BlockSpec(dims, choices, match)


def attention_dims(dims: BlockDims, options: Mapping[str, Any]) -> BlockDims:
    """``dims`` with the head width an attention's options set (``head_dim``: every part of the block then reads
    it as ``dims.d_head``); without one, d_model / n_heads, which n_heads must divide (a ConfigError otherwise)."""
    head_dim = options.get("head_dim")
    if head_dim is None and dims.d_model % dims.n_heads:
        raise ConfigError(
            "block.n_heads",
            dims.n_heads,
            f"must divide d_model={dims.d_model} (head size = d_model / n_heads), or set block.attn.head_dim",
        )
    return replace(dims, head_dim=head_dim)


def position_dims(dims: BlockDims, options: Mapping[str, Any]) -> BlockDims:
    """``dims`` for the block's position part: at the width of an attention's own position features where its options
    set one (latent attention's ``rope_dim``), else at d_head."""
    rope_dim = options.get("rope_dim")
    return dims if rope_dim is None else replace(dims, head_dim=rope_dim)


def check_canon(dims: BlockDims, choices: Mapping[str, PartChoice]) -> None:
    """Refuse a canon site inside a part that does not apply it (``b`` in the attention, ``d`` in the MLP:
    the part's ``canon_sites``), naming block.canon, before anything is built."""
    attn, mlp = choices["attn"].part, choices["mlp"].part
    site = unapplied_site(dims.canon_sites, attn.cls, mlp.cls)
    if site is None:
        return
    axis, part = ("attn", attn) if site == "b" else ("mlp", mlp)
    applying = ", ".join(p.name for p in AXES[axis].parts() if site in hook(p.cls, "canon_sites")) or "none"
    without = applied_sites(dims.canon_sites, attn.cls, mlp.cls) or "none"
    raise ConfigError(
        "block.canon",
        dims.canon,
        f"site {site} ({SITES[site]}) is inside the {axis}, and {axis}={part.name} does not apply it "
        f"(those that do: {applying}); leave {site} out: block.canon={without}",
    )


def resolve_part(axis: str, node: Mapping[str, Any], dims: BlockDims) -> PartChoice:
    """The part a node names (``{"name": ..., option: value}``) with every option, checked by the
    part's own ``check(dims, **options)``; options of the axis (:data:`AXIS_OPTIONS`) are left out."""
    part = AXES[axis].get(node["name"])
    axis_keys = tuple(f.name for f in fields(AXIS_OPTIONS[axis])) if axis in AXIS_OPTIONS else ()
    given = {k: v for k, v in node.items() if k != "name" and k not in axis_keys}
    options = resolve_options(part, given, f"block.{axis}", axis_keys)
    hook(part.cls, "check")(dims, **options)
    return PartChoice(part, options)


def every_option(part: Part) -> dict[str, Any]:
    """A part's options with their defaults, the options its axis adds (block.mlp.match...) included."""
    extra = AXIS_OPTIONS.get(part.axis)
    axis_defaults = {f.name: f.default for f in fields(extra)} if extra is not None else {}
    return {**option_defaults(part), **axis_defaults}


def _node(axis: str, node: Any) -> dict[str, Any]:
    names = AXES[axis].names()
    if node is None and AXES[axis].default is not None:  # an axis added since (block.residual): its default
        node = AXES[axis].default
    if node is None:
        raise ConfigError(f"block.{axis}", None, f"missing; choose one of: {', '.join(names)}")
    node = {"name": node} if isinstance(node, str) else to_dict(node)
    if "name" not in node:
        raise ConfigError(f"block.{axis}", node, f"needs a 'name': one of {', '.join(names)}")
    return node


def _axis_options(axis: str, node: Mapping[str, Any]) -> dict[str, Any]:
    hints = type_hints(AXIS_OPTIONS[axis])
    return {
        f.name: check_type(f"block.{axis}.{f.name}", node[f.name], hints[f.name])
        for f in fields(AXIS_OPTIONS[axis])
        if f.name in node
    }


def _resolve_dims(raw: dict[str, Any]) -> BlockDims:
    hints = type_hints(BlockDims)
    values = {
        f.name: check_type(f"block.{f.name}", raw[f.name], hints[f.name]) for f in block_fields() if f.name in raw
    }
    dims = BlockDims(**values)
    canon_sites(dims.canon)
    out_conv_sites(dims.out_conv)
    for name in SIZE_FIELDS:
        value = getattr(dims, name)
        if value is not None and value < 1:
            raise ConfigError(f"block.{name}", value, "must be a positive integer")
    if not 0 <= dims.dropout < 1:
        raise ConfigError("block.dropout", dims.dropout, "must be in [0, 1)")
    return dims
