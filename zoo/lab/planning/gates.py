"""``report.gates``: named pass/fail rules a variant must meet, one registry (:data:`GATES`) turning each name into
its rule. A rule reads a variant's :class:`Evidence` (what the report measured: zoo/lab/studies/gates.py) and
returns a :class:`GateResult` with its reason. The section is checked here, before any run, so an unknown name or
option is refused naming the allowed ones.

Adding a gate: a function ``rule(evidence, **options) -> GateResult`` registered with ``@register_gate(name,
summary, option=default, ...)``, and, when it needs a measurement the report does not yet hand a rule, one method
on :class:`Evidence` and its reading in ``zoo.lab.studies.gates.ReportEvidence`` (as the ``target`` gate reads
``report.target``'s rule: ``Evidence.target()``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from zoo.core.errors import ConfigError

#: What a size comparison holds equal (``better_at_every_size``'s ``at``): each run's metric read on its own
#: validation curve at the pair's common training time (seconds), FLOPs, or steps.
COSTS = ("time", "flops", "steps")


@dataclass(frozen=True)
class Finding:
    """One comparison of a variant with the baseline: its verdict and how it reads (difference and interval, or
    multiplier and interval)."""

    verdict: str
    text: str


class Evidence(Protocol):
    """What the report measured for one variant, as the gate rules read it."""

    metric: str

    def comparison(self) -> Finding | None:
        """The report's comparison with the baseline on its metric; None for the baseline."""

    def at_sizes(self, axis: str, at: str) -> dict[str, Finding] | None:
        """Per value of ``axis``, this variant against the baseline at that value, at equal ``at`` (:data:`COSTS`);
        None when ``axis`` is not swept, empty when the variant differs from the baseline in ``axis`` alone."""

    def ladder(self) -> Finding | None:
        """The ladder's verdict and iso-loss multiplier; None for a sweep that is not a ladder."""

    def target(self) -> Finding | None:
        """``report.target``'s pass rule (``pass``, ``fail`` or ``too few runs``) and its reason; None without a
        target."""


@dataclass(frozen=True)
class GateResult:
    """A gate's answer for one variant: pass or fail, and why."""

    gate: str
    passed: bool
    reason: str

    @property
    def text(self) -> str:
        return f"{'passes' if self.passed else 'fails'} ({self.reason})"


@dataclass(frozen=True)
class Gate:
    """A registered gate: its rule, its options' defaults, a checker of their values, a line for the docs."""

    name: str
    rule: Callable[..., GateResult]
    summary: str
    defaults: dict[str, Any] = field(default_factory=dict)
    check: Callable[[dict[str, Any]], None] | None = None


#: Every gate ``report.gates`` may name.
GATES: dict[str, Gate] = {}


def register_gate(
    name: str, summary: str, check: Callable[[dict[str, Any]], None] | None = None, **defaults: Any
) -> Callable[[Callable[..., GateResult]], Callable[..., GateResult]]:
    """Register ``rule`` as the gate ``name`` with its options' ``defaults`` (checked by ``check``)."""

    def add(rule: Callable[..., GateResult]) -> Callable[..., GateResult]:
        if name in GATES:
            raise ValueError(f"gate {name!r} is registered twice")
        GATES[name] = Gate(name, rule, summary, dict(defaults), check)
        return rule

    return add


def gate_options(raw: Any) -> list[tuple[str, dict[str, Any]]]:
    """``report.gates`` checked: ``[(name, options)]`` with each gate's defaults filled in. Given as a list of
    names (``[better, ladder_better]``, ``"better,ladder_better"``), a mapping ``{name: {option: value}}``, or a
    list mixing names and one-entry mappings; null or empty: no gates."""
    if raw is None or raw == [] or raw == {}:
        return []
    items = [p.strip() for p in raw.split(",") if p.strip()] if isinstance(raw, str) else raw
    if isinstance(items, Mapping):
        items = [{k: v} for k, v in items.items()]
    if not isinstance(items, (list, tuple)):
        raise ConfigError("report.gates", raw, "a list of gate names, or a mapping {gate: {option: value}}")
    gates = []
    for item in items:
        name, given = item, {}
        if isinstance(item, Mapping) and len(item) == 1:
            name, given = next(iter(item.items()))
            given = {} if given is None else given
        if not isinstance(name, str) or name not in GATES:
            raise ConfigError("report.gates", item, f"a gate name; allowed: {', '.join(GATES)}")
        gate = GATES[name]
        if not isinstance(given, Mapping):
            raise ConfigError(f"report.gates.{name}", given, f"a mapping of its options: {options_text(gate)}")
        for key in given:
            if key not in gate.defaults:
                raise ConfigError(f"report.gates.{name}.{key}", given[key], f"an option of {name}: "
                                  f"{options_text(gate)}")  # fmt: skip
        options = {**gate.defaults, **given}
        if gate.check is not None:
            gate.check(options)
        gates.append((name, options))
    return gates


