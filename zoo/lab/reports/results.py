"""``zoo-results``: every sweep's comparisons under some folders in one table, one row per comparison (a report's
variant against its baseline; a ladder's variant against its baseline), with its gates, its sweep folder, command,
zoo version and date. Every verdict is kept (within noise and worse too); the same comparison measured twice with
verdicts that disagree is flagged on each of its rows.

The folders are read as data from anyone: report.csv, ladder.csv and gates.json are parsed and checked (the columns
and fields each row needs, numbers that read as numbers); a file that does not check is named with its problem and
its sweep (or its gates) left out, never a crash; nothing is unpickled. A run's summary.json (task, width, budget,
version) is read by zoo.lab.records.summary's checked reader.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from zoo.lab.planning.named import VARIANT
from zoo.lab.records.report_files import GATES_FILE
from zoo.lab.records.summary import RunRecord, read_record_checked
from zoo.lab.reports.sweep_record import read_sweep_record

#: The table's columns, in order: Markdown and CSV both.
COLUMNS = ("sweep", "kind", "variant", "baseline", "task", "size", "budget", "seeds", "metric", "difference",
           "ci_low", "ci_high", "verdict", "multiplier", "multiplier_ci_low", "multiplier_ci_high", "gates",
           "target", "disagrees", "command", "zoo_version", "date")  # fmt: skip
#: The report.csv columns a row needs (the variant's axes are those before ``runs``).
REPORT_NEEDS = ("runs", "metric", "verdict", "baseline", "delta_mean", "delta_ci_low", "delta_ci_high", "pairs",
                "steps")  # fmt: skip
#: The ladder.csv columns a row needs (its axes are those before ``envelope_cells``).
LADDER_NEEDS = ("envelope_cells", "seeds", "verdict", "multiplier", "multiplier_ci_low", "multiplier_ci_high")
#: Verdicts that say nothing either way: never a disagreement.
NO_VERDICT = ("too few seeds", "")


class Malformed(ValueError):
    """A file of a sweep folder that does not read as what it should be."""


@dataclass
class Results:
    """The comparisons found, and the files left out with why."""

    rows: list[dict[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def number(value: str, path: Path, column: str) -> str:
    """A CSV cell that must be empty or a number, as written (else :class:`Malformed`)."""
    if value in ("", None):
        return ""
    try:
        float(value)
    except ValueError:
        raise Malformed(f"{path}: column {column}: {value!r} is not a number") from None
    return value


def read_table(path: Path, needs: tuple[str, ...]) -> tuple[list[str], list[dict[str, str]]]:
    """A CSV's header and rows, each row of the header's length and the header holding ``needs``."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise Malformed(f"{path}: does not read: {error}") from None
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        raise Malformed(f"{path}: empty")
    header, body = rows[0], rows[1:]
    missing = [c for c in needs if c not in header]
    if missing:
        raise Malformed(f"{path}: no column {', '.join(missing)}")
    for i, row in enumerate(body, 2):
        if len(row) != len(header):
            raise Malformed(f"{path}: line {i} has {len(row)} cells, the header {len(header)}")
    return header, [dict(zip(header, row, strict=True)) for row in body]


def label(axes: list[str], row: dict[str, str]) -> str:
    """``mlp=swiglu pos=rotary``, a named variant by its name (``-gate block.d_model=64``): the report's own label."""
    return " ".join(row[a] if a == VARIANT else f"{a}={row[a]}" for a in axes) or "default"


def first_record(root: Path) -> RunRecord | None:
    """The first run folder of the sweep (by name) whose summary reads checked, or None."""
    for summary in sorted(root.glob("*/summary.json")):
        record, _ = read_record_checked(summary.parent)
        if record is not None:
            return record
    return None


