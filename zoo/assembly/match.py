"""Fair comparisons: the MLP hidden width that matches a reference block's parameter count.

With ``block.mlp.match: params`` the block's MLP gets the hidden width h for which

    params(this block with MLP width h) = params(reference block)

as nearly as an integer width allows; with ``match: active_params`` both sides count the
parameters one token uses (:func:`active_count`: a mixture of experts' router, top_k experts and
shared expert), so a sparse MLP is matched to a dense one at equal compute per token.
The reference block is this block with
``mlp = block.mlp.match_mlp`` (at ``block.d_ff``, or that MLP's default width) and, when
``block.mlp.match_attn`` is set, ``attn = match_attn``. So ``mlp=swiglu`` against ``gelu`` gets about
2/3 of the width, and ``attn=gqa`` with ``match_attn: mha`` gives its key/value savings to the MLP.
Counts come from building parts on the meta device (no memory, no tensor work).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from zoo.assembly.spec import BlockSpec, attention_dims, position_dims, resolve_part
from zoo.core.dims import BlockDims
from zoo.core.errors import ConfigError
from zoo.core.interface import hook
from zoo.core.registry import ATTENTIONS


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def active_count(module: nn.Module) -> int:
    """Parameters one token uses: a module with ``active_parameters()`` (a mixture of experts) says
    how many of its own; every other parameter counts."""
    active = hook(module, "active_parameters")()
    if active is not None:
        return int(active)
    own = sum(p.numel() for p in module.parameters(recurse=False))
    return own + sum(active_count(child) for child in module.children())


def counter(spec: BlockSpec) -> Callable[[nn.Module], int]:
    """How ``spec``'s matching counts a module: every parameter, or under ``active_params`` the active ones."""
    return active_count if spec.match.match == "active_params" else count


def mlp_params(spec: BlockSpec, d_ff: int | None) -> int:
    """Parameters of the block's MLP at hidden width ``d_ff`` (None: its default), counted as the match counts."""
    with torch.device("meta"):
        return counter(spec)(spec["mlp"].build(replace(spec.dims, d_ff=d_ff)))


def attn_params(spec: BlockSpec, name: str | None = None) -> int:
    """Parameters of the block's attention; with ``name``, of that registered attention instead
    (its own presets, such as ``mha``'s n_kv_heads, over the block's other attention options)."""
    attn, dims = spec["attn"], spec.dims
    if name is not None:
        same_class = ATTENTIONS.get(name).cls is attn.part.cls
        inherited = {k: v for k, v in attn.options.items() if k not in ATTENTIONS.get(name).defaults}
        try:
            attn = resolve_part("attn", {"name": name, **(inherited if same_class else {})}, dims)
            dims = attention_dims(dims, attn.options)  # its own head width (head_dim), as a block with it has
        except ConfigError as error:
            raise ConfigError("block.mlp.match_attn", name, f"the reference does not build: {error}") from None
    with torch.device("meta"):
        return count(attn.build(dims, spec["pos"].build(position_dims(dims, attn.options))))


def reference_mlp_params(spec: BlockSpec) -> int:
    """Parameters of the reference MLP (``match_mlp`` at block.d_ff or its default width)."""
    reference = resolve_part("mlp", {"name": spec.match.match_mlp}, spec.dims)
    with torch.device("meta"):
        return counter(spec)(reference.build(spec.dims))


def attention_difference(spec: BlockSpec) -> int:
    """Reference attention's parameters minus the block's (0 without ``match_attn``)."""
    name = spec.match.match_attn
    return 0 if name is None else attn_params(spec, name) - attn_params(spec)


def matched_width(spec: BlockSpec) -> int:
    """The MLP hidden width that gives the block the reference block's parameter count (nearest)."""
    at_1, at_2 = mlp_params(spec, 1), mlp_params(spec, 2)
    slope, intercept = at_2 - at_1, 2 * at_1 - at_2  # an MLP's count is affine in its width
    target = reference_mlp_params(spec) + attention_difference(spec)  # what this block's MLP should hold
    width = round((target - intercept) / slope)
    if width < 1:
        raise ConfigError(
            "block.mlp.match",
            spec.match.match,
            f"the reference (mlp={spec.match.match_mlp}, attn={spec.match.match_attn}) leaves "
            f"{target} parameters for this MLP, less than its smallest width needs",
        )
    return width


def mlp_dims(spec: BlockSpec) -> BlockDims:
    """The dims the block's MLP is built with: ``spec.dims``, with the matched d_ff under ``match: params``
    or ``active_params``."""
    if spec.match.match == "none":
        return spec.dims
    return replace(spec.dims, d_ff=matched_width(spec))
