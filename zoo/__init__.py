"""zoo: composable transformer blocks, built from Hydra configs, tested as one contract."""

from zoo.block import Block
from zoo.build import BlockSpec, build_block, resolve_block
from zoo.compat import check_combination
from zoo.config import CONF_DIR, compose
from zoo.dims import BlockDims
from zoo.errors import ConfigError
from zoo.match import param_report
from zoo.model import LanguageModel, build_model
from zoo.parts.attention import KVCache
from zoo.parts.cross_attention import CrossAttention
from zoo.registry import ATTENTIONS, AXES, MLPS, NORMS, PLACEMENTS, POSITIONS, Registry
from zoo.seq2seq import Seq2SeqModel, build_seq2seq

__version__ = "0.1.0"


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
    "KVCache",
    "LanguageModel",
    "MLPS",
    "NORMS",
    "PLACEMENTS",
    "POSITIONS",
    "Registry",
    "Seq2SeqModel",
    "available",
    "build_block",
    "build_model",
    "build_seq2seq",
    "check_combination",
    "compose",
    "param_report",
    "resolve_block",
]
