"""Running the block contract on one combination, and tallying many: what ``zoo-contract`` and the
pytest plugin share, so both report the same outcome the same way."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from zoo.testing.combos import combo_id
from zoo.testing.contract import PROPERTIES, Subject, run_contract
from zoo.testing.exceptions import declared_exceptions, settle

#: The contexts a combination runs in, in words.
CONTEXTS = {"block": "as a lone block", "model": "behind a model's position embedding"}


@dataclass
class Outcome:
    """One combination's result. ``status``: passed, failed (a property no part declares failed),
    declared (only properties a part declares cannot hold failed) or skipped (invalid, ``reason``)."""

    combo: dict[str, str]
    status: str
    failures: list[str] = field(default_factory=list)  # "property: message", undeclared
    excused: list[str] = field(default_factory=list)  # "property: declared by part: why"
    held: list[str] = field(default_factory=list)  # declared, yet held
    notes: list[str] = field(default_factory=list)  # "property: not applicable: ..."
    reason: str = ""
    context: str = ""
    seconds: float = 0.0

    @property
    def id(self) -> str:
        return combo_id(self.combo)

    def lines(self) -> list[str]:
        """One line per failing property, naming the combination, the property and the values."""
        return [f"FAILED {self.id}: {failure}" for failure in self.failures]


def check(combo: dict[str, str]) -> Outcome:
    """Run every contract property on ``combo`` (torch's CPU generator seeded with 0 first, so a
    combination draws the same inputs and weights wherever and in whatever order it runs)."""
    torch.random.default_generator.manual_seed(0)
    start = time.perf_counter()
    subject = Subject.of(combo)
    if isinstance(subject, str):
        return Outcome(combo, "skipped", reason=subject)
    failures, notes = run_contract(subject)
    unexpected, excused, held = settle(failures, declared_exceptions(combo), PROPERTIES)
    status = "failed" if unexpected else "declared" if excused else "passed"
    seconds = time.perf_counter() - start
    return Outcome(combo, status, unexpected, excused, held, notes, context=subject.context, seconds=seconds)


def summary(outcomes: list[Outcome], what: str = "") -> list[str]:
    """The end of a run: counts (passed, failed, skipped as invalid, failing only as declared), each
    skip reason, each property that did not apply, and every declared exception that applied."""
    status = Counter(o.status for o in outcomes)
    ran = [o for o in outcomes if o.status != "skipped"]
    contexts = Counter(CONTEXTS.get(o.context, o.context) for o in ran)
    head = f"contract{what}: {len(outcomes)} combinations, {len(ran)} run"
    head += " (" + ", ".join(f"{n} {context}" for context, n in sorted(contexts.items())) + ")" if ran else ""
    head += f": {status['passed']} passed, {status['failed']} failed, {status['skipped']} skipped as invalid"
    if status["declared"]:
        head += f", {status['declared']} failing only where a part declares it cannot hold"
    lines = [head]
    for reason, n in Counter(o.reason for o in outcomes if o.status == "skipped").most_common():
        lines.append(f"  skipped {n}: {reason}")
    for note, n in Counter(note for o in ran for note in o.notes).most_common():
        lines.append(f"  {n} x {note}")
    declared = Counter(message for o in ran for message in o.excused + o.held)
    if declared:
        lines.append("contract exceptions declared by parts (combinations):")
        lines += [f"  {n} x {message}" for message, n in sorted(declared.items())]
    return lines
