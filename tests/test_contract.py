"""The block contract (tests/contract.py), checked for every combination of registered parts.

One test per combination: its blocks are built once and every property runs against them; a
failure names each property that failed. Invalid combinations are skipped with the reason
(zoo.check_combination), and the run ends with a count (conftest.py).
"""

from __future__ import annotations

import pytest
from combos import every_combination
from contract import Subject, run_contract


@every_combination
def test_block_contract(combo, record_property):
    subject = Subject.of(combo)
    if isinstance(subject, str):
        pytest.skip(subject)
    record_property("context", subject.context)
    failures, notes = run_contract(subject)
    for note in notes:
        record_property("note", note)
    assert not failures, "\n".join(failures)
