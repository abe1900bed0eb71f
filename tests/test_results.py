"""zoo-results: every sweep's comparisons in one table; the same comparison with disagreeing verdicts flagged, every
verdict kept, a malformed file named and skipped, and the Markdown and CSV the same table."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from helpers import fake_run

from zoo.lab.commands.results import main
from zoo.lab.reports.report import write_built
from zoo.lab.reports.results import COLUMNS, cell, gather, markdown, to_csv
from zoo.lab.studies.variants import build_report


def sweep(root: Path, swiglu: float, relu: float, gates: list | None = None) -> Path:
    """A reported sweep of three MLP settings x 3 seeds: gelu at 3.0 (plus the seed's offset), swiglu ``swiglu``
    above it, relu ``relu`` above it, each run's own noise 0.01."""
    noise = [0.0, 0.01, -0.01]
    for seed in range(3):
        for mlp, shift in (("gelu", 0.0), ("swiglu", swiglu), ("relu", relu)):
            value = 3.0 + 0.1 * seed + shift + noise[(seed + len(mlp)) % 3]
            fake_run(root, [f"mlp={mlp}", f"seed={seed}"], value=value, steps=10,
                     job=3 * seed + ["gelu", "swiglu", "relu"].index(mlp))  # fmt: skip
    write_built(build_report(root), plots=False, gates=gates)
    return root


def ladder(root: Path) -> None:
    """A ladder.csv as zoo/lab/reports/ladder.py writes it: mlp=swiglu better than mlp=gelu, multiplier 1.3."""
    from zoo.lab.reports.ladder import COLUMNS as LADDER_COLUMNS

    rows = [{"mlp": "gelu", "verdict": "baseline"},
            {"mlp": "swiglu", "seeds": 5, "verdict": "better", "multiplier": 1.3, "multiplier_ci_low": 1.1,
             "multiplier_ci_high": 1.6}]  # fmt: skip
    with open(root / "ladder.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["mlp", *LADDER_COLUMNS], restval="")
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    """Three sweeps under one folder: two measuring mlp=swiglu against mlp=gelu with verdicts that disagree
    (better; within noise) and mlp=relu alike (worse in both), and one whose report.csv is malformed."""
    top = tmp_path_factory.mktemp("results")
    ladder(sweep(top / "a", swiglu=-0.5, relu=0.5, gates=["better"]))
    sweep(top / "b", swiglu=0.0, relu=0.5)
    broken = sweep(top / "c", swiglu=-0.5, relu=0.5)
    text = (broken / "report.csv").read_text().splitlines()
    (broken / "report.csv").write_text("\n".join([text[0], text[1].replace(",better,", ",better,extra,", 1)]))
    return top


def test_disagreeing_verdicts_of_one_comparison_are_flagged_and_every_verdict_is_kept(folders):
    results = gather([folders])
    rows = {(Path(r["sweep"]).name, r["variant"]): r for r in results.rows if r["kind"] == "report"}
    assert set(rows) == {("a", "mlp=swiglu"), ("a", "mlp=relu"), ("b", "mlp=swiglu"), ("b", "mlp=relu")}
    (ladder_row,) = [r for r in results.rows if r["kind"] == "ladder"]
    assert (ladder_row["variant"], ladder_row["baseline"], ladder_row["verdict"], ladder_row["seeds"]) == (
        "mlp=swiglu", "mlp=gelu", "better", "5")  # fmt: skip
    assert (ladder_row["multiplier"], ladder_row["multiplier_ci_low"], ladder_row["multiplier_ci_high"]) == (
        "1.3", "1.1", "1.6") and not ladder_row["disagrees"]  # fmt: skip
    a, b = rows["a", "mlp=swiglu"], rows["b", "mlp=swiglu"]
    assert (a["verdict"], b["verdict"]) == ("better", "within noise")
    assert a["disagrees"] == f"within noise in {folders / 'b'}" and b["disagrees"] == f"better in {folders / 'a'}"
    assert rows["a", "mlp=relu"]["verdict"] == rows["b", "mlp=relu"]["verdict"] == "worse"  # kept, not flagged
    assert not rows["a", "mlp=relu"]["disagrees"]
    assert a["baseline"] == "mlp=gelu" and a["seeds"] == "3" and a["budget"] == "10 steps" and a["metric"] == "val_bpb"
    assert float(a["ci_low"]) < float(a["difference"]) < float(a["ci_high"]) < 0
    assert a["gates"] == "better pass" and rows["a", "mlp=relu"]["gates"].startswith("better fail (worse on val_bpb")
    assert not b["gates"]  # sweep b named no gates
    assert a["command"] == "" and a["date"]  # a folder with no sweep record or multirun.yaml: no command to show
    assert len(results.problems) == 1 and results.problems[0].startswith(str(folders / "c" / "report.csv"))
    assert "line 2 has" in results.problems[0] and results.problems[0].endswith("sweep left out")


def test_the_markdown_and_the_csv_are_the_same_table(folders):
    results = gather([folders])
    table = list(csv.reader(io.StringIO(to_csv(results))))
    shown = [line.strip("|").split(" | ") for line in markdown(results).splitlines() if line.startswith("| ")]
    assert table[0] == list(COLUMNS) and [c.strip() for c in shown[0]] == list(COLUMNS)
    assert len(shown) == len(table) == len(results.rows) + 1
    for row, line in zip(table[1:], shown[1:], strict=True):
        assert [cell(v) for v in row] == [c.strip() for c in line]


def test_the_command_names_a_malformed_file_exits_1_and_writes_csv_to_out(folders, tmp_path, capsys):
    record = {"command": "zoo-train -m mlp=gelu,swiglu,relu", "zoo_version": "0.1.0", "reported": "2026-01-02"}
    (folders / "a" / "sweep.json").write_text(json.dumps(record))
    (folders / "b" / "gates.json").write_text("{not json")
    try:
        with pytest.raises(SystemExit) as done:
            main([str(folders), "--format", "csv", "--out", str(tmp_path / "results.csv")])
    finally:
        (folders / "a" / "sweep.json").unlink()
        (folders / "b" / "gates.json").unlink()
    assert done.value.code == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"zoo-results: left out: {folders / 'b' / 'gates.json'}: not JSON")
    assert err[0].endswith("its gates left out") and err[1].startswith(f"zoo-results: left out: {folders / 'c'}")
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    a = next(r for r in rows if r["sweep"].endswith("a") and r["variant"] == "mlp=swiglu")
    assert (a["command"], a["zoo_version"], a["date"]) == ("zoo-train -m mlp=gelu,swiglu,relu", "0.1.0", "2026-01-02")
    assert {r["gates"] for r in rows if r["sweep"].endswith("b")} == {"gates.json not read"}


def test_a_sweeps_target_verdict_is_its_rows_target_cell(tmp_path):
    root = tmp_path / "t"
    sweep(root, swiglu=-0.5, relu=0.5)
    for summary in root.glob("*/summary.json"):  # each run's curve: 0.5 above its final value at step 5
        final = json.loads(summary.read_text())["final"]["val_bpb"]
        curve = [{"kind": "val", "step": s, "tokens": 100 * s, "val_bpb": final + 0.1 * (10 - s)} for s in (5, 10)]
        (summary.parent / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve))
    target = {"target": 3.2, "margin": 0.0, "target_ema": 0.0}  # the final values: swiglu's under it, relu's over
    write_built(build_report(root, target=target), plots=False)
    cells = {row["variant"]: row["target"] for row in gather([root]).rows}
    assert cells["mlp=relu"] == "fail: 0/3 reached 3.2", cells  # never reached: every final value above it
    assert cells["mlp=swiglu"].startswith("pass: 3/3 reached 3.2, ") and cells["mlp=swiglu"].endswith(" steps"), cells


def test_a_named_sweeps_rows_and_gates_read_by_the_variants_names(tmp_path):
    folders = {}
    for seed in range(3):
        for name, change, shift in (("base", [], 0.0), ("-gate", ["block.attn.gate=none"], 0.3)):
            overrides = [f"variant={name}", f"seed={seed}", *change]
            fake_run(tmp_path, overrides, value=3.0 + shift + 0.01 * seed, steps=10)
            folders[",".join(overrides)] = name
    (tmp_path / "variants.json").write_text(json.dumps({"variants": {"base": [], "-gate": ["block.attn.gate=none"]},
                                                        "folders": folders}))  # fmt: skip
    write_built(build_report(tmp_path), plots=False, gates=["better"])
    (row,) = gather([tmp_path]).rows
    assert (row["variant"], row["baseline"], row["verdict"]) == ("-gate", "base", "worse")
    assert row["gates"].startswith("better fail"), row["gates"]
