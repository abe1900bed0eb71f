"""The block contract as a tool: the properties every combination of parts must have
(:mod:`zoo.testing.contract`), the combinations they run on (:mod:`zoo.testing.combos`), the
``zoo-contract`` command (:mod:`zoo.testing.cli`) and, through the top-level module ``pytest_zoo``, a
pytest plugin (``pytest --zoo-part norm=dyt``). docs/testing.md describes each property.

pytest is needed only by the helpers that parametrize, skip or xfail a test; ``zoo-contract`` runs
without it.
"""

from zoo.testing.combos import combinations, combo_id, covering_combinations, select, shard
from zoo.testing.contract import PROPERTIES, Subject, declared_exceptions, run_contract
from zoo.testing.run import Outcome, check, summary

__all__ = [
    "PROPERTIES",
    "Outcome",
    "Subject",
    "check",
    "combinations",
    "combo_id",
    "covering_combinations",
    "declared_exceptions",
    "run_contract",
    "select",
    "shard",
    "summary",
]
