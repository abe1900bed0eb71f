"""Where zoo's Hydra config tree is and what Hydra's search path holds (``${zoo_searchpath:}``), registered
when zoo is imported: a Hydra app of one's own that puts ``${zoo_searchpath:}`` in its config only needs
``import zoo`` before Hydra reads it (docs/composing.md). Composing the tree (:func:`compose_with_choices`,
not validated) is here too, so that a command answers ``--help`` or refuses a misspelt key without torch."""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Sequence
from importlib.resources import files
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict

from zoo.core.registry import AXES, PluginWarning, load_plugins, plugin_config_packages

#: The Hydra config tree (``conf/`` in the source tree, ``zoo/conf`` when installed): one group per
#: axis (placement, norm, attn, pos, mlp), presets, tasks.
CONF_DIR = Path(str(files("zoo.conf")))
#: The folder holding the ``sweeps`` group (``sweeps/<name>.yaml``, ``zoo/sweeps`` when installed).
SWEEPS_ROOT = Path(str(files("zoo.sweeps"))).parent


def search_path() -> list[str]:
    """Hydra search-path entries for zoo's groups, its sweeps and every plugin's option files.

    A plugin's ``zoo.conf`` entry point that names no importable package is reported in a
    :class:`~zoo.core.registry.PluginWarning` (and left out) rather than skipped silently.
    """
    load_plugins()  # before importing their option packages, so their parts register as theirs
    root = str(SWEEPS_ROOT).replace("\\", "/")
    entries = ["pkg://zoo.conf", f"file://{root}"]
    for package, module in plugin_config_packages():
        try:
            found = find_spec(module) is not None
        except ImportError:  # its parent package is missing
            found = False
        if found:
            entries.append(f"pkg://{module}")
        else:
            warnings.warn(
                f"plugin {package} declares option files in {module!r} (entry point zoo.conf), which does not import",
                PluginWarning,
                stacklevel=2,
            )
    return entries


OmegaConf.register_new_resolver("zoo_searchpath", search_path, replace=True)

# conf/config.yaml's defaults list composes this node after its own: the five axis nodes, open
# (not struct), so that a misspelt option (``block.placement.alhpa=2``) reaches zoo's check, which
# names the part's options, instead of Hydra's struct error and its "use +..." advice.
_axes = OmegaConf.create({"block": {axis: {} for axis in AXES}})
for _axis in AXES:
    OmegaConf.set_struct(_axes.block[_axis], False)
ConfigStore.instance().store(name="zoo_open_axes", node=_axes)


#: What :func:`compose_with_choices` composed, by :func:`compose_key`: a compose reads and merges dozens of YAML
#: files (about 0.1 s); the same request over the same files gives the same config.
_composed: dict[tuple[Any, ...], tuple[DictConfig, dict[str, Any]]] = {}
_COMPOSED_MAX = 256


def compose_with_choices(
    overrides: Sequence[str] = (), config_name: str = "config"
) -> tuple[DictConfig, dict[str, Any]]:
    """The composed config, not validated, and Hydra's group choices (``{"norm": "rmsnorm", ...}``).

    Works inside a running Hydra app too (a sweep's report, a user's task function): its Hydra is set
    aside for the compose and put back. A request composed before over unchanged files (:func:`compose_key`) is
    answered from memory, as a copy.
    """
    key = compose_key(overrides, config_name)
    if key in _composed:
        cfg, choices = _composed[key]
        return copy.deepcopy(cfg), dict(choices)
    cfg, choices = _compose(overrides, config_name)
    if key is not None:
        if len(_composed) >= _COMPOSED_MAX:
            _composed.clear()
        _composed[key] = copy.deepcopy(cfg), dict(choices)
    return cfg, choices


def compose_key(overrides: Sequence[str], config_name: str) -> tuple[Any, ...] | None:
    """A compose's request, Hydra's search path and the state of every config file on it (None: not kept, where
    an override moves the search path itself)."""
    overrides = tuple(overrides)
    if any("hydra.searchpath" in override for override in overrides):
        return None
    entries = tuple(search_path())
    return config_name, overrides, entries, files_state(entries)


def entry_folder(entry: str) -> Path | None:
    """The folder of a search-path entry (``pkg://zoo.conf``, ``file:///...``); None for a package that is gone."""
    if entry.startswith("pkg://"):
        try:
            return Path(str(files(entry.removeprefix("pkg://"))))
        except ModuleNotFoundError:
            return None
    return Path(entry.removeprefix("file://"))


def files_state(entries: Sequence[str]) -> tuple[tuple[str, int, int], ...]:
    """(path, modification time, size) of every folder and YAML file Hydra may read from ``entries`` (of the
    sweeps' root, its ``sweeps`` group only)."""
    state = []
    for entry in entries:
        folder = entry_folder(entry)
        if folder is None:
            continue
        folder = folder / "sweeps" if folder == SWEEPS_ROOT else folder
        for path, dirs, names in os.walk(folder):
            dirs[:] = [name for name in dirs if name != "__pycache__"]
            for name in [".", *(n for n in names if n.endswith((".yaml", ".yml")))]:
                stat = os.stat(os.path.join(path, name))
                state.append((os.path.join(path, name), stat.st_mtime_ns, stat.st_size))
    return tuple(state)


def _compose(overrides: Sequence[str], config_name: str) -> tuple[DictConfig, dict[str, Any]]:
    running = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
    finally:
        if running is not None:
            GlobalHydra.instance().initialize(running)
    choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra/")}
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices
