"""Composing configs from zoo's Hydra config tree the way the command line does, from Python.

The tree is ``conf/`` (``zoo.conf`` when installed). ``conf/config.yaml`` puts ``${zoo_searchpath:}``
on Hydra's search path: zoo's groups, its versioned sweeps (the ``sweeps`` group) and the option
files of every installed plugin (entry-point group ``zoo.conf``), so ``norm=dyt`` works for a
plugin's part exactly as for a built-in one, in ``zoo-train``, ``zoo-sweep``, ``zoo-parts --check``
and :func:`compose`. A Hydra app of one's own can list the same entries (docs/composing.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.errors import HydraException
from omegaconf import DictConfig

from zoo.assembly.config_tree import CONF_DIR, compose_with_choices, entry_folder, search_path  # noqa: F401 (zoo.assembly.compose's API)
from zoo.assembly.overrides import check_overrides
from zoo.assembly.spec import BlockSpec, resolve_block, to_dict
from zoo.core.errors import ConfigError
from zoo.core.registry import AXES


def compose(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """The config that ``zoo-train <overrides>`` would run, validated.

    >>> cfg = compose(["norm=rmsnorm", "attn=gqa", "preset=llama"])  # doctest: +SKIP
    """
    try:
        cfg, choices = compose_with_choices(overrides, config_name)
    except HydraException:
        if config_name == "config":  # zoo's error for a misspelt or misplaced key or option, where it finds one
            check_overrides(overrides)
        raise
    resolve_composed(cfg.block, choices, overrides)  # fail now, naming the field, rather than at build time
    return cfg


def resolve_composed(
    block: Mapping[str, Any] | DictConfig, choices: Mapping[str, Any], overrides: Sequence[str] = ()
) -> BlockSpec:
    """:func:`~zoo.assembly.spec.resolve_block` for a composed config, whose axes came from option
    files (Hydra's ``choices``, e.g. ``{"norm": "dyt"}``): an error in a part's name names its file.

    An option file is named after the part it selects (``norm/dyt.yaml``: ``name: dyt``), or after a
    setting of it, before or after the name (``placement/deepnorm_a2.yaml``: ``name: deepnorm``, ``alpha: 1.414``;
    ``norm/gated_rmsnorm.yaml``: ``name: rmsnorm``, ``gate_rank: 16``); any other
    ``name:`` is an error naming the file (unless the overrides set ``block.<axis>.name`` themselves).
    """
    raw = to_dict(block)
    named = {o.lstrip("+~").partition("=")[0] for o in overrides}
    for axis in AXES:
        choice, node = choices.get(axis), raw.get(axis)
        name = node.get("name") if isinstance(node, Mapping) else node
        if choice is None or f"block.{axis}.name" in named or name is None:
            continue
        if name != choice and not str(choice).startswith(f"{name}_") and not str(choice).endswith(f"_{name}"):
            raise ConfigError(
                f"block.{axis}.name",
                name,
                f"set by {option_file_label(axis, choice)}, which is named after another part: an option file "
                f"is named after the part it selects ({name}.yaml) or a setting of it ({name}_<setting>.yaml, "
                f"<setting>_{name}.yaml)",
            )
    try:
        return resolve_block(raw)
    except ConfigError as error:
        axis = error.field.removeprefix("block.").removesuffix(".name")
        if error.field == f"block.{axis}.name" and choices.get(axis) is not None:
            raise ConfigError(
                error.field, error.value, f"{error.allowed} (set by {option_file_label(axis, choices[axis])})"
            ) from None
        raise


def option_file(axis: str, choice: str) -> Path | None:
    """The option file Hydra composes for ``<axis>=<choice>``: zoo's, else the first plugin's that has it."""
    for entry in search_path():
        folder = entry_folder(entry)
        if folder is not None and (path := folder / axis / f"{choice}.yaml").is_file():
            return path
    return None


def option_file_label(axis: str, choice: str) -> str:
    path = option_file(axis, choice)
    return f"option file {path}" if path is not None else f"{axis}={choice}"
