"""Combinations of registered parts, generated from the registry when asked (so a part registered today,
built in or from a plugin, is in them at once): every combination of part names, every option variant
paired with every other axis' choices, and a small pairwise covering set. The contract suite
(:mod:`zoo.testing.combos`) builds its grid from them, and ``zoo-coordcheck --covering`` its rows.
"""

from __future__ import annotations

import itertools
from typing import Any

import zoo.parts  # noqa: F401  (registers the built-in parts: AXES is read by name)
from zoo.core.dims import block_fields
from zoo.core.options import option_types
from zoo.core.registry import AXES
from zoo.parts.canon import applied_sites

#: Variant options that are block settings (``block.canon``), not options of a part: a variant holding one
#: is the declaring part's alone (``pre+canon``), and puts its settings on the block (:func:`block_settings`).
BLOCK_KEYS = frozenset(f.name for f in block_fields())


def variants(axis: str) -> dict[str, dict[str, Any]]:
    """Every variant declared by a part of ``axis``: its name and options."""
    return {name: options for part in AXES[axis].parts() for name, options in part.variants.items()}


def takes(axis: str, name: str, variant: str, options: dict[str, Any]) -> bool:
    """Whether part ``name`` takes ``variant``: every part of the axis that takes its options; a variant with
    block settings, only the part that declares it."""
    part = AXES[axis].get(name)
    own = set(options) - BLOCK_KEYS
    if own != set(options) and variant not in part.variants:
        return False
    return own <= set(option_types(part.cls))


def choices(axis: str, with_variants: bool = True) -> list[str]:
    """Every part name of ``axis``, then ``name+variant`` for each variant the part takes."""
    names = AXES[axis].names()
    if not with_variants:
        return names
    taken = [
        f"{name}+{variant}" for variant, options in variants(axis).items() for name in names
        if takes(axis, name, variant, options)
    ]  # fmt: skip
    return names + taken


def combo_id(combo: dict[str, str]) -> str:
    """``pre-rmsnorm-gqa-rotary-swiglu``: the labels in axis order, a paired axis' (``residual``) only away from
    its default (``pre-rmsnorm-gqa-rotary-swiglu-hyper``)."""
    return "-".join(
        label for axis, label in combo.items() if not (axis in AXES and AXES[axis].paired and label == default(axis))
    )


def default(axis: str) -> str:
    """The part an axis takes when a combination does not vary it: its registry's default, else its first part."""
    return AXES[axis].default or AXES[axis].names()[0]


def product_names(axis: str) -> list[str]:
    """The part names of ``axis`` that the grid's product multiplies: every part but the paired ones
    (``register(..., paired=True)``); for a paired axis (``Registry(paired=True)``, the residual) its default alone."""
    if AXES[axis].paired:
        return [default(axis)]
    return [part.name for part in AXES[axis].parts() if not part.paired]


def paired_choices(axis: str) -> list[str]:
    """The labels of ``axis`` that enter the grid paired with every choice of each other axis, not in the product:
    its variants and its paired parts; for a paired axis every label but its default."""
    product = set(product_names(axis))
    return [label for label in choices(axis) if label not in product]


def combinations() -> list[dict[str, str]]:
    """The product of the part names :func:`product_names` gives, then each variant choice, each paired part and
    each other part of a paired axis, paired with every choice of each other axis."""
    base = {axis: default(axis) for axis in AXES}
    product = [axis for axis in AXES if not AXES[axis].paired]
    combos = [
        {**base, **dict(zip(product, names, strict=True))}
        for names in itertools.product(*(product_names(a) for a in product))
    ]
    seen = {combo_id(c) for c in combos}
    base = {axis: AXES[axis].names()[0] if axis in product else default(axis) for axis in AXES}
    for axis in AXES:
        for variant in paired_choices(axis):
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


def covering_combinations(fixed: dict[str, str] | None = None) -> list[dict[str, str]]:
    """A small pairwise covering set: every pair of part names of two axes appears in some combination
    (greedy covering array, deterministic), then each option variant once, beside the other axes' defaults
    (:func:`default`; a row of the covering set holding its part where the defaults refuse it).

    For costly properties (compiling, several processes) where :func:`pairwise_combinations`' one row
    per pair would take minutes; any two parts that could interact still meet once. ``fixed``
    (``{"norm": "dyt"}``) holds an axis at one label: every pair of the other axes' parts then meets
    that part, and only its own variants are swapped in (none when the label is a variant).
    """
    fixed = fixed or {}
    names = {axis: [fixed[axis]] if axis in fixed else AXES[axis].names() for axis in AXES}
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
    plain = {axis: fixed.get(axis, default(axis)) for axis in axes}  # the row each variant joins, if it builds
    for axis in axes:
        variant_labels = choices(axis)[len(AXES[axis].names()) :]
        if axis in fixed:
            variant_labels = [label for label in variant_labels if label.partition("+")[0] == fixed[axis]]
        labels = {label.partition("+")[2]: label for label in reversed(variant_labels)}
        for i, label in enumerate(labels.values()):  # each variant once, on the first part that takes it
            base = label.partition("+")[0]
            if builds({**plain, axis: label}):
                rows.append({**plain, axis: label})
            else:
                rows.append({**next(r for r in rows[i:] + rows[:i] if r[axis] == base), axis: label})
    return rows


def builds(combo: dict[str, str]) -> bool:
    """Whether ``combo`` builds as a model's block (at the block's default sizes)."""
    from zoo.assembly.compat import check_combination

    cfg = {**{axis: node(axis, label) for axis, label in combo.items()}, **block_settings(combo)}
    return check_combination(cfg, "model") is None


def node(axis: str, label: str) -> dict[str, Any]:
    """The config node of ``name`` or ``name+variant``, less the variant's block settings (:func:`block_settings`)."""
    name, _, variant = label.partition("+")
    options = variants(axis)[variant] if variant else {}
    return {"name": name, **{key: value for key, value in options.items() if key not in BLOCK_KEYS}}


def block_settings(combo: dict[str, str]) -> dict[str, Any]:
    """The block settings the variants of ``combo`` set (``block.canon``), the canon sites narrowed to those its
    parts apply (a variant's ``abcd`` is ``acd`` beside an attention without site b): so every combination runs
    with canon layers, at every site it can take."""
    settings: dict[str, Any] = {}
    for axis, label in combo.items():
        name, _, variant = label.partition("+")
        if variant:
            settings.update({k: v for k, v in variants(axis)[variant].items() if k in BLOCK_KEYS})
    if "canon" in settings and "attn" in combo and "mlp" in combo:
        attn, mlp = (AXES[axis].get(combo[axis].partition("+")[0]).cls for axis in ("attn", "mlp"))
        settings["canon"] = applied_sites(settings["canon"], attn, mlp) or "none"
    return settings
