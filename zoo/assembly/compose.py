"""Composing configs from zoo's Hydra config tree the way the command line does, from Python."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import DictConfig

from zoo.assembly.spec import resolve_block

#: The Hydra config tree (``conf/`` in the source tree, ``zoo/conf`` when installed): one group per
#: axis (placement, norm, attn, pos, mlp), presets, tasks.
CONF_DIR = Path(str(files("zoo.conf")))


def compose(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """The config that ``zoo-train <overrides>`` would run, validated.

    >>> cfg = compose(["norm=rmsnorm", "attn=gqa", "preset=llama"])  # doctest: +SKIP
    """
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
    resolve_block(cfg.block)  # fail now, naming the field, rather than at build time
    return cfg
