"""The sweep report from run folders: grouping by swept keys, mean ± std over seeds, order, files."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest
from matplotlib.image import imread

from zoo.lab.records import write_json_atomic
from zoo.lab.report import markdown, report_main, write_report
from zoo.lab.variants import build_report


def fake_run(root: Path, overrides: list[str], status: str = "ok", value: float | None = None, **extra) -> None:
    """A run folder as zoo-train leaves it: summary.json and metrics.jsonl."""
    folder = root / ",".join(overrides)
    metric = extra.pop("metric", {"name": "val_bpb", "mode": "min"})
    summary = {
        "status": status,
        "error": "ConfigError: block.n_heads=5: must divide d_model=32" if status == "failed" else None,
        "overrides": overrides,
        "choices": {},
        "config": {"seed": int(dict(o.split("=") for o in overrides).get("seed", 0))},
        "parameters": {"total": 1000},
        "metric": {**metric, "value": value},
        "final": {} if value is None else {metric["name"]: value, "val_loss": value * 0.69},
        "tokens_per_s": 5000.0,
        "wall_time_s": 10.0,
        **extra,
    }
    write_json_atomic(folder / "summary.json", summary)
    steps = [{"kind": "train", "step": s, "tokens": 100 * s, "loss": 5.0 - s / 10} for s in (1, 5, 10)]
    steps += [{"kind": "val", "step": s, "tokens": 100 * s, "val_loss": 4.5 - s / 10} for s in (5, 10)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))


def sweep(root: Path) -> None:
    for seed, (a, b, c) in enumerate([(3.0, 2.5, 2.8), (3.2, 2.7, 2.9)]):
        fake_run(root, ["norm=layernorm", f"seed={seed}", "train.steps=10"], value=a)
        fake_run(root, ["norm=rmsnorm", f"seed={seed}", "train.steps=10"], value=b)
        fake_run(root, ["norm=dyt", f"seed={seed}", "train.steps=10"], value=c)
    fake_run(root, ["norm=broken", "seed=0", "train.steps=10"], status="failed")
    fake_run(root, ["norm=broken", "seed=1", "train.steps=10"], status="diverged", reason="loss nan at step 4")


def test_variants_grouped_over_seeds_sorted_best_first(tmp_path):
    sweep(tmp_path)
    report = build_report(tmp_path)
    assert report.axes == ["norm"]  # train.steps is the same everywhere; seeds are averaged over
    assert [v.key for v in report.variants] == [("rmsnorm",), ("dyt",), ("layernorm",), ("broken",)]
    mean, std = report.variants[0].mean_std("val_bpb")
    assert mean == pytest.approx(2.6) and std == pytest.approx(statistics.stdev([2.5, 2.7]))
    broken = report.variants[-1]
    assert broken.status == "1 failed, 1 diverged" and broken.mean_std("val_bpb") == (None, None)


def test_markdown_table_says_who_won_and_by_how_much(tmp_path):
    sweep(tmp_path)
    text = markdown(build_report(tmp_path))
    lines = text.splitlines()
    assert "8 runs, 4 variants, sorted by val_bpb (lower is better)" in lines[0]
    assert lines[2] == "| # | norm | seeds | params | val_bpb (mean ± std) | vs best | tokens/s | wall s | status |"
    assert lines[4].startswith("| 1 | rmsnorm | 2 | 1,000 | 2.6000 ± 0.1414 | best | 5,000 | 10.0 | ok |")
    assert lines[5].startswith("| 2 | dyt | 2 | 1,000 | 2.8500 ± 0.0707 | +0.2500 |")
    assert lines[7].endswith("| 1 failed, 1 diverged |")
    assert "- norm=broken: failed: ConfigError: block.n_heads=5" in text
    assert "- norm=broken: diverged: loss nan at step 4" in text


def test_higher_is_better_metrics_sort_descending(tmp_path):
    accuracy = {"name": "val_accuracy", "mode": "max"}
    fake_run(tmp_path, ["attn=mha"], value=0.5, metric=accuracy)
    fake_run(tmp_path, ["attn=mqa"], value=0.9, metric=accuracy)
    report = build_report(tmp_path)
    assert [v.key for v in report.variants] == [("mqa",), ("mha",)]
    assert "(higher is better)" in markdown(report)


def test_higher_is_better_ranks_every_output_best_first(tmp_path):
    """Accuracy over three variants and two seeds: the table, its deltas and report.csv all put the
    highest mean first and the lowest last, a failed variant after them."""
    accuracy = {"name": "val_accuracy", "mode": "max"}
    for seed, values in enumerate([(0.50, 0.90, 0.70), (0.52, 0.94, 0.72)]):
        for attn, value in zip(("mha", "mqa", "gqa"), values, strict=True):
            fake_run(tmp_path, [f"attn={attn}", f"seed={seed}"], value=value, metric=accuracy)
    fake_run(tmp_path, ["attn=broken", "seed=0"], status="failed", metric=accuracy)
    text = write_report(tmp_path, plots=False)
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[1] for row in rows] == ["mqa", "gqa", "mha", "broken"]
    assert " | 0.9200 ± 0.0283 | best |" in rows[0]
    assert " | -0.2100 |" in rows[1] and " | -0.4100 |" in rows[2]  # worse is below the best
    with open(tmp_path / "report.csv") as f:
        assert [r["attn"] for r in csv.DictReader(f)] == ["mqa", "gqa", "mha", "broken"]


def test_files_beside_the_runs(tmp_path, capsys):
    sweep(tmp_path)
    report_main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "| 1 | rmsnorm |" in out and "curves.png" in out
    assert (tmp_path / "report.md").read_text() in out
    with open(tmp_path / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["norm"] for r in rows] == ["rmsnorm", "dyt", "layernorm", "broken"]
    assert float(rows[0]["val_bpb_mean"]) == pytest.approx(2.6) and rows[0]["ok"] == "2"
    assert float(rows[0]["val_loss_mean"]) == pytest.approx(2.6 * 0.69)
    with open(tmp_path / "runs.csv") as f:
        assert len(list(csv.DictReader(f))) == 8
    for png in ("curves.png", "final.png"):
        image = imread(tmp_path / png)
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 400


def test_many_variants_still_plot(tmp_path):
    for i in range(14):
        fake_run(tmp_path, [f"block.d_ff={16 * (i + 1)}"], value=3.0 - i / 100)
    write_report(tmp_path)
    assert imread(tmp_path / "final.png").shape[0] > imread(tmp_path / "curves.png").shape[0]  # one row each


def test_empty_folder_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        report_main([str(tmp_path)])
    assert exit_.value.code == 1 and "no summary.json under" in capsys.readouterr().err