def context(root: Path, record: RunRecord | None) -> dict[str, str]:
    """The sweep's command, zoo version and date: sweep.json's, else Hydra's multirun.yaml and the files' times."""
    recorded, problem = read_sweep_record(root)
    if problem:
        raise Malformed(f"{root / 'sweep.json'}: {problem}")
    if recorded is not None:
        return {"command": recorded["command"], "zoo_version": recorded["zoo_version"], "date": recorded["reported"]}
    command = ""
    if (root / "multirun.yaml").is_file():
        try:
            overrides = OmegaConf.select(OmegaConf.load(root / "multirun.yaml"), "hydra.overrides.task") or []
            command = "zoo-train -m " + " ".join(str(o) for o in overrides)
        except Exception as error:  # a YAML that does not parse: named, the sweep left out
            raise Malformed(f"{root / 'multirun.yaml'}: does not read: {error}") from None
    version = str((record.versions or {}).get("zoo", "")) if record is not None else ""
    written = datetime.fromtimestamp((root / "report.csv").stat().st_mtime, timezone.utc)
    return {"command": command, "zoo_version": version, "date": written.isoformat(timespec="seconds")}


def fixed(record: RunRecord | None, key: str) -> str:
    value = record.config_value(key) if record is not None else None
    return "" if value is None else str(value)


def task_of(record: RunRecord | None) -> str:
    task = (record.config or {}).get("task") if record is not None else None
    return str(task.get("name", "")) if isinstance(task, dict) else ""


def read_gates(root: Path) -> dict[str, str]:
    """``{variant label: "better pass; ladder_better fail (why)"}`` from gates.json, checked; empty without one."""
    path = root / GATES_FILE
    if not path.is_file():
        return {}
    try:
        data: Any = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise Malformed(f"{path}: not JSON: {error}") from None
    entries = data.get("gates") if isinstance(data, dict) else None
    kinds = {"variant": str, "gate": str, "passed": bool, "reason": str}
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and all(isinstance(e.get(k), t) for k, t in kinds.items()) for e in entries
    ):
        raise Malformed(f"{path}: not a gates file: a list 'gates' of entries with variant, gate, passed, reason")
    out: dict[str, list[str]] = {}
    for e in entries:
        said = "pass" if e["passed"] else f"fail ({e['reason']})"
        out.setdefault(e["variant"], []).append(f"{e['gate']} {said}")
    return {variant: "; ".join(said) for variant, said in out.items()}


def report_rows(
    root: Path, base: dict[str, str], record: RunRecord | None, problems: list[str]
) -> list[dict[str, str]]:
    """A row per non-baseline variant of report.csv; a gates.json that does not read is added to ``problems`` and
    its gates shown as not read."""
    path = root / "report.csv"
    header, rows = read_table(path, REPORT_NEEDS)
    axes = header[: header.index("runs")]
    try:
        gates = read_gates(root)
    except Malformed as error:
        problems.append(f"{error}; its gates left out")
        gates = {label(axes, row): f"{GATES_FILE} not read" for row in rows}
    out = []
    for row in rows:
        if row["verdict"] == "baseline":
            continue
        steps = number(row["steps"], path, "steps") or fixed(record, "train.steps")
        name = label(axes, row)
        out.append({**base, "kind": "report", "variant": name, "baseline": row["baseline"],
                    "task": row.get("task") or base["task"],
                    "size": row.get("block.d_model") or fixed(record, "block.d_model"),
                    "budget": f"{float(steps):g} steps" if steps else "", "seeds": number(row["pairs"], path, "pairs"),
                    "metric": row["metric"], "difference": number(row["delta_mean"], path, "delta_mean"),
                    "ci_low": number(row["delta_ci_low"], path, "delta_ci_low"),
                    "ci_high": number(row["delta_ci_high"], path, "delta_ci_high"), "verdict": row["verdict"],
                    "gates": gates.get(name, ""), "target": target_cell(row, path)})  # fmt: skip
    return out


def target_cell(row: dict[str, str], path: Path) -> str:
    """``pass: 2/2 reached val_bpb 2.9, 123 steps`` from report.csv's report.target columns; empty without them."""
    if not row.get("target"):
        return ""
    target, steps = number(row["target"], path, "target"), row.get("steps_to_target") or ""
    reached = f", {float(number(steps, path, 'steps_to_target')):.4g} steps" if steps else ""
    return f"{row.get('target_verdict', '')}: {row.get('target_reached', '')} reached {target}{reached}"


