"""The report's gates (``report.gates``): a section of report.md with each variant's answer and its reason, and
``gates.json`` (one entry per variant and gate) for ``zoo-results``. The answers are zoo/lab/studies/gates.py's."""

from __future__ import annotations

from typing import Any

from zoo.lab.files import write_json_atomic
from zoo.lab.records.report_files import GATES_FILE
from zoo.lab.studies.variants import Report

#: gates.json's layout version.
GATES_SCHEMA = 1


def gate_lines(report: Report) -> list[str]:
    """report.md's gates section: per variant, each gate's pass or fail and why."""
    if not report.gates:
        return []
    lines = ["", f"Gates (report.gates; {GATES_FILE}), each variant against the baseline {report.baseline_label}:"]
    for variant in report.variants:
        for result in report.gates.get(variant.key, []):
            lines.append(f"- {report.label(variant)}, {result.gate}: {result.text}")
    return lines


def gates_cell(report: Report, key: tuple[str, ...]) -> str:
    """``2/3 pass`` for the variants table, empty for the baseline or without gates."""
    results = report.gates.get(key)
    return f"{sum(r.passed for r in results)}/{len(results)} pass" if results else ""


def write_gates(report: Report) -> None:
    """gates.json: the metric, the baseline and each variant's gate answers (none: no file)."""
    if not report.gates:
        return
    entries: list[dict[str, Any]] = []
    for variant in report.variants:
        for result in report.gates.get(variant.key, []):
            values = dict(zip(report.axes, variant.key, strict=True))
            entries.append({"variant": report.label(variant), "values": values, "gate": result.gate,
                            "passed": result.passed, "reason": result.reason})  # fmt: skip
    write_json_atomic(report.root / GATES_FILE, {"schema": GATES_SCHEMA, "metric": report.metric,
                                                 "baseline": report.baseline_label, "gates": entries})  # fmt: skip
