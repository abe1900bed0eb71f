"""Where zoo's Hydra config tree is and what Hydra's search path holds (``${zoo_searchpath:}``), registered
when zoo is imported: a Hydra app of one's own that puts ``${zoo_searchpath:}`` in its config only needs
``import zoo`` before Hydra reads it (docs/composing.md). Imports no torch."""

from __future__ import annotations

import warnings
from importlib.resources import files
from importlib.util import find_spec
from pathlib import Path

from omegaconf import OmegaConf

from zoo.core.registry import PluginWarning, load_plugins, plugin_config_packages

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
