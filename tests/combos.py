"""The contract suite's grid, at tiny sizes, generated from the registry at collection time (so a
newly registered part is covered at once):

- every combination of part names (the product of the axes), and
- every option *variant* paired with every choice of every other axis. A variant is an option
  setting a part declares (``variants=`` at registration, e.g. ``window``); it applies to each part
  of its axis that takes those options and shows as ``name+variant`` (``gqa+window``). Each variant
  choice is crossed one axis at a time with every choice of the other axes (the rest at their first
  part): all pairs, not the full product, which would multiply the grid's cost by 2.4.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch import nn

from zoo import AXES, LayerState, build_block, check_combination, resolve_block
from zoo.core.options import option_types

#: Tiny sizes: 4 query heads so GQA's 2 kv heads sit strictly between MQA and MHA.
TINY = {"d_model": 16, "n_heads": 4, "d_ff": 24, "bias": True, "dropout": 0.0, "max_len": 8}


def variants(axis: str) -> dict[str, dict[str, Any]]:
    """Every variant declared by a part of ``axis``: its name and options."""
    return {name: options for part in AXES[axis].parts() for name, options in part.variants.items()}


def choices(axis: str, with_variants: bool = True) -> list[str]:
    """Every part name of ``axis``, then ``name+variant`` for each variant the part takes."""
    names = AXES[axis].names()
    if not with_variants:
        return names
    taken = [
        f"{name}+{variant}"
        for variant, options in variants(axis).items()
        for name in names
        if set(options) <= set(option_types(AXES[axis].get(name).cls))
    ]
    return names + taken


def combinations() -> list[dict[str, str]]:
    """The product of part names, then each variant choice paired with every choice of each other axis."""
    combos = [dict(zip(AXES, names, strict=True)) for names in itertools.product(*(AXES[a].names() for a in AXES))]
    seen = {combo_id(c) for c in combos}
    base = {axis: AXES[axis].names()[0] for axis in AXES}
    for axis in AXES:
        for variant in choices(axis)[len(AXES[axis].names()) :]:
            pairs = [{}] + [{other: label} for other in AXES if other != axis for label in choices(other)]
            for pair in pairs:
                combo = {**base, axis: variant, **pair}
                if combo_id(combo) not in seen:
                    seen.add(combo_id(combo))
                    combos.append(combo)
    return combos


def pairwise_combinations() -> list[dict[str, str]]:
    """Every choice of each axis paired with every choice of every other axis (the rest at their first part).

    For properties of the model around the block (padding in generation, cross-attention, encoder
    blocks), where the full product would cost minutes and a pair of parts is what can interact.
    """
    base = {axis: AXES[axis].names()[0] for axis in AXES}
    combos: dict[str, dict[str, str]] = {}
    for first, second in itertools.combinations(AXES, 2):
        for a, b in itertools.product(choices(first), choices(second)):
            combo = {**base, first: a, second: b}
            combos.setdefault(combo_id(combo), combo)
    return list(combos.values())


def every_pair(test: Any) -> Any:
    """Parametrize ``test`` over :func:`pairwise_combinations`, ids as in :func:`every_combination`."""
    combos = pairwise_combinations()
    return pytest.mark.parametrize("combo", combos, ids=[combo_id(c) for c in combos])(test)


def combo_id(combo: dict[str, str]) -> str:
    return "-".join(combo.values())


def every_combination(test: Any) -> Any:
    """Parametrize ``test`` over every combination, with ids like ``pre-rmsnorm-gqa-rotary-swiglu``."""
    combos = combinations()
    return pytest.mark.parametrize("combo", combos, ids=[combo_id(c) for c in combos])(test)


def node(axis: str, label: str) -> dict[str, Any]:
    """The config node of ``name`` or ``name+variant``."""
    name, _, variant = label.partition("+")
    return {"name": name, **(variants(axis)[variant] if variant else {})}


def block_config(combo: dict[str, str], **overrides: Any) -> dict[str, Any]:
    """A plain-dict block config; ``attn`` overrides go in as ``attn={"backend": "math"}``."""
    cfg: dict[str, Any] = {**TINY, **{axis: node(axis, label) for axis, label in combo.items()}}
    for key, value in overrides.items():
        if key in AXES:
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


def context_of(cfg: dict[str, Any]) -> tuple[str | None, str | None]:
    """The smallest context the block config is valid in (``block``, else ``model``), or None and why not."""
    if check_combination(cfg, "block") is None:
        return "block", None
    reason = check_combination(cfg, "model")
    return ("model", None) if reason is None else (None, reason)


class Embedded(nn.Module):
    """A block behind the position embedding a model adds (``pos=learned``, ``sinusoidal``): the
    smallest context that provides what such parts need. Same call signature as a Block."""

    def __init__(self, block: nn.Module, pos_embed: nn.Module) -> None:
        super().__init__()
        self.pos_embed = pos_embed
        self.block = block

    def forward(
        self, x: torch.Tensor, *, key_mask: torch.Tensor | None = None, cache: LayerState | None = None
    ) -> torch.Tensor:
        offset = cache.length if cache is not None else 0
        positions = torch.arange(offset, offset + x.shape[1], device=x.device)
        return self.block(self.pos_embed(x, positions), key_mask=key_mask, cache=cache)


def build(cfg: dict[str, Any], context: str = "block") -> nn.Module:
    """The block of ``cfg``, wrapped in :class:`Embedded` when it lives in a ``model`` context."""
    if context == "block":
        return build_block(cfg)
    spec = resolve_block(cfg)
    pos_embed = spec["pos"].build(spec.dims).embedding()
    block = build_block(spec, context="model")
    return block if pos_embed is None else Embedded(block, pos_embed)


def make_block(combo: dict[str, str], dtype: torch.dtype = torch.float64, **overrides: Any) -> nn.Module:
    cfg = block_config(combo, **overrides)
    context, reason = context_of(cfg)
    if context is None:
        pytest.skip(reason)
    block = build(cfg, context).to(dtype)
    randomize(block)
    return block.eval()


def randomize(module: torch.nn.Module) -> None:
    """Give norms non-trivial gains and biases so tests cannot pass on ones and zeros."""
    with torch.no_grad():
        for _name, p in module.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))


#: Model-level contract tests: a 2-layer model over a 32-token vocabulary.
VOCAB = 32


def make_model(combo: dict[str, str], dtype: torch.dtype = torch.float64, n_layers: int = 2, **overrides: Any):
    """A tiny LanguageModel of ``combo`` with weights large enough that greedy tokens vary."""
    from zoo import LanguageModel, resolve_block

    model = LanguageModel(resolve_block(block_config(combo, **overrides)), VOCAB, n_layers).to(dtype)
    scramble(model)
    return model.eval()


def scramble(module: torch.nn.Module, std: float = 0.3) -> None:
    """Redraw matrices with a large std (init's 0.02 makes every logit near-equal) and randomize norms."""
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim >= 2:
                p.normal_(0, std)
    randomize(module)


def covering_combinations() -> list[dict[str, str]]:
    """A small pairwise covering set: every pair of part names of two axes appears in some combination
    (greedy covering array, deterministic), then each option variant once, swapped into a row.

    For costly properties (compiling, several processes) where :func:`pairwise_combinations`' one row
    per pair would take minutes; any two parts that could interact still meet once.
    """
    names = {axis: AXES[axis].names() for axis in AXES}
    axes = list(AXES)
    uncovered = {(a, x, b, y) for a, b in itertools.combinations(axes, 2) for x in names[a] for y in names[b]}
    rows: list[dict[str, str]] = []
    while uncovered:
        first = min(uncovered)  # seed the row with an uncovered pair, then fill axes greedily
        row = {first[0]: first[1], first[2]: first[3]}
        for axis in axes:
            if axis in row:
                continue
            gain = {
                value: sum((a, row[a], axis, value) in uncovered if axes.index(a) < axes.index(axis)
                           else (axis, value, a, row[a]) in uncovered for a in row)
                for value in names[axis]
            }  # fmt: skip
            row[axis] = max(names[axis], key=lambda value: gain[value])
        row = {axis: row[axis] for axis in axes}
        uncovered -= {(a, row[a], b, row[b]) for a, b in itertools.combinations(axes, 2)}
        rows.append(row)
    for axis in axes:
        labels = {label.partition("+")[2]: label for label in reversed(choices(axis)[len(names[axis]) :])}
        for i, label in enumerate(labels.values()):  # each variant on the first part that takes it
            base = label.partition("+")[0]
            row = next(r for r in rows[i:] + rows[:i] if r[axis] == base)
            rows.append({**row, axis: label})
    return rows


def every_covering(test: Any) -> Any:
    """Parametrize ``test`` over :func:`covering_combinations`, ids as in :func:`every_combination`."""
    combos = covering_combinations()
    return pytest.mark.parametrize("combo", combos, ids=[combo_id(c) for c in combos])(test)
