"""What ``zoo-parts`` prints: every registered extension (the block's axes, tasks, trackers, optimizers,
schedules, objectives, callbacks) with its options and needs, a combination checked, parameter counts, and the
Markdown catalogue docs/parts.md is made of."""

from __future__ import annotations

import importlib.metadata
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import yaml
from hydra.errors import HydraException

from zoo.assembly.build import param_report
from zoo.assembly.compat import CONTEXTS, check_combination
from zoo.assembly.compose import compose
from zoo.assembly.spec import every_option
from zoo.core.errors import ConfigError
from zoo.core.interface import defines, hook
from zoo.core.options import option_types
from zoo.core.registry import (
    AXES,
    BUILT_IN,
    FAILED_PLUGINS,
    PARTS_GROUP,
    Part,
    Registry,
    package_of,
    plugin_entry_points,
)
from zoo.lab.recipe import OBJECTIVES, OPTIMIZERS, SCHEDULES
from zoo.lab.records.trackers import TRACKERS
from zoo.lab.tasks import TASKS
from zoo.lab.training.loop_callbacks import CALLBACKS
from zoo.models.language import MODEL_OPTION_DOCS
from zoo.models.ngram import NGRAM_NOTES
from zoo.parts import canon

#: What ``zoo-parts`` lists: the block's axes, then the lab's registries by their config key; a new
#: registry of the lab (its parts registered, plugins included, like the block's) is one entry here.
LISTED: dict[str, Registry] = {
    **AXES, "task": TASKS, "logger": TRACKERS, "optim": OPTIMIZERS, "schedule": SCHEDULES, "objective": OBJECTIVES,
    "callback": CALLBACKS,
}  # fmt: skip


#: Beside a mixer (the axes whose parts hold the block's matrices; norms, placements and positions hold
#: gains, biases and tables) that does not say how its weights split into logical matrices.
MIXERS = ("attn", "mlp")


NO_MATRIX_BLOCKS = "  (declares no matrix_blocks: AdamW for all its parameters under optim=muon)"


def print_parts() -> None:
    """Every axis and its parts, then the tasks and trackers, with options and needs; a part from a
    plugin names its package."""
    for axis, registry in LISTED.items():
        print(f"{axis}:")
        width = max(len(name) for name in registry.names())
        for part in registry.parts():
            options = ", ".join(f"{k}={v}" for k, v in listed_options(part).items())
            needs = ", ".join(hook(part.cls, "needs"))
            print(
                f"  {part.name:<{width}}  {part.summary}"
                + (f"  [{options}]" if options else "")
                + (f"  (needs {needs})" if needs else "")
                + (NO_MATRIX_BLOCKS if axis in MIXERS and not defines(part.cls, "matrix_blocks") else "")
                + (f"  (from {part.origin})" if part.origin != BUILT_IN else "")
            )
    plugins = plugin_entry_points(PARTS_GROUP)
    print("\nplugins (entry points zoo.parts): " + (", ".join(map(describe_plugin, plugins)) or "none installed"))
    for failure in FAILED_PLUGINS:
        print(f"  {failure}")


def listed_options(part: Part) -> dict[str, Any]:
    """A part's options with their defaults; the ``train`` keys a recipe entry reads as ``train.<key>``."""
    from_train = getattr(part.cls, "train_keys", ())
    return {k: f"train.{k}" if k in from_train else v for k, v in every_option(part).items()}


def describe_plugin(ep: importlib.metadata.EntryPoint) -> str:
    """``zoo-dyt 0.1.0 (dyt = zoo_dyt)``."""
    version = ep.dist.version if getattr(ep, "dist", None) is not None else "?"
    return f"{package_of(ep)} {version} ({ep.name} = {ep.value})"


def print_check(overrides: Sequence[str], context: str) -> int:
    """Print whether the composed overrides are valid (with the block's size) or why not; 0 if valid."""

    try:
        cfg = compose(overrides)
    except (ConfigError, HydraException) as error:
        print(f"invalid: {str(error).split(chr(10) + 'Config search path')[0].rstrip()}")
        return 1
    reason = check_combination(cfg, context)  # type: ignore[arg-type]
    names = " ".join(f"{axis}={cfg.block[axis].name}" for axis in AXES)
    if reason is not None:
        print(f"invalid: {reason}\n  ({names}, as a {context})")
        return 1
    report = param_report(cfg)
    matched = f", matched to {report['reference_params']:,}" if report["reference_params"] is not None else ""
    active = (
        f" ({report['active_params']:,} active per token)" if report["active_params"] != report["block_params"] else ""
    )
    size = f"block: {report['block_params']:,} parameters{active}{matched}, d_ff {report['d_ff']}"
    print(f"valid: {names} (as a {context}; {size})")
    return 0


