"""The one place where config names become modules: a validated :class:`BlockSpec` (or a config,
validated on the way) becomes a :class:`~zoo.assembly.block.Block`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig

from zoo.assembly.block import Block
from zoo.assembly.compat import Context, unmet_need
from zoo.assembly.match import active_count, attention_difference, count, counter, mlp_dims, reference_mlp_params
from zoo.assembly.spec import BlockSpec, position_dims, resolve_block, to_dict
from zoo.core.interface import hook


def build_block(
    cfg: Mapping[str, Any] | DictConfig | BlockSpec, *, context: Context = "block", layer: int = 0
) -> Block:
    """Build a block from a config (``cfg.block`` as composed, or a plain dict with its keys).

    ``context``: where the block lives (``block``: alone; ``model``: in a model, which provides
    the token embedding that absolute positions need). A part whose needs the context does not
    meet raises ConfigError (zoo.assembly.compat). ``layer``: the block's index in its stack (a
    hyper-connection's initial read stream depends on it).
    """
    spec = cfg if isinstance(cfg, BlockSpec) else resolve_block(cfg)
    error = unmet_need(spec, context)
    if error is not None:
        raise error
    dims, attn = spec.dims, spec["attn"]
    position = spec["pos"].build(position_dims(dims, attn.options))
    shared = (spec["norm"].options,) if hook(attn.part.cls, "shares_block_norm") else ()  # its qk-norm's eps
    self_attn = attn.build(dims, position, *shared)
    mlp = spec["mlp"].build(mlp_dims(spec))  # the matched width under block.mlp.match=params
    cross = None
    if dims.cross_attention:  # the self-attention says what its cross-attention is (compat refuses none)
        cross = hook(attn.part.cls, "cross_attention")(dims, **attn.options)()
    n_branches = 3 if cross is not None else 2
    placement = spec["placement"].build(dims, spec.make_norm, n_branches)
    n_updates = hook(spec["placement"].part.cls, "update_count")(n_branches)
    residual = spec["residual"].build(dims, n_updates, layer)
    return Block(placement, self_attn, mlp, dims.d_model, cross_attn=cross, canon=dims.canon_sites, residual=residual,
                 out_conv=dims.out_conv_sites)  # fmt: skip


def param_report(cfg: Mapping[str, Any] | DictConfig | BlockSpec) -> dict[str, int | None]:
    """What a sweep report shows about a block config (or a full config's ``block``).

    ``d_ff``: the MLP width it builds with; ``block_params``: the block's parameter count (positions a
    model owns, such as a learned table, are not in it); ``active_params``: those one token uses (less
    than block_params for a mixture of experts); ``reference_params``: the count it was matched to
    (total or active, as the match counts; None unless ``match`` is ``params`` or ``active_params``).
    """
    spec = cfg
    if not isinstance(spec, BlockSpec):
        raw = to_dict(spec)
        spec = resolve_block(raw["block"] if "block" in raw else raw)
    with torch.device("meta"):
        block = build_block(spec, context="model")
    params, active = count(block), active_count(block)
    reference = None
    if spec.match.match != "none":
        matched = counter(spec)
        reference = matched(block) - matched(block.mlp) + reference_mlp_params(spec) + attention_difference(spec)
    return {
        "d_ff": hook(block.mlp, "hidden"),
        "block_params": params,
        "active_params": active,
        "reference_params": reference,
    }
