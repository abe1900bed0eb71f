"""summary.json as a typed record (zoo.lab.records.summary.RunRecord): its schema version, the fields it
checks, the fields it does not know kept, and summaries written before the schema field still read,
report and resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import interrupt, tiny

from zoo.lab.cores import usable_cores
from zoo.lab.records.summary import SCHEMA, SUMMARY, RecordError, RunRecord, read_record, read_record_checked
from zoo.lab.reports.report import write_report
from zoo.lab.training.run import run

#: The keys of an ok run's summary.json, in the order the dict-built summary wrote them (schema 1), with
#: ``schema`` first.
OK_KEYS = [
    "schema", "status", "error", "run_dir", "choices", "overrides", "started", "versions", "config", "config_hash",
    "unused_axes", "parameters", "active_parameters", "flops_per_token", "data", "device", "threads", "world_size",
    "metric", "resumed_from", "steps", "tokens", "train_time_s", "tokens_per_s", "load", "final", "reason", "initial",
    "spikes", "flops", "flops_per_second", "mfu", "mfu_reason", "parallel", "peak_memory_mib", "kind", "wall_time_s",
    "finished",
]  # fmt: skip

#: A summary as zoo-train wrote it before the schema field (a failed run: no loop result, so no ``reason``).
SCHEMA_1 = {
    "status": "failed",
    "error": "ConfigError: block.n_heads=5: must divide d_model=32",
    "run_dir": "runs/quick/seed=0",
    "choices": {"norm": "rmsnorm"},
    "overrides": ["seed=0"],
    "started": "2026-11-30T07:28:19+00:00",
    "versions": {"python": "3.11.7", "zoo": "0.1.0"},
    "job": 0,
    "config": {"seed": 0, "train": {"steps": 12}},
    "config_hash": "0123456789abcdef",
    "unused_axes": [],
    "wall_time_s": 0.25,
    "finished": "2026-11-30T07:28:20+00:00",
}


def as_schema_1(folder: Path) -> None:
    """Rewrite the run's summary.json as it was written before the schema field."""
    data = json.loads((folder / SUMMARY).read_text())
    assert data.pop("schema") == SCHEMA
    (folder / SUMMARY).write_text(json.dumps(data, indent=2) + "\n")


def test_a_schema_1_summary_reads_with_its_fields_and_writes_back_the_same_keys():
    record = RunRecord.from_json(SCHEMA_1)
    assert record.schema == 1 and record.status == "failed" and record.job == 0 and record.extra == {}
    assert record.config_value("train.steps") == 12 and record.config_value("train.lr") is None
    assert record.steps is None and record.final is None and record.final_value("val_bpb") is None
    assert record.to_json() == {"schema": SCHEMA, **SCHEMA_1} and list(record.to_json())[1:] == list(SCHEMA_1)


def test_fields_it_does_not_know_survive_a_read_and_write(tmp_path):
    newer = {"schema": SCHEMA + 1, **SCHEMA_1, "energy_j": 12.5, "hardware": {"gpu": "h200"}}
    (tmp_path / SUMMARY).write_text(json.dumps(newer))
    record = read_record(tmp_path)
    assert record is not None and record.extra == {"energy_j": 12.5, "hardware": {"gpu": "h200"}}
    assert record.value("energy_j") == 12.5 and record.value("wall_time_s") == 0.25
    assert record.to_json() == newer  # a newer writer's schema and fields, as they were


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"status": None}, "status=None: not a string"),
        ({"steps": "12"}, "steps: a str, not an integer"),
        ({"steps": True}, "steps: a bool, not an integer"),
        ({"wall_time_s": "1.5"}, "wall_time_s: a str, not a number"),
        ({"config": []}, "config: a list, not a JSON object"),
        ({"resumed_from": {"3": 3}}, "resumed_from: a dict, not a list"),
        ({"overrides": ["seed=0", 1]}, "overrides: not a list of strings"),
        ({"resumed_from": [3, "6"]}, "resumed_from: not a list of integers"),
        ({"ranks_in_sync": "yes"}, "ranks_in_sync: a str, not true or false"),
        ({"final": {"val_bpb": "3.1"}}, "final.val_bpb='3.1': not a number"),
        ({"metric": {"name": 3}}, "metric.name: not a string"),
        ({"schema": "2"}, "schema='2': not an integer"),
    ],
)
def test_a_field_not_of_its_type_is_named(tmp_path, change, problem):
    with pytest.raises(RecordError, match=f"^{problem}$".replace("[", r"\[").replace("(", r"\(")):
        RunRecord.from_json({**SCHEMA_1, **change})
    (tmp_path / SUMMARY).write_text(json.dumps({**SCHEMA_1, **change}))
    assert read_record_checked(tmp_path) == (None, f"summary.json: {problem}")
    assert read_record(tmp_path) is None