def parse_grid(overrides: Sequence[str]) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """``AXIS=a,b`` restricts an axis (a paired axis, ``residual``, is at its default unless named);
    ``block.KEY=VALUE`` (or ``block.AXIS.OPTION=VALUE``) sets a value
    (parsed as YAML) in every combination."""
    names = {axis: [registry.default] if registry.paired and registry.default else registry.names()
             for axis, registry in AXES.items()}  # fmt: skip
    block: dict[str, Any] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(item, None, "write AXIS=NAME[,NAME...] or block.KEY=VALUE")
        if key in AXES:
            names[key] = value.split(",")
            for name in names[key]:
                AXES[key].get(name)
        elif key.startswith("block."):
            *path, leaf = key.removeprefix("block.").split(".")
            node = block
            for part in path:
                node = node.setdefault(part, {})
            node[leaf] = yaml.safe_load(value)
        else:
            raise ConfigError(key, value, f"an axis ({', '.join(AXES)}) or a block.KEY")
    return names, block


class NothingValid(ValueError):
    """Every combination of a ``--params`` grid is invalid, for one reason (a block-wide value none accepts)."""


def print_param_table(d_model: int, n_heads: int, overrides: Sequence[str] = (), max_len: int = 1024) -> None:
    """Parameters of one block for every combination (all, and those one token uses), the MLP width it
    builds with, and the count it was matched to under ``block.mlp.match=params`` or ``active_params``;
    an invalid combination prints its reason instead, and a grid of several whose every combination is invalid for
    one reason raises :class:`NothingValid` before printing anything."""
    names, block = parse_grid(overrides)
    grid: list[tuple[tuple[str, ...], dict[str, Any], str | None]] = []
    for combo in itertools.product(*names.values()):
        cfg: dict[str, Any] = {"d_model": d_model, "n_heads": n_heads, "max_len": max_len, **block}
        for axis, name in zip(AXES, combo, strict=True):
            cfg[axis] = {**block.get(axis, {}), "name": name}
        grid.append((combo, cfg, check_combination(cfg, "model")))
    reasons = {reason for _, _, reason in grid}
    if len(grid) > 1 and len(reasons) == 1 and None not in reasons:
        raise NothingValid(f"every combination is invalid: {reasons.pop()}")
    print(f"| {' | '.join(AXES)} | d_ff | block parameters | active per token | matched to |")
    print("|" + "---|" * len(AXES) + "---:|---:|---:|---:|")
    for combo, cfg, reason in grid:
        if reason is not None:
            print(f"| {' | '.join(combo)} | | invalid: {reason} | | |")
            continue
        report = param_report(cfg)
        reference = f"{report['reference_params']:,}" if report["reference_params"] is not None else ""
        counts = f"{report['block_params']:,} | {report['active_params']:,}"
        print(f"| {' | '.join(combo)} | {report['d_ff']} | {counts} | {reference} |")


def option_docs(registry: Registry, parts: list[Part]) -> list[str]:
    """The options documented once for the parts of ``registry`` (``Registry.document``) as a table below its parts',
    each naming the parts that take it; no lines when none is documented."""
    if not registry.option_docs:
        return []
    lines = [
        "",
        f"Options documented once for the `{registry.axis}` parts that take them, `block.{registry.axis}.<option>`; "
        "the cost is the training FLOPs (forward and backward) `flops_per_token` adds per layer:",
        "",
        "| option | values | parts | formula | cost | reference |",
        "|---|---|---|---|---|---|",
    ]
    for doc in registry.option_docs.values():
        taking = ", ".join(f"`{part.name}`" for part in parts if doc.option in option_types(part.cls)) or "-"
        lines.append(f"| `{doc.option}` | {doc.values} | {taking} | `{doc.formula}` | {doc.cost} | {doc.reference} |")
    return lines