def ladder_rows(root: Path, base: dict[str, str], metric: str, record: RunRecord | None) -> list[dict[str, str]]:
    """A row per non-baseline variant of ladder.csv (none without one): its multiplier and verdict."""
    path = root / "ladder.csv"
    if not path.is_file():
        return []
    header, rows = read_table(path, LADDER_NEEDS)
    axes = header[: header.index("envelope_cells")]
    baseline = next((label(axes, r) for r in rows if r["verdict"] == "baseline"), "")
    return [{**base, "kind": "ladder", "variant": label(axes, r), "baseline": baseline, "size": "ladder",
             "budget": f"up to {fixed(record, 'train.steps')} steps", "seeds": number(r["seeds"], path, "seeds"),
             "metric": metric, "verdict": r["verdict"],
             "multiplier": number(r["multiplier"], path, "multiplier"),
             "multiplier_ci_low": number(r["multiplier_ci_low"], path, "multiplier_ci_low"),
             "multiplier_ci_high": number(r["multiplier_ci_high"], path, "multiplier_ci_high")}
            for r in rows if r["verdict"] != "baseline"]  # fmt: skip


def sweep_rows(root: Path, shown: str, problems: list[str]) -> list[dict[str, str]]:
    """Every comparison of the sweep folder ``root`` (named ``shown`` in the table)."""
    record = first_record(root)
    base = {c: "" for c in COLUMNS} | {"sweep": shown, "task": task_of(record), **context(root, record)}
    rows = report_rows(root, base, record, problems)
    metric = rows[0]["metric"] if rows else (record.metric or {}).get("name", "") if record else ""
    return rows + ladder_rows(root, base, str(metric), record)


def sweep_folders(dirs: list[Path]) -> list[Path]:
    """Every folder under ``dirs`` holding a report.csv, but a sweep's tuning runs (``<sweep>/tune``)."""
    found = {p.parent for d in dirs for p in ([d / "report.csv"] if (d / "report.csv").is_file() else [])}
    found |= {p.parent for d in dirs if d.is_dir() for p in d.rglob("report.csv")}
    return sorted(f for f in found if not (f.name == "tune" and (f.parent / "report.csv").is_file()))


def gather(dirs: list[Path]) -> Results:
    """Every comparison under ``dirs``, disagreements flagged; the files that did not read, with why."""
    results = Results()
    for folder in sweep_folders(dirs):
        try:
            results.rows += sweep_rows(folder, str(folder), results.problems)
        except Malformed as error:
            results.problems.append(f"{error}; sweep left out")
    flag_disagreements(results.rows)
    return results


def flag_disagreements(rows: list[dict[str, str]]) -> None:
    """Rows of one comparison (kind, variant, baseline, task, size, budget, metric) whose verdicts differ: each names
    the other sweeps' verdicts in ``disagrees``."""
    same: dict[tuple[str, ...], list[dict[str, str]]] = {}
    for row in rows:
        key = tuple(row[c] for c in ("kind", "variant", "baseline", "task", "size", "budget", "metric"))
        same.setdefault(key, []).append(row)
    for group in same.values():
        verdicts = {r["verdict"] for r in group if r["verdict"] not in NO_VERDICT}
        if len(verdicts) < 2:
            continue
        for row in group:
            others = [f"{r['verdict']} in {r['sweep']}" for r in group
                      if r["verdict"] not in (row["verdict"], *NO_VERDICT)]  # fmt: skip
            row["disagrees"] = "; ".join(others)


def cell(value: str) -> str:
    """A number shown to 4 significant digits (the CSV keeps it whole), anything else as it is."""
    try:
        x = float(value)
    except ValueError:
        return value
    return f"{x:.4g}" if math.isfinite(x) and any(ch in value for ch in ".eE") else value


def markdown(results: Results) -> str:
    """The table in Markdown (numbers to 4 significant digits, ``|`` escaped), then the files left out."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in results.rows:
        lines.append("| " + " | ".join(cell(row[c]).replace("|", "\\|") for c in COLUMNS) + " |")
    flagged = sum(bool(r["disagrees"]) for r in results.rows)
    lines += ["", f"{len(results.rows)} comparisons, {flagged} with verdicts that disagree across sweeps."]
    if results.problems:
        lines += ["", "Left out:"] + [f"- {p}" for p in results.problems]
    return "\n".join(lines) + "\n"


def to_csv(results: Results) -> str:
    """The table as CSV: the same columns and rows, every value as read."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    for row in results.rows:
        writer.writerow([row[c] for c in COLUMNS])
    return out.getvalue()