def options_text(gate: Gate) -> str:
    return ", ".join(f"{k} (default {v})" for k, v in gate.defaults.items()) or "none"


def check_gates(raw: Any, axes: list[str], ladder: bool, target: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """``report.gates`` (:func:`gate_options`) against the sweep: each gate's ``axis`` one of its swept ``axes``,
    ``ladder_better`` only on a ladder sweep (``ladder``: it has ``ladder.steps``) and ``target`` only with a
    ``report.target`` (``target``); a ConfigError names the key."""
    gates = gate_options(raw)
    for name, options in gates:
        if "axis" in options and options["axis"] not in axes:
            swept = ", ".join(axes) or "none"
            raise ConfigError(f"report.gates.{name}.axis", options["axis"], f"a swept axis; swept: {swept}")
        if name == "ladder_better" and not ladder:
            others = ", ".join(g for g in GATES if g != name)
            raise ConfigError("report.gates", name, f"a ladder sweep (ladder.steps) for {name}; or one of {others}")
        if name == "target" and not target:
            others = ", ".join(g for g in GATES if g != name)
            raise ConfigError("report.gates", name, f"a report.target for {name}; or one of {others}")
    return gates


def evaluate(gates: list[tuple[str, dict[str, Any]]], evidence: Evidence) -> list[GateResult]:
    """Each gate's answer for one variant's ``evidence``."""
    return [GATES[name].rule(evidence, **options) for name, options in gates]


def check_size_options(options: dict[str, Any]) -> None:
    if options["at"] not in COSTS:
        raise ConfigError("report.gates.better_at_every_size.at", options["at"], " or ".join(COSTS))
    if not isinstance(options["axis"], str) or not options["axis"]:
        raise ConfigError("report.gates.better_at_every_size.axis", options["axis"], "a swept key, e.g. block.d_model")


def on_verdict(gate: str, found: Finding | None, wanted: str, missing: str, shown: str) -> GateResult:
    """Passed when ``found``'s verdict is ``wanted``; failed with ``missing`` without one; the reason ``shown``
    with the finding's ``{verdict}`` and ``{text}``."""
    if found is None:
        return GateResult(gate, False, missing)
    return GateResult(gate, found.verdict == wanted, shown.format(verdict=found.verdict, text=found.text))


@register_gate("better", "the report's verdict on its metric against the baseline is better")
def better(evidence: Evidence) -> GateResult:
    shown = f"{{verdict}} on {evidence.metric}, {{text}}"
    return on_verdict("better", evidence.comparison(), "better", "no comparison with the baseline", shown)


@register_gate(
    "better_at_every_size",
    "better than the baseline at every value of a width axis, each pair read at equal training time (or FLOPs, "
    "steps)",
    check=check_size_options,
    axis="block.d_model",
    at="time",
)
def better_at_every_size(evidence: Evidence, axis: str, at: str) -> GateResult:
    sizes = evidence.at_sizes(axis, at)
    name = "better_at_every_size"
    if sizes is None:
        return GateResult(name, False, f"{axis} is not swept: no sizes to compare at")
    if not sizes:
        return GateResult(name, False, f"the variant differs from the baseline in {axis} alone")
    shown = "; ".join(f"{axis}={size}: {f.verdict}, {f.text}" for size, f in sizes.items())
    failed = [size for size, f in sizes.items() if f.verdict != "better"]
    if len(sizes) < 2:
        return GateResult(name, False, f"one size only ({shown})")
    if failed:
        return GateResult(name, False, f"not better at {axis}={', '.join(failed)} at equal {at} ({shown})")
    return GateResult(name, True, f"better at {axis}={', '.join(sizes)} at equal {at} ({shown})")


@register_gate("ladder_better", "the ladder's verdict (iso-loss compute multiplier, ladder.steps) is better")
def ladder_better(evidence: Evidence) -> GateResult:
    missing = "no ladder verdict (not a ladder sweep, or no ladder row)"
    return on_verdict("ladder_better", evidence.ladder(), "better", missing, "ladder verdict {verdict}, {text}")


@register_gate("target", "report.target's pass rule: (target - mean final metric) x sqrt(n) clears report.margin")
def target(evidence: Evidence) -> GateResult:
    return on_verdict("target", evidence.target(), "pass", "no report.target", "target rule {verdict}: {text}")
