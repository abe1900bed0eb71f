"""Held-out validation sources (zoo.lab.data.heldout, ``task.heldout``): text every install holds, never the
training text's files, each its own metric and their macro average, usable as the headline."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest
from helpers import tiny

from zoo.core.errors import ConfigError
from zoo.lab.data.heldout import SOURCES, read_heldout, torch_dir
from zoo.lab.records.config import config_hash
from zoo.lab.records.metrics import read_metrics
from zoo.lab.reports.report import write_report
from zoo.lab.tasks import build_task
from zoo.lab.tasks.text import read_corpus
from zoo.lab.training.run import run

HELDOUT = ["task.heldout=[cpp,docs]", "task.metric=val_bpb_macro"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Two variants, one seed, validated on two held-out sources with their macro average as the headline."""
    root = tmp_path_factory.mktemp("heldout")
    for norm in ("layernorm", "rmsnorm"):
        overrides = [f"norm={norm}", "seed=0"]
        done = run(tiny(*HELDOUT, *overrides), root / ",".join(overrides), overrides=overrides)
        assert done["status"] == "ok", done["error"]
    return root


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_each_source_is_text_none_of_whose_files_the_default_training_text_holds(name):
    corpus = read_corpus(None, None, 4_000_000)
    text = read_heldout(name, corpus.hashes)
    assert text.files >= 1 and len(text.data) > 10_000 and b"\0" not in text.data
    assert text.data not in corpus.data and text.data[:2000] not in corpus.data


def test_a_held_out_file_the_training_text_also_holds_is_left_out(tmp_path):
    """Training on a folder holding a copy of a held-out header: the held-out source reads without it."""
    root, files, read = SOURCES["cpp"]()
    taken = read_heldout("cpp").data
    header = next(rel for rel in sorted(files) if (data := read(root / rel)) and len(data) > 500 and data in taken)
    (tmp_path / "copy.h").write_bytes(read(root / header))
    corpus = read_corpus(str(tmp_path), None, 10**6)
    assert read(root / header) not in read_heldout("cpp", corpus.hashes).data


@pytest.mark.parametrize(
    ("value", "shown"),
    [(["cpp", "latin"], "['cpp', 'latin']"), (["docs", "docs"], "['docs', 'docs']"), ("cpp", "'cpp'")],
)
def test_a_bad_source_list_is_refused_naming_the_key(value, shown):
    with pytest.raises(ConfigError, match=r"task\.heldout=" + shown.replace("[", r"\[").replace("]", r"\]")):
        build_task({"name": "bytes", "max_bytes": 20_000, "seq_len": 16, "heldout": value})


def test_no_held_out_sources_hash_as_a_config_from_before_the_key():
    config = tiny()
    assert config["task"]["heldout"] == []
    before = {**config, "task": {k: v for k, v in config["task"].items() if k != "heldout"}}
    assert config_hash(config) == config_hash(before) != config_hash(tiny("task.heldout=[cpp]"))


def test_each_source_is_its_own_metric_and_macro_their_mean_in_every_record(sweep):
    folder = sweep / "norm=rmsnorm,seed=0"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["metric"]["name"] == "val_bpb_macro"
    assert set(summary["data"]["heldout"]) == {"cpp", "docs"}
    assert summary["data"]["heldout"]["cpp"]["source"] == str(torch_dir() / "include")
    evaluations = [r for r in read_metrics(folder) if r["kind"] == "val"]
    assert [r["step"] for r in evaluations] == [0, 6, 12]
    for record in [*evaluations, summary["final"]]:
        for base in ("bpb", "loss"):
            sources = [record[f"val_{base}_{source}"] for source in ("cpp", "docs")]
            assert record[f"val_{base}_macro"] == pytest.approx(statistics.fmean(sources), rel=1e-12)
        assert record["val_bpb_cpp"] != record["val_bpb_docs"] != record["val_bpb"]
    assert summary["metric"]["value"] == summary["final"]["val_bpb_macro"]


def test_the_report_compares_variants_on_the_macro_average(sweep):
    write_report(sweep, plots=False)
    rows = list(csv.DictReader((sweep / "report.csv").open()))
    assert {row["metric"] for row in rows} == {"val_bpb_macro"}
    finals = {json.loads((sweep / f"norm={n},seed=0" / "summary.json").read_text())["final"]["val_bpb_macro"]
              for n in ("layernorm", "rmsnorm")}  # fmt: skip
    assert {float(row["val_bpb_macro_mean"]) for row in rows} == finals
