"""Command lines' arguments before Hydra sees them (``zoo-train``, ``zoo-sweep``): overrides checked in zoo's words
(:mod:`zoo.assembly.overrides`, with the lab's hints for keys that live elsewhere), and values Hydra's grammar reads
only when quoted.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from zoo.assembly import overrides
from zoo.core.errors import ConfigError
from zoo.lab.keys import ELSEWHERE


def check_overrides(args: Sequence[str]) -> None:
    """Raise ConfigError for the first override whose key or group option does not exist in zoo's config
    (:func:`zoo.assembly.overrides.check_overrides`, with the lab's hints: ``ladder.widths``)."""
    overrides.check_overrides(args, ELSEWHERE)


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
