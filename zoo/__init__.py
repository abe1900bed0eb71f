"""zoo: composable transformer blocks, built from Hydra configs, tested as one contract.

Layers, each importing only those below it (checked by import-linter, see pyproject.toml):
``zoo.core`` (registries, errors, sizes, options) <- ``zoo.parts`` <- ``zoo.assembly`` (specs,
compatibility, matching, building) <- ``zoo.models`` <- ``zoo.lab`` (training, sweeps, reports, CLI).
"""

import importlib.metadata

from zoo.assembly.block import Block
from zoo.assembly.build import build_block, param_report
from zoo.assembly.compat import check_combination
from zoo.assembly.compose import CONF_DIR, compose
from zoo.assembly.spec import BlockSpec, resolve_block
from zoo.core.dims import BlockDims
from zoo.core.errors import ConfigError, IncompatibleParts
from zoo.core.registry import ATTENTIONS, AXES, MLPS, NORMS, PLACEMENTS, POSITIONS, Registry
from zoo.models.hf import from_hf
from zoo.models.language import LanguageModel, build_model
from zoo.models.seq2seq import Seq2SeqModel, build_seq2seq
from zoo.models.static import StaticDecoder
from zoo.parts.attention import KVCache
from zoo.parts.cross_attention import CrossAttention
from zoo.parts.state import LayerState, MixerState

try:
    __version__ = importlib.metadata.version("zoo")
except importlib.metadata.PackageNotFoundError:  # imported from a source tree that is not installed
    __version__ = "unknown"


def __getattr__(name: str) -> object:
    """``load_run`` and ``to_hf`` live in the lab (they read run folders), imported when first used."""
    if name in ("load_run", "to_hf"):
        from zoo.lab import runs

        return getattr(runs, name)
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")


def available() -> dict[str, list[str]]:
    """Every axis and its registered part names, e.g. ``{"norm": ["layernorm", "rmsnorm"], ...}``."""
    return {axis: registry.names() for axis, registry in AXES.items()}


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
