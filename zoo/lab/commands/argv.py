"""Command-line overrides checked before Hydra sees them (``zoo-train``, ``zoo-sweep``).

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
import sys
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from zoo.core.errors import ConfigError
from zoo.lab.keys import ELSEWHERE

#: Flags that point Hydra at another config tree: the overrides are then not zoo's to judge.
OTHER_CONFIG = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn")


def group_options() -> dict[str, list[str]]:
    """Every config group on zoo's search path (its own, the sweeps, every plugin's) and its options."""
    from zoo.assembly.config_tree import search_path

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


def check_overrides(args: Sequence[str]) -> None:
    """Raise ConfigError for the first override whose key or group option does not exist in zoo's config."""
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
        check_path(key, value, cfg, rest, head)


def group_key(key: str, value: str, cfg: DictConfig, options: Sequence[str]) -> ConfigError:
    """``residual.n_streams=2``: a dotted key under a config group whose options sit elsewhere (an axis's under
    ``block``), or under a group that sets no key of its own name (``sweeps``)."""
    head, _, rest = key.partition(".")
    if isinstance(cfg.get("block"), DictConfig) and head in cfg.block:
        return ConfigError(key, value, f"the {head} group's options sit under block.{head}: block.{key}={value}")
    return ConfigError(key, value, f"{head} is a config group, not a key: choose one of its options ({head}=<option>): "
                       f"{', '.join(options)}")  # fmt: skip


def check_path(key: str, value: str, cfg: DictConfig, rest: Sequence[str], head: str) -> None:
    """The dotted key's path in the composed config, down to an open node (the axes), a leaf or an
    empty node (``model.layers``: Hydra's ``+`` is the right advice there)."""
    node: Any = cfg.get(head) if head in cfg else None
    path = head
    for part in rest:
        if not isinstance(node, DictConfig) or not OmegaConf.is_struct(node) or len(node) == 0:
            return
        if part not in node:
            where = ELSEWHERE.get(f"{path}.{part}")
            raise unknown(key, value, f"key {part!r} of {path}" + (f" ({where})" if where else ""), part,
                          sorted(node), "keys")  # fmt: skip
        node, path = node[part], f"{path}.{part}"


def composed(overrides: Sequence[str]) -> DictConfig | None:
    """zoo's config with the command line's group choices, or None when it does not compose."""
    from zoo.assembly.config_tree import compose_with_choices

    try:
        return compose_with_choices(overrides)[0]
    except (HydraException, ConfigError, ValueError):
        return None


#: Keys whose value is a mapping of override lists, given as a YAML flow mapping (``variants={base: [], rope:
#: [pos=rotary]}``) that Hydra's grammar reads only with each override quoted: :func:`quoted_mappings` quotes them.
MAPPING_KEYS = ("variants", "ablate.features")


def quoted_mappings(args: Sequence[str]) -> list[str]:
    """``args`` with each :data:`MAPPING_KEYS` value that reads as a YAML flow mapping written in Hydra's grammar,
    every override quoted (``{rope: ['pos=rotary']}``); any other argument, or one YAML does not read, as given."""
    import yaml

    out = []
    for arg in args:
        key, sep, value = arg.partition("=")
        try:
            mapping = yaml.safe_load(value) if sep and key.lstrip("+") in MAPPING_KEYS and value[:1] == "{" else None
        except yaml.YAMLError:
            mapping = None
        out.append(f"{key}={{{', '.join(f'{k}: {quoted(v)}' for k, v in mapping.items())}}}"
                   if isinstance(mapping, dict) else arg)  # fmt: skip
    return out


#: Keys whose value is a comma-separated list of names (``block.out_conv=attn,mlp``), which Hydra refuses unquoted
#: outside a multirun (there it is a sweep over the names): :func:`quoted_lists` quotes them.
LIST_KEYS = ("out_conv",)


def quoted_lists(args: Sequence[str]) -> list[str]:
    """``args`` with each :data:`LIST_KEYS` value of names and commas quoted (``block.out_conv='attn,mlp'``), unless
    the command is a multirun (``-m``: the commas sweep); any other argument as given."""
    if "-m" in args or "--multirun" in args:
        return list(args)
    out = []
    for arg in args:
        key, sep, value = arg.partition("=")
        names = value.split(",")
        listed = sep and key.rpartition(".")[2] in LIST_KEYS and len(names) > 1 and all(n.isidentifier() for n in names)
        out.append(f"{key}='{value}'" if listed else arg)
    return out


def quoted(value: Any) -> str:
    """A list of strings (or one string) in Hydra's grammar, each string quoted."""
    if isinstance(value, list):
        return f"[{', '.join(quoted(v) for v in value)}]"
    return "'" + str(value).replace("'", "\\'") + "'" if isinstance(value, str) else str(value)


def exit_on_bad_overrides(prog: str, args: Sequence[str] | None = None) -> None:
    """Exit with ``<prog>: <error>`` (one line, status 1) when :func:`check_overrides` refuses ``args``
    (default: this process's command line)."""
    try:
        check_overrides(sys.argv[1:] if args is None else args)
    except ConfigError as error:
        sys.exit(f"{prog}: {error}")
