"""zoo: composable transformer blocks, built from Hydra configs, tested as one contract.

Layers, each importing only those below it (checked by import-linter, see pyproject.toml):
``zoo.core`` (registries, errors, sizes, options) <- ``zoo.parts`` <- ``zoo.assembly`` (specs,
compatibility, matching, building) <- ``zoo.models`` <- ``zoo.lab`` (training, sweeps, reports, CLI).
"""

import importlib
import importlib.metadata
from typing import Any

import zoo.assembly.config_tree  # noqa: F401  (registers ${zoo_searchpath:} for Hydra apps: no torch)

#: Every public name and the module it lives in, imported when first used (PEP 562): ``import zoo`` reads no
#: torch, so a command answers ``--help`` and refuses a bad override at once.
PUBLIC = {
    "Block": "zoo.assembly.block",
    "build_block": "zoo.assembly.build",
    "param_report": "zoo.assembly.build",
    "check_combination": "zoo.assembly.compat",
    "CONF_DIR": "zoo.assembly.config_tree",
    "compose": "zoo.assembly.compose",
    "BlockSpec": "zoo.assembly.spec",
    "resolve_block": "zoo.assembly.spec",
    "BlockDims": "zoo.core.dims",
    "ConfigError": "zoo.core.errors",
    "IncompatibleParts": "zoo.core.errors",
    "Registry": "zoo.core.registry",
    "from_hf": "zoo.models.hf",
    "LanguageModel": "zoo.models.language",
    "build_model": "zoo.models.language",
    "Seq2SeqModel": "zoo.models.seq2seq",
    "build_seq2seq": "zoo.models.seq2seq",
    "StaticDecoder": "zoo.models.static",
    "KVCache": "zoo.parts.attention",
    "CrossAttention": "zoo.parts.cross_attention",
    "LayerState": "zoo.parts.state",
    "MixerState": "zoo.parts.state",
    "load_run": "zoo.lab.finished.runs",
    "to_hf": "zoo.lab.finished.runs",
}
#: The part registries: read through zoo.parts, so that the built-in parts are registered first.
REGISTRIES = ("ATTENTIONS", "AXES", "MLPS", "NORMS", "PLACEMENTS", "POSITIONS")

try:
    __version__ = importlib.metadata.version("zoo")
except importlib.metadata.PackageNotFoundError:  # imported from a source tree that is not installed
    __version__ = "unknown"


def __getattr__(name: str) -> Any:
    """A public name's value, its module imported on first use (then kept as an attribute of zoo)."""
    if name in REGISTRIES:
        importlib.import_module("zoo.parts")  # the built-in parts register themselves
        module = "zoo.core.registry"
    elif name in PUBLIC:
        module = PUBLIC[name]
    else:
        raise AttributeError(f"module 'zoo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def available() -> dict[str, list[str]]:
    """Every axis and its registered part names, e.g. ``{"norm": ["layernorm", "rmsnorm"], ...}``."""
    axes = __getattr__("AXES")
    return {axis: registry.names() for axis, registry in axes.items()}


__all__ = [
    "ATTENTIONS",
    "AXES",
    "Block",
    "BlockDims",
    "BlockSpec",
    "CONF_DIR",
    "ConfigError",
    "CrossAttention",
    "IncompatibleParts",
    "KVCache",
    "LanguageModel",
    "LayerState",
    "MLPS",
    "MixerState",
    "NORMS",
    "PLACEMENTS",
    "POSITIONS",
    "Registry",
    "Seq2SeqModel",
    "StaticDecoder",
    "available",
    "build_block",
    "build_model",
    "build_seq2seq",
    "check_combination",
    "compose",
    "from_hf",
    "load_run",
    "param_report",
    "resolve_block",
    "to_hf",
]
