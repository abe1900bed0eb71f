"""The block contract as a tool: the properties every combination of parts must have
(:mod:`zoo.testing.contract`; the exceptions parts declare, :mod:`zoo.testing.exceptions`), the
combinations they run on (:mod:`zoo.testing.combos`), the ``zoo-contract`` command
(:mod:`zoo.testing.cli`) and, through the top-level module ``pytest_zoo``, a pytest plugin
(``pytest --zoo-part norm=dyt``). docs/testing.md describes each property.

pytest is needed only by the helpers that parametrize, skip or xfail a test; ``zoo-contract`` runs
without it.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Each public name and the module that defines it, imported when first read (PEP 562): importing
#: zoo.testing (zoo-contract --help, the pytest plugin) imports no torch until a name is used.
PUBLIC = {
    **dict.fromkeys(["combinations", "combo_id", "covering_combinations", "select", "shard"], "zoo.testing.combos"),
    **dict.fromkeys(["PROPERTIES", "Subject", "run_contract"], "zoo.testing.contract"),
    "declared_exceptions": "zoo.testing.exceptions",
    **dict.fromkeys(["Outcome", "check", "summary"], "zoo.testing.run"),
}
__all__ = sorted(PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in PUBLIC:
        raise AttributeError(f"module 'zoo.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(PUBLIC[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *PUBLIC])