def test_a_written_summary_has_its_schema_and_the_keys_it_had(tmp_path):
    summary = run(tiny(), tmp_path)
    written = json.loads((tmp_path / SUMMARY).read_text())
    assert written == summary and written["schema"] == SCHEMA == 3
    assert list(written) == OK_KEYS and written["error"] is None and written["reason"] is None
    record = read_record(tmp_path)
    assert record is not None and record.schema == SCHEMA and record.to_json() == written


def test_a_run_records_the_machines_load_and_its_cores_beside_its_time(tmp_path):
    """What shared the machine while the loop ran: its load average at the loop's start and end, the cores
    the process had and the machine's (the ladder's wall-time reading says when other work shared them)."""
    load = run(tiny(), tmp_path)["load"]
    assert set(load) == {"start", "end", "cores", "machine_cores"}
    assert load["start"] >= 0 and load["end"] >= 0 and load["machine_cores"] == os.cpu_count()
    assert 1 <= load["cores"] == usable_cores() <= load["machine_cores"]


def test_a_schema_1_sweep_reports_the_same_and_a_rerun_skips_its_runs(tmp_path):
    root = tmp_path / "sweep"
    for norm in ("layernorm", "rmsnorm"):
        for seed in (0, 1):
            overrides = [f"norm={norm}", f"seed={seed}"]
            done = run(tiny(*overrides), root / ",".join(overrides), overrides=overrides)
            assert done["status"] == "ok", done["error"]
    write_report(root, plots=False)
    files = ("report.md", "report.csv", "runs.csv")
    new = {name: (root / name).read_text() for name in files}
    for folder in root.iterdir():
        if folder.is_dir():
            as_schema_1(folder)
    write_report(root, plots=False)
    assert {name: (root / name).read_text() for name in files} == new  # to the last digit
    folder = root / "norm=rmsnorm,seed=1"
    stamp = (folder / "metrics.jsonl").stat().st_mtime_ns
    again = run(tiny("norm=rmsnorm", "seed=1"), folder, overrides=["norm=rmsnorm", "seed=1"])
    assert again["status"] == "ok" and (folder / "metrics.jsonl").stat().st_mtime_ns == stamp  # skipped: done
    assert "schema" not in json.loads((folder / SUMMARY).read_text())  # left as it was


def test_a_schema_1_run_killed_mid_training_resumes(tmp_path):
    resumable = ("train.checkpoint_every=3", "train.keep_checkpoints=10")
    whole = run(tiny(*resumable), tmp_path / "whole")
    interrupt(tmp_path / "whole", tmp_path / "killed", 6)
    as_schema_1(tmp_path / "killed")
    resumed = run(tiny(*resumable), tmp_path / "killed")
    assert resumed["status"] == "ok" and resumed["resumed_from"] == [6] and resumed["final"] == whole["final"]
    assert json.loads((tmp_path / "killed" / SUMMARY).read_text())["schema"] == SCHEMA
