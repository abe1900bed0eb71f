"""Fair comparisons: the MLP hidden width that matches a reference block's parameter count.

With ``block.mlp.match: params`` the block's MLP gets the hidden width h for which

    params(this block with MLP width h) = params(reference block)

as nearly as an integer width allows. The reference block is this block with
``mlp = block.mlp.match_mlp`` (at ``block.d_ff``, or that MLP's default width) and, when
``block.mlp.match_attn`` is set, ``attn = match_attn``. So ``mlp=swiglu`` against ``gelu`` gets about
2/3 of the width, and ``attn=gqa`` with ``match_attn: mha`` gives its key/value savings to the MLP.
Counts come from building parts on the meta device (no memory, no tensor work).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig
from torch import nn

from zoo.dims import BlockDims
from zoo.errors import ConfigError
from zoo.registry import ATTENTIONS, MLPS

if TYPE_CHECKING:
    from zoo.build import BlockSpec


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _option(spec: BlockSpec, key: str) -> Any:
    """An option of the block's MLP, its signature default when the config leaves it out."""
    mlp = spec["mlp"]
    return mlp.options[key] if key in mlp.options else _signature_defaults(mlp.part.cls).get(key)


@cache
def _signature_defaults(cls: type) -> dict[str, Any]:
    return {
        p.name: p.default
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def mlp_params(spec: BlockSpec, d_ff: int | None) -> int:
    """Parameters of the block's MLP at hidden width ``d_ff`` (None: its default)."""
    mlp = spec["mlp"]
    with torch.device("meta"):
        return count(mlp.part.cls(replace(spec.dims, d_ff=d_ff), **mlp.options))


def attn_params(spec: BlockSpec, name: str | None = None) -> int:
    """Parameters of the block's attention; with ``name``, of that registered attention instead
    (its own presets, such as ``mha``'s n_kv_heads, over the block's other attention options)."""
    attn, dims = spec["attn"], spec.dims
    cls, options = attn.part.cls, attn.options
    if name is not None:
        reference = ATTENTIONS.get(name)
        cls = reference.cls
        options = {**(attn.options if cls is attn.part.cls else {}), **reference.defaults}
        check = getattr(cls, "check", None)
        try:
            if check is not None:
                check(dims, **options)
        except ConfigError as error:
            raise ConfigError("block.mlp.match_attn", name, f"the reference does not build: {error}") from None
    with torch.device("meta"):
        return count(cls(dims, spec["pos"].build(dims), **options))


def reference_mlp_params(spec: BlockSpec) -> int:
    """Parameters of the reference MLP (``match_mlp`` at block.d_ff or its default width)."""
    reference = MLPS.get(_option(spec, "match_mlp"))
    with torch.device("meta"):
        return count(reference.cls(spec.dims, **reference.defaults))


def _attn_difference(spec: BlockSpec) -> int:
    """Reference attention's parameters minus the block's (0 without ``match_attn``)."""
    name = _option(spec, "match_attn")
    return 0 if name is None else attn_params(spec, name) - attn_params(spec)


def matched_width(spec: BlockSpec) -> int:
    """The MLP hidden width that gives the block the reference block's parameter count (nearest)."""
    at_1, at_2 = mlp_params(spec, 1), mlp_params(spec, 2)
    slope, intercept = at_2 - at_1, 2 * at_1 - at_2  # an MLP's count is affine in its width
    target = reference_mlp_params(spec) + _attn_difference(spec)  # what this block's MLP should hold
    width = round((target - intercept) / slope)
    if width < 1:
        raise ConfigError(
            "block.mlp.match",
            "params",
            f"the reference (mlp={_option(spec, 'match_mlp')}, attn={_option(spec, 'match_attn')}) leaves "
            f"{target} parameters for this MLP, less than its smallest width needs",
        )
    return width


def mlp_dims(spec: BlockSpec) -> BlockDims:
    """The dims the block's MLP is built with: ``spec.dims``, with the matched d_ff under ``match: params``."""
    if _option(spec, "match") != "params":
        return spec.dims
    return replace(spec.dims, d_ff=matched_width(spec))


def param_report(cfg: Mapping[str, Any] | DictConfig | BlockSpec) -> dict[str, int | None]:
    """What a sweep report shows about a block config (or a full config's ``block``).

    ``d_ff``: the MLP width it builds with; ``block_params``: the block's parameter count (positions a
    model owns, such as a learned table, are not in it); ``reference_params``: the count it was
    matched to (None unless ``match: params``).
    """
    from zoo.build import BlockSpec, build_block, resolve_block, to_dict

    spec = cfg
    if not isinstance(spec, BlockSpec):
        raw = to_dict(spec)
        spec = resolve_block(raw["block"] if "block" in raw else raw)
    with torch.device("meta"):
        block = build_block(spec, context="model")
    params = count(block)
    matched = _option(spec, "match") == "params"
    reference = None
    if matched:
        reference = params - count(block.mlp) + reference_mlp_params(spec) + _attn_difference(spec)
    return {"d_ff": getattr(block.mlp, "hidden", None), "block_params": params, "reference_params": reference}