def block_options(listed: Callable[[Registry], list[Part]]) -> list[str]:
    """The block's own options (``block.canon``, ``block.out_conv``) as a table: values, formula, cost and reference,
    the parts that apply each canon site inside them (their ``canon_sites``), and notes (zoo.parts.canon)."""
    inside = "; ".join(
        f"{site}: " + ", ".join(f"`{p.name}`" for p in listed(AXES[axis]) if site in hook(p.cls, "canon_sites"))
        for site, axis in (("b", "attn"), ("d", "mlp"))
    )
    doc, out = canon.DOC, canon.OUT_CONV_DOC
    return [
        "",
        "## Block options",
        "",
        "Options of the whole block, `block.<option>`; the cost is the training FLOPs (forward and backward) "
        "`flops_per_token` adds per layer:",
        "",
        "| option | values | inside parts | formula | cost | reference |",
        "|---|---|---|---|---|---|",
        f"| `{doc.option}` | {doc.values} | {inside} | `{doc.formula}` | {doc.cost} | {doc.reference} |",
        f"| `{out.option}` | {out.values} | - | `{out.formula}` | {out.cost} | {out.reference} |",
        "",
        *canon.NOTES,
        "",
        *canon.OUT_CONV_NOTES,
    ]


def model_options() -> list[str]:
    """The decoder-only model's own options (``model.<option>``: zoo.models.language.MODEL_OPTION_DOCS) as a table."""
    lines = [
        "",
        "## Model options",
        "",
        "Options of a decoder-only model outside its blocks, `model.<option>` (refused in an encoder-decoder):",
        "",
        "| option | values | formula | cost | reference |",
        "|---|---|---|---|---|",
    ]
    for doc in MODEL_OPTION_DOCS:
        lines.append(f"| `{doc.option}` | {doc.values} | `{doc.formula}` | {doc.cost} | {doc.reference} |")
    return [*lines, "", *NGRAM_NOTES]


def parts_markdown(plugins: bool = True) -> str:
    """The parts catalogue as Markdown (``zoo-parts --markdown > docs/parts.md``); a plugin's part
    names its package, and ``plugins=False`` leaves them out (zoo's own catalogue)."""

    def listed(registry: Registry) -> list[Part]:
        return [part for part in registry.parts() if plugins or part.origin == BUILT_IN]

    lines = [
        "# Parts catalogue",
        "",
        "Generated from the registry by `zoo-parts --markdown > docs/parts.md`; a test fails when it is stale.",
        "Choose a part on the command line with `<axis>=<name>`; set an option with `block.<axis>.<option>=...`.",
    ]
    for axis, registry in AXES.items():
        lines += [
            "",
            f"## `{axis}`",
            "",
            "| name | what | formula | options (default) | reference |",
            "|---|---|---|---|---|",
        ]
        for part in listed(registry):
            options = ", ".join(f"`{k}={v}`" for k, v in every_option(part).items()) or "-"
            name = f"`{part.name}`" + (f" (from {part.origin})" if part.origin != BUILT_IN else "")
            lines.append(f"| {name} | {part.summary} | `{part.formula}` | {options} | {part.reference} |")
        lines += option_docs(registry, listed(registry))
    lines += block_options(listed)
    lines += model_options()
    lines += [
        "",
        "## `objective`",
        "",
        "What a language model is trained to predict (`objective=<name>`, options `objective.<key>=`; a recipe",
        "section: docs/sweeps.md#the-training-recipe); the cost is what it adds to `flops_per_token`:",
        "",
        "| name | what | formula | options (default) | cost | reference |",
        "|---|---|---|---|---|---|",
    ]
    for part in listed(OBJECTIVES):
        options = ", ".join(f"`{k}={v}`" for k, v in every_option(part).items()) or "-"
        name = f"`{part.name}`" + (f" (from {part.origin})" if part.origin != BUILT_IN else "")
        lines.append(f"| {name} | {part.summary} | `{part.formula}` | {options} | {part.cls.cost} | {part.reference} |")
    lines += [
        "",
        "## Compatibility",
        "",
        "`zoo-parts --check <overrides>` says whether a combination is valid and why not; in Python,",
        "`zoo.check_combination(cfg)` returns the reason or None. Each part's `check` classmethod rules on",
        "its own options and sizes; what a part needs from its surroundings it declares in `needs`:",
        "",
        "| part | needs | why |",
        "|---|---|---|",
    ]
    for axis, registry in AXES.items():
        for part in listed(registry):
            for need, why in hook(part.cls, "needs").items():
                lines.append(f"| `{axis}={part.name}` | `{need}` | {why} |")
    lines += ["", "| context | provides |", "|---|---|"]
    lines += [f"| {context} | {', '.join(sorted(provided)) or '-'} |" for context, provided in CONTEXTS.items()]
    return "\n".join(lines) + "\n"
