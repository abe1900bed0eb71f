"""Declared contract exceptions: the properties (or model checks) a part says cannot hold for it, and the verdict
of a run once they are read: an undeclared failure fails, a declared one xfails with its reason, and every declared
exception that applied, failed or held, is recorded."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from zoo.assembly.spec import resolve_block
from zoo.core.interface import hook
from zoo.core.registry import AXES
from zoo.testing.combos import block_config, combo_id, has_part


def exception_entry(value: Any) -> tuple[str, dict[str, list[str]]]:
    """One declared exception's value -> (reason, ``only_with``: axis -> labels, empty for every combination).

    A value is the reason (``"why"``), or ``{"why": "...", "only_with": {"mlp": "moe"}}``: the exception
    applies only to the combinations that hold, on every axis named, one of its labels (a name, which
    takes in its variants, or ``name+variant``; a list for several). Raises ValueError naming what is wrong.
    """
    if isinstance(value, str):
        return value, {}
    if not isinstance(value, Mapping) or set(value) - {"why", "only_with"} or not isinstance(value.get("why"), str):
        raise ValueError(f"{value!r}: give the reason, or {{'why': reason, 'only_with': {{axis: part(s)}}}}")
    only_with = value.get("only_with") or {}
    if not isinstance(only_with, Mapping) or not only_with:
        raise ValueError(f"only_with={only_with!r}: a non-empty mapping of axis -> part name(s)")
    limits: dict[str, list[str]] = {}
    for axis, labels in only_with.items():
        labels = [labels] if isinstance(labels, str) else labels
        if axis not in AXES or not isinstance(labels, list | tuple) or not all(isinstance(x, str) for x in labels):
            raise ValueError(f"only_with {axis!r}: {labels!r}: an axis ({', '.join(AXES)}) and part name(s)")
        limits[axis] = list(labels)
    return value["why"], limits


def applies(combo: dict[str, str], only_with: dict[str, list[str]]) -> bool:
    """Whether a declared exception limited to ``only_with`` applies to ``combo``."""
    return all(any(has_part(combo, (axis, label)) for label in labels) for axis, labels in only_with.items())


def part_exceptions(cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """A part class's ``contract_exceptions`` for its ``options``: {} when it declares none."""
    exceptions = hook(cls, "contract_exceptions") or {}
    return exceptions(**options) if callable(exceptions) else exceptions


def declared_exceptions(combo: dict[str, str]) -> dict[str, str]:
    """The contract properties (or model checks) the parts of ``combo`` declare cannot hold, each with
    the part and its reason: ``{"samples do not see each other": "mlp moe: ..."}``.

    A part declares them in its class as ``contract_exceptions = {"property": "why"}``, or as a
    classmethod ``contract_exceptions(cls, **options)`` returning that dict for its options; a value
    ``{"why": ..., "only_with": {"mlp": "moe"}}`` limits one to the combinations with those parts
    (:func:`exception_entry`).
    """
    try:
        spec = resolve_block(block_config(combo))
    except Exception:  # noqa: BLE001  (an invalid combination declares nothing; it is skipped with its reason)
        return {}
    declared: dict[str, str] = {}
    for axis, choice in spec.choices.items():
        for name, value in part_exceptions(choice.part.cls, choice.options).items():
            why, only_with = exception_entry(value)
            if not applies(combo, only_with):
                continue
            label = f"{axis} {choice.part.name}: {why}"
            declared[name] = f"{declared[name]}; {label}" if name in declared else label
    return declared


def settle(
    failures: dict[str, str], declared: dict[str, str], ran: Iterable[str]
) -> tuple[list[str], list[str], list[str]]:
    """Split the failing checks of a run (name -> message; ``ran``: every check run) by the declared
    exceptions: (failures no part declared, declared exceptions that failed, declared exceptions
    that held), each message naming the check (and the part and reason when declared). An
    undeclared failure stays a failure."""
    unexpected = [f"{name}: {message}" for name, message in failures.items() if name not in declared]
    ran = set(ran)
    excused = [f"{name}: declared by {why}" for name, why in declared.items() if name in failures]
    held = [f"{name}: declared by {why}, but held" for name, why in declared.items() if name in ran - set(failures)]
    return unexpected, excused, held


def conclude(
    failures: dict[str, str],
    declared: dict[str, str],
    ran: Iterable[str],
    record: Callable[[str, str], None],
    combo: dict[str, str] | None = None,
) -> None:
    """End a contract test: fail on any undeclared failure, one line per failing check, each naming
    ``combo``; else xfail, with the parts' reasons, when a declared exception failed. Every declared
    exception that applied is recorded (``record("declared", ...)``, summarized at the end of the
    run), so none passes unseen."""
    import pytest

    unexpected, excused, held = settle(failures, declared, ran)
    for message in excused + held:
        record("declared", message)
    where = f"{combo_id(combo)}: " if combo else ""
    lines = unexpected + [f"(as declared) {message}" for message in excused]
    if unexpected:
        raise AssertionError("\n".join(where + line for line in lines))
    if excused:
        pytest.xfail("; ".join(excused))
