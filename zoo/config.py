"""Composing configs from ``conf/`` the way the command line does, from Python."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import DictConfig

#: The Hydra config tree: one group per axis (placement, norm, attn, pos, mlp), presets, tasks.
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """The config that ``zoo-train <overrides>`` would run, validated.

    >>> cfg = compose(["norm=rmsnorm", "attn=gqa", "preset=llama"])  # doctest: +SKIP
    """
    from zoo.build import resolve_block

    if not CONF_DIR.is_dir():
        raise FileNotFoundError(
            f"config folder {CONF_DIR} is missing; install zoo from its source tree (pip install -e .)"
        )
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
    resolve_block(cfg.block)  # fail now, naming the field, rather than at build time
    return cfg
