"""Overrides checked before Hydra composes them (``zoo-train``, ``zoo-sweep``, :func:`zoo.compose`).

Hydra answers a misspelt key (``nrom=rmsnorm``) with "use +nrom=rmsnorm", which adds the typo as a
new key. Here a key that names neither a config group nor a key of the composed config, and a group
option that has no option file, are a :class:`ConfigError` in zoo's words: the key or value, the
closest name, and what exists. Everything Hydra defines for itself passes untouched: ``+key=``,
``++key=``, ``~key``, ``hydra.*`` and ``hydra/*``, flags (``-m``, ``--cfg job``, ...), sweep values
(``a,b``, ``range(...)``, ``choice(...)``); with ``--config-dir``, ``--config-path`` or
``--config-name`` nothing is checked (another config tree).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from zoo.assembly.config_tree import compose_with_choices, search_path
from zoo.core.errors import ConfigError

#: Flags that point Hydra at another config tree: the overrides are then not zoo's to judge.
OTHER_CONFIG = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn")


def group_options() -> dict[str, list[str]]:
    """Every config group on zoo's search path (its own, the sweeps, every plugin's) and its options."""
    groups: dict[str, set[str]] = {}
    for entry in search_path():
        if entry.startswith("file://"):  # the folder above zoo's sweeps: only its ``sweeps`` group
            folders = [Path(entry.removeprefix("file://")) / "sweeps"]
        else:
            try:
                root = Path(str(files(entry.removeprefix("pkg://"))))
            except ModuleNotFoundError:
                continue
            folders = [f for f in root.iterdir() if f.is_dir() and not f.name.startswith("_")]
        for folder in folders:
            names = {p.stem for p in folder.glob("*.yaml")}
            if names:
                groups.setdefault(folder.name, set()).update(names)
    return {group: sorted(names) for group, names in groups.items()}


def unknown(field: str, value: Any, what: str, name: str, known: Sequence[str], listed: str) -> ConfigError:
    """``<field>=<value>: unknown <what>; did you mean '<closest>'? <listed>: ...``."""
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ";"
    return ConfigError(field, value, f"unknown {what}{hint} {listed}: {', '.join(known)}")


def sweep_values(value: str) -> list[str] | None:
    """The plain values of ``a,b,c`` (one value: a list of one); None for anything Hydra evaluates."""
    if any(c in value for c in "()[]{}$'\"*?\\") or value in ("", "null"):
        return None
    return value.split(",")


def check_overrides(args: Sequence[str], elsewhere: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError for the first override whose key or group option does not exist in zoo's config;
    ``elsewhere``: where a key that is not there lives instead (its hint, by dotted key)."""
    if any(a == flag or a.startswith(f"{flag}=") for a in args for flag in OTHER_CONFIG):
        return
    plain = [a.partition("=") for a in args if "=" in a and not a.startswith(("-", "+", "~"))]
    plain = [(k, v) for k, _, v in plain if not (k == "hydra" or k.startswith(("hydra.", "hydra/")) or "@" in k)]
    if not plain:
        return
    groups = group_options()
    for key, value in plain:
        if key in groups and (names := sweep_values(value)) is not None:
            for name in names:
                if name not in groups[key]:
                    raise unknown(key, name, key, name, groups[key], "options")
    chosen = [f"{k}={sweep_values(v)[0]}" for k, v in plain if k in groups and sweep_values(v)]  # type: ignore[index]
    added = [a for a in args if a.startswith("+") and "=" in a and "." not in a.partition("=")[0]]
    cfg = composed([*added, *chosen])
    if cfg is None:
        return  # Hydra reports what does not compose
    top = sorted({*groups, *cfg})
    for key, value in plain:
        head, *rest = key.split(".")
        if head not in top:
            raise unknown(key, value, f"key {head!r}", head, top, "keys")
        if rest and head in groups and head not in cfg:
            raise group_key(key, value, cfg, groups[head])
        check_path(key, value, cfg, rest, head, elsewhere or {})


def group_key(key: str, value: str, cfg: DictConfig, options: Sequence[str]) -> ConfigError:
    """``residual.n_streams=2``: a dotted key under a config group whose options sit elsewhere (an axis's under
    ``block``), or under a group that sets no key of its own name (``sweeps``)."""
    head, _, rest = key.partition(".")
    if isinstance(cfg.get("block"), DictConfig) and head in cfg.block:
        return ConfigError(key, value, f"the {head} group's options sit under block.{head}: block.{key}={value}")
    return ConfigError(key, value, f"{head} is a config group, not a key: choose one of its options ({head}=<option>): "
                       f"{', '.join(options)}")  # fmt: skip


def check_path(
    key: str, value: str, cfg: DictConfig, rest: Sequence[str], head: str, elsewhere: Mapping[str, str]
) -> None:
    """The dotted key's path in the composed config, down to an open node (the axes), a leaf or an
    empty node (``model.layers``: Hydra's ``+`` is the right advice there)."""
    node: Any = cfg.get(head) if head in cfg else None
    path = head
    for part in rest:
        if not isinstance(node, DictConfig) or not OmegaConf.is_struct(node) or len(node) == 0:
            return
        if part not in node:
            where = elsewhere.get(f"{path}.{part}")
            raise unknown(key, value, f"key {part!r} of {path}" + (f" ({where})" if where else ""), part,
                          sorted(node), "keys")  # fmt: skip
        node, path = node[part], f"{path}.{part}"


def composed(overrides: Sequence[str]) -> DictConfig | None:
    """zoo's config with the command line's group choices, or None when it does not compose."""
    try:
        return compose_with_choices(overrides)[0]
    except (HydraException, ConfigError, ValueError):
        return None
