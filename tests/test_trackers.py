"""Experiment trackers: what a run logged, read back with each library's own reader."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest
import yaml
from helpers import tiny

from zoo.assembly.compose import CONF_DIR
from zoo.core.errors import ConfigError
from zoo.core.options import option_defaults
from zoo.core.registry import BUILT_IN
from zoo.lab.records.metrics import read_metrics
from zoo.lab.records.trackers import TRACKERS, Tracker, check_logger, log_report
from zoo.lab.training.run import run

matplotlib.use("Agg")


def train_logged(tmp_path, logger: str) -> tuple[dict, list[dict]]:
    """A tiny run with ``logger``; its summary and its metrics.jsonl records."""
    cfg = tiny(f"logger={logger}", "train.log_every=2", "train.eval_every=6", "train.probe_every=6")
    summary = run(cfg, tmp_path / "run", choices={"attn": "mha", "task": "bytes"})  # as zoo-train passes them
    assert summary["status"] == "ok", summary.get("error")
    return summary, read_metrics(tmp_path / "run")


def series(records: list[dict], kind: str, key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in records if r["kind"] == kind]


def report_plots(folder) -> None:
    """Stand-ins for the report's curves.png and final.png (a sweep's end writes the real ones)."""
    from matplotlib import pyplot as plt

    for name in ("curves", "final"):
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.plot([0, 1], [1, 0])
        fig.savefig(folder / f"{name}.png")
        plt.close(fig)


def test_tensorboard_scalars_hparams_and_report_images(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    summary, records = train_logged(tmp_path, "tensorboard")
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard" / "run"), size_guidance={"scalars": 0})
    events.Reload()
    for tag, kind, key in (("train_loss", "train", "loss"), ("val_bpb", "val", "val_bpb")):
        steps, values = zip(*series(records, kind, key), strict=True)
        assert tuple(e.step for e in events.Scalars(tag)) == steps
        assert [e.value for e in events.Scalars(tag)] == pytest.approx(values, rel=1e-6)  # float32 in event files
    probes = [r for r in records if r["kind"] == "probe"]  # numbers in lists and mappings, each its own scalar
    for tag, value in (
        ("probe/attn_logit_max/1", lambda r: r["attn_logit_max"][1]),
        ("probe/grad_norm/total", lambda r: r["grad_norm"]["total"]),
        ("probe/log_z", lambda r: r["log_z"]),
    ):
        assert [(e.step, e.value) for e in events.Scalars(tag)] == [
            (r["step"], pytest.approx(value(r), rel=1e-6)) for r in probes
        ]
    assert len(probes) == 2 and events.Scalars("final/val_bpb")[0].value == pytest.approx(summary["final"]["val_bpb"])
    start = [
        plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
        for content in events.PluginTagToContent("hparams").values()
        if plugin_data_pb2.HParamsPluginData.FromString(content).HasField("session_start_info")
    ][0]
    assert start.hparams["block.d_model"].number_value == 32 and start.hparams["choice.task"].string_value == "bytes"

    report_plots(tmp_path)
    log_report(check_logger({"name": "tensorboard"}), tmp_path)
    images = EventAccumulator(str(tmp_path / "tensorboard" / "report"), size_guidance={"images": 0})
    images.Reload()
    assert set(images.Tags()["images"]) == {"report/curves", "report/final"}


def test_mlflow_params_metric_history_finals_and_report_artifacts(tmp_path):
    pytest.importorskip("mlflow")
    import mlflow

    summary, records = train_logged(tmp_path, "mlflow")
    client = mlflow.MlflowClient((tmp_path / "run" / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("run")
    [logged] = client.search_runs([experiment.experiment_id])
    assert logged.info.status == "FINISHED" and logged.data.tags["zoo.status"] == "ok"
    assert logged.data.params["choice.attn"] == "mha" and logged.data.params["train.steps"] == "12"
    history = client.get_metric_history(logged.info.run_id, "train_loss")
    assert [(m.step, m.value) for m in history] == series(records, "train", "loss")
    assert logged.data.metrics["final/val_bpb"] == summary["final"]["val_bpb"]

    report_plots(tmp_path / "run")
    log_report(check_logger({"name": "mlflow"}), tmp_path / "run")
    [report] = client.search_runs([experiment.experiment_id], filter_string="attributes.run_name = 'report'")
    assert {a.path for a in client.list_artifacts(report.info.run_id)} >= {"curves.png", "final.png"}


def test_wandb_offline_history_config_and_summary(tmp_path):
    pytest.importorskip("wandb")
    summary, records = train_logged(tmp_path, "wandb")
    [folder] = (tmp_path / "run" / "wandb").glob("offline-run-*")  # offline: nothing left this machine
    wandb = [sys.executable, "-m", "wandb", "leet", "inspect"]  # wandb's reader of its transaction log
    done = subprocess.run([*wandb, "--json", str(folder)], capture_output=True, text=True, timeout=120)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    history = [line["history"]["item"] for line in lines if line["type"] == "history"]
    assert [(h["_step"], h["train_loss"]) for h in history if "train_loss" in h] == series(records, "train", "loss")
    assert [(h["_step"], h["val_bpb"]) for h in history if "val_bpb" in h] == series(records, "val", "val_bpb")
    [config] = [line["run"]["config"]["update"] for line in lines if line["type"] == "run"]
    assert config["choice.attn"] == "mha" and config["block.d_model"] == 32
    done = subprocess.run([*wandb, "--summary", "--json", str(folder)], capture_output=True, text=True, timeout=120)
    run_summary = json.loads(done.stdout)
    assert run_summary["state"] == "finished" and run_summary["summary"]["status"] == "ok"
    assert run_summary["summary"]["final/val_bpb"] == summary["final"]["val_bpb"]

    report_plots(tmp_path / "run")
    log_report(check_logger({"name": "wandb"}), tmp_path / "run")
    [report] = set((tmp_path / "run" / "wandb").glob("offline-run-*")) - {folder}
    done = subprocess.run([*wandb, "--json", str(report)], capture_output=True, text=True, timeout=120)
    logged = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    images = [line["history"]["item"] for line in logged if line["type"] == "history"]
    assert images[0]["report/curves._type"] == images[0]["report/final._type"] == "image-file"


def test_a_tracker_not_installed_fails_before_training(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    summary = run(tiny("logger=wandb"), tmp_path)
    assert summary["status"] == "failed"
    assert summary["error"] == "ConfigError: logger='wandb': needs the wandb package: pip install -e \".[trackers]\""
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing trained


@pytest.fixture
def recorder():
    """A tracker registered here, as a plugin or a notebook would: it keeps what it is sent."""
    sent: dict[str, list] = {"opened": [], "records": [], "finished": [], "report": []}

    @TRACKERS.register("recorder")
    class Recorder(Tracker):
        """Keeps everything it is sent, in memory."""

        def __init__(self, root: Path, *, tag: str = "untagged") -> None:
            super().__init__(root)
            self.tag = tag

        def start(self, name: str, summary: dict) -> None:
            sent["opened"].append((self.root, name, self.tag, summary["status"]))

        def log(self, record: dict) -> None:
            sent["records"].append(dict(record))

        def finish(self, summary: dict) -> None:
            sent["finished"].append(summary["status"])

        def log_report(self, plots: list[Path]) -> None:
            sent["report"].append((self.root, self.tag, [p.name for p in plots]))

    yield sent
    TRACKERS.unregister("recorder")


def test_a_tracker_registered_outside_zoo_gets_the_runs_records_and_the_report(tmp_path, recorder):
    cfg = {
        **tiny("train.log_every=2", "train.eval_every=6", "train.probe_every=4"),
        "logger": {"name": "recorder", "tag": "t1"},
    }
    summary = run(cfg, tmp_path / "run")
    assert summary["status"] == "ok", summary.get("error")
    assert recorder["opened"] == [(tmp_path / "run", "run", "t1", "running")]
    assert recorder["records"] == read_metrics(tmp_path / "run") and len(recorder["records"]) > 4
    assert [r["step"] for r in recorder["records"] if r["kind"] == "probe"] == [4, 8, 12]  # the probes too
    assert recorder["finished"] == ["ok"]
    report_plots(tmp_path)
    log_report(check_logger({"name": "recorder"}), tmp_path)
    assert recorder["report"] == [(tmp_path, "untagged", ["curves.png", "final.png"])]
    with pytest.raises(ConfigError, match=r"logger.tga='x': not an option of logger 'recorder'; options: tag$"):
        check_logger({"name": "recorder", "tga": "x"})


def test_an_unknown_logger_names_the_key_the_value_and_the_trackers():
    with pytest.raises(ConfigError) as error:
        check_logger({"name": "tensorbord"})
    assert str(error.value) == (
        "logger='tensorbord': unknown logger; did you mean 'tensorboard'? registered: none, tensorboard, mlflow, wandb"
    )
    with pytest.raises(ConfigError, match=r"^logger.dir='x': not an option of logger 'none'; options: none$"):
        check_logger({"name": "none", "dir": "x"})
    with pytest.raises(ConfigError, match=r"^logger.project=3: "):
        check_logger({"name": "wandb", "project": 3})
    assert check_logger(None) == {"name": "none"}
    assert check_logger({"name": "wandb", "mode": "online"}) == {
        "name": "wandb",
        "mode": "online",
        "project": "zoo",
        "entity": None,
        "dir": None,
    }


def test_every_tracker_has_an_option_file_listing_its_options_and_defaults():
    files = {path.stem: path for path in sorted((CONF_DIR / "logger").glob("*.yaml"))}
    assert set(files) == {t.name for t in TRACKERS.parts() if t.origin == BUILT_IN}
    for name, path in files.items():
        assert path.read_text().startswith("# @package logger\n")
        node = yaml.safe_load(path.read_text())
        assert node.pop("name") == name
        assert node == option_defaults(TRACKERS.get(name)), name


def test_the_adding_a_tracker_example_in_the_docs_tracks_a_run_and_the_report(tmp_path):
    import re

    text = (Path(__file__).resolve().parent.parent / "docs" / "runs.md").read_text()
    [code] = [b for b in re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE) if "jsonl" in b]
    [option_file] = re.findall(r"^```yaml\n(# @package logger\n.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    if "jsonl" in TRACKERS:  # tests/test_docs.py runs the page's examples too
        TRACKERS.unregister("jsonl")
    try:
        exec(compile(code, "docs/runs.md", "exec"), {})
        options = yaml.safe_load(option_file)
        assert option_defaults(TRACKERS.get("jsonl")) == {k: v for k, v in options.items() if k != "name"}
        summary = run({**tiny(), "logger": options}, tmp_path / "run")
        assert summary["status"] == "ok", summary.get("error")
        lines = (tmp_path / "run" / "jsonl" / "run.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == [*read_metrics(tmp_path / "run"), {"status": "ok"}]
        report_plots(tmp_path / "run")
        log_report(check_logger(options), tmp_path / "run")
        plots = json.loads((tmp_path / "run" / "jsonl" / "report.jsonl").read_text())["plots"]
        assert [Path(p).name for p in plots] == ["curves.png", "final.png"]
    finally:
        if "jsonl" in TRACKERS:
            TRACKERS.unregister("jsonl")
