"""The compatibility map: which combinations of parts make sense, with the reason when one does not.

The rules live in the parts, not in a table here (each hook written in zoo.core.interface):

- a part's ``check(dims, **options)`` classmethod rejects its own bad options and sizes
  (``attn.softcap`` with ``backend: sdpa``, an ``attn.window`` as wide as ``block.max_len``, ...);
- a part class may declare ``needs = {"embedding": "why"}``: what its surroundings must provide,
  ``provides = frozenset({...})``: what it provides to the other parts, and
  ``conflicts = {"score bias": "why"}``: what no other part of its block may provide (a position's
  ``provides`` follows from the methods it overrides: ``rotation``, ``score bias``).

A self-attention that declares no ``cross_attention`` is refused under ``block.cross_attention=true``; a
residual that owns the addition (``hyper``) beside a placement with no ``updates`` (``post``), by name.

Surroundings are a *context*: a lone ``block`` provides nothing; a ``model`` provides ``embedding``
(token embeddings that absolute positions are added to).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from omegaconf import DictConfig

from zoo.assembly.match import mlp_dims
from zoo.assembly.spec import BlockSpec, resolve_block, to_dict
from zoo.core.errors import ConfigError, IncompatibleParts
from zoo.core.interface import defines, hook
from zoo.core.registry import ATTENTIONS, PLACEMENTS, RESIDUALS
from zoo.core.tp import has_plan

Context = Literal["block", "model"]

#: What each context provides to the parts of its blocks.
CONTEXTS: dict[str, frozenset[str]] = {"block": frozenset(), "model": frozenset({"embedding"})}


def unmet_need(spec: BlockSpec, context: Context = "block") -> IncompatibleParts | None:
    """The error for the first thing a part of ``spec`` needs that neither the context nor another part
    provides, or that a part conflicts with and another part provides; or None."""
    if context not in CONTEXTS:
        raise ConfigError("context", context, f"one of {', '.join(CONTEXTS)}")
    refusal = cross_attention_refusal(spec) or residual_refusal(spec)
    if refusal is not None:
        return refusal
    provided = set(CONTEXTS[context])
    for choice in spec.choices.values():
        provided |= set(hook(choice.part.cls, "provides"))
    for axis, choice in spec.choices.items():
        for need, why in hook(choice.part.cls, "needs").items():
            if need not in provided:
                return IncompatibleParts(f"block.{axis}.name", choice.part.name, f"needs {need}: {why}")
    for axis, choice in spec.choices.items():
        for conflict, why in hook(choice.part.cls, "conflicts").items():
            for other, by in spec.choices.items():
                if other != axis and conflict in hook(by.part.cls, "provides"):
                    return IncompatibleParts(
                        f"block.{axis}.name",
                        choice.part.name,
                        f"cannot be combined with {other}={by.part.name}, which provides a {conflict}: {why}",
                    )
    return None


def cross_attention_refusal(spec: BlockSpec) -> IncompatibleParts | None:
    """Under ``block.cross_attention=true``: the error when the self-attention declares no cross-attention
    (its ``cross_attention`` hook, zoo.core.interface), naming the attentions that do; else None."""
    attn = spec["attn"].part
    if not spec.dims.cross_attention or defines(attn.cls, "cross_attention"):
        return None
    having = "|".join(part.name for part in ATTENTIONS.parts() if defines(part.cls, "cross_attention"))
    return IncompatibleParts(
        "block.cross_attention",
        True,
        f"attn={attn.name} has no cross-attention (its class declares none); "
        f"use attn={having or '<an attention with one>'} with block.cross_attention=true",
    )


def residual_refusal(spec: BlockSpec) -> IncompatibleParts | None:
    """A residual that owns the addition (``hyper``: its ``owns_add``) beside a placement that is no sum of terms
    on the stream (no ``updates``: ``post``, the norm of the sum): the error naming block.residual, the
    placements it takes and the residuals the placement takes; else None."""
    residual, placement = spec["residual"].part, spec["placement"].part
    if not hook(residual.cls, "owns_add") or defines(placement.cls, "updates"):
        return None
    sums = "|".join(p.name for p in PLACEMENTS.parts() if defines(p.cls, "updates")) or "none"
    others = "|".join(p.name for p in RESIDUALS.parts() if not hook(p.cls, "owns_add"))
    return IncompatibleParts(
        "block.residual.name",
        residual.name,
        f"owns the residual addition, and placement={placement.name} is not a sum of terms on the stream (its "
        f"class has no updates); use placement={sums} with residual={residual.name}, or residual={others} "
        f"with placement={placement.name}",
    )


def check_combination(cfg: Mapping[str, Any] | DictConfig, context: Context | None = None) -> str | None:
    """None if ``cfg`` builds, else the reason it does not (the ConfigError's message).

    ``cfg``: a full config (with a ``block`` section: checked as part of a ``model``) or a block config
    (checked as a lone ``block``); ``context`` overrides that choice. Runs no tensor work beyond
    counting parameters on the meta device when ``block.mlp.match`` is ``params``.
    """
    try:
        raw = to_dict(cfg)
        full = "block" in raw
        spec = resolve_block(raw["block"] if full else raw)
        error = unmet_need(spec, context or ("model" if full else "block"))
        if error is not None:
            return str(error)
        mlp_dims(spec)
    except ConfigError as error:
        return str(error)
    return None


def tp_refusal(spec: BlockSpec, tp: int) -> ConfigError | None:
    """Under ``parallel.tp`` > 1: the error for the first part of ``spec`` that has no tensor-parallel
    plan of its own (zoo.core.tp.has_plan), or whose sizes do not split between ``tp`` ranks
    (its ``check_tp``); None if every part shards. No tensor work."""
    if tp == 1:
        return None
    if spec.dims.cross_attention:
        return ConfigError("block.cross_attention", True, f"has no tensor-parallel plan; use parallel.tp=1 (got {tp})")
    if spec.dims.canon_sites:
        return ConfigError(
            "block.canon",
            spec.dims.canon,
            f"has no tensor-parallel plan (a convolution over the sequence); use none or parallel.tp=1 (got {tp})",
        )
    if spec.dims.out_conv_sites:
        return ConfigError(
            "block.out_conv",
            spec.dims.out_conv,
            f"has no tensor-parallel plan (a convolution over the sequence); use none or parallel.tp=1 (got {tp})",
        )
    for axis, choice in spec.choices.items():
        cls = choice.part.cls
        if not has_plan(cls):
            return ConfigError(
                f"block.{axis}.name",
                choice.part.name,
                f"has no tensor-parallel plan (a tp_plan in its class, docs/scale.md), so it cannot run under "
                f"parallel.tp={tp}; use parallel.tp=1 (parallel.dp_shard shards it with FSDP2)",
            )
        dims = mlp_dims(spec) if axis == "mlp" else spec.dims
        try:
            hook(cls, "check_tp")(dims, tp, **choice.options)
        except ConfigError as error:
            return error
    return None
