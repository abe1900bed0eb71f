"""The report's ``report.target`` part (zoo.lab.studies.target): a section of report.md, each variant's steps,
FLOPs and seconds to the target with the pass rule's verdict, and the matching report.csv cells."""

from __future__ import annotations

from typing import Any

from zoo.lab.studies.runset import Variant
from zoo.lab.studies.target import TargetResult
from zoo.lab.studies.variants import Report

#: report.csv's columns of a report with a target (empty cells in one without).
TARGET_COLUMNS = [
    "target", "target_reached", "steps_to_target", "flops_to_target", "seconds_to_target", "target_score",
    "target_verdict",
]  # fmt: skip


def result_of(report: Report, variant: Variant) -> TargetResult | None:
    return report.target.results.get(variant.key) if report.target is not None else None


def reached_text(result: TargetResult) -> str:
    """``2/3``: the runs that reached the target, of the variant's runs."""
    return f"{len(result.reached)}/{len(result.crossings)}"


def target_cell(report: Report, variant: Variant, key: str) -> Any:
    """One of :data:`TARGET_COLUMNS` for ``variant`` (None without a target)."""
    result = result_of(report, variant)
    if result is None:
        return None
    cells = {
        "target": report.target.target,
        "target_reached": reached_text(result),
        "steps_to_target": result.mean_of("step"),
        "flops_to_target": result.mean_of("flops"),
        "seconds_to_target": result.mean_of("seconds"),
        "target_score": result.score,
        "target_verdict": result.verdict,
    }
    return cells[key]


def number(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def target_lines(report: Report) -> list[str]:
    """The section: the target and the rule, then a row per variant (the means over the runs that reached it)."""
    study = report.target
    if study is None:
        return []
    smoothing = f", read on an EMA of the evaluations (weight {study.ema:g} on the past)" if study.ema else ""
    better = "at or below" if report.mode == "min" else "at or above"
    gap = "target - mean" if report.mode == "min" else "mean - target"
    lines = [
        "",
        f"Reaching the target {study.metric} = {study.target:g}: the first step at which a run's validation metric "
        f"is {better} it, linear between the two evaluations around the crossing{smoothing}, with its FLOPs and "
        f"training seconds (means over the runs that reached it). A variant passes when ({gap} final "
        f"{study.metric}) x sqrt(runs) > margin {study.margin:g} (modded-nanogpt's rule; docs/sweeps.md says what "
        "error rate it holds).",
        "",
        "| variant | reached | steps | FLOPs | seconds | score | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in report.variants:
        result = study.results[variant.key]
        never = len(result.crossings) - len(result.reached)
        reached = reached_text(result) + (f" ({never} never)" if never else "")
        cells = [report.label(variant), reached, number(result.mean_of("step"), ",.1f"),
                 number(result.mean_of("flops"), ".3g"), number(result.mean_of("seconds"), ".2f"),
                 number(result.score, ".4g"), f"{result.verdict}: {result.reason}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines
