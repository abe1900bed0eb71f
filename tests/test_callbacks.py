"""The loop's callbacks: the hooks in their order, the built-in ones doing what the loop did before,
a plugin callback as docs/runs.md documents it, and ``callbacks`` checked before any tensor work."""

from __future__ import annotations

import re

import pytest
from helpers import ROOT, tiny

from zoo.lab.records.metrics import read_metrics
from zoo.lab.training.callbacks import CALLBACKS, HOOKS, Callback
from zoo.lab.training.run import run


@pytest.fixture
def registered():
    """Register callbacks for one test, removing them after."""
    names = []

    def register(name, cls):
        CALLBACKS.register(name)(cls)
        names.append(name)
        return cls

    yield register
    for name in names:
        CALLBACKS.unregister(name)


def test_the_hooks_run_in_the_order_of_a_run(tmp_path, registered):
    seen = []

    class Recorder(Callback):
        """Every hook it sees, in order."""

        def on_run_start(self, loop, first):
            seen.append(("run_start", first))

        def on_backward_end(self, loop, step):
            seen.append(("backward_end", step))

        def on_step_end(self, loop, step):
            seen.append(("step_end", step))

        def on_record(self, record):
            seen.append((record["kind"], record["step"]))

        def on_evaluation_end(self, loop, metrics):
            seen.append(("evaluation_end", "val_loss" in metrics))

        def on_checkpoint(self, state):
            seen.append(("checkpoint", state.step))

        def on_run_end(self, loop, result):
            seen.append(("run_end", result.steps))

    registered("recorder", Recorder)
    summary = run(tiny("callbacks=[recorder]", "train.checkpoint_every=5", "train.steps=8"), tmp_path)
    assert summary["status"] == "ok", summary.get("error")
    assert seen[:3] == [("run_start", 1), ("val", 0), ("evaluation_end", True)]
    assert seen[3:7] == [("backward_end", 1), ("train", 1), ("step_end", 1), ("backward_end", 2)]
    assert seen.index(("checkpoint", 5)) == seen.index(("step_end", 5)) - 1  # the step's hooks, in order
    assert [s for s in seen if s[0] == "step_end"] == [("step_end", s) for s in range(1, 9)]
    assert seen[-5:] == [("train", 8), ("val", 8), ("evaluation_end", True), ("step_end", 8), ("run_end", 8)]
    assert ("checkpoint", 8) not in seen  # the last step is kept as the final weights
    written = [(r["kind"], r["step"]) for r in read_metrics(tmp_path)]
    assert written == [s for s in seen if s[0] in ("train", "val")]  # every record reached metrics.jsonl


def test_the_documented_plugin_callback_records_and_leaves_the_hash_alone(tmp_path):
    page = (ROOT / "docs" / "runs.md").read_text()
    section = page.split("### Adding a callback", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/runs.md", "exec"), namespace)
    try:
        config = tiny("callbacks=[{weight_rms:{every:4}}]")
        summary = run(config, tmp_path)
        assert summary["status"] == "ok", summary.get("error")
        records = [r for r in read_metrics(tmp_path) if r["kind"] == "weight_rms"]
        assert [r["step"] for r in records] == [4, 8, 12]
        assert all(0 < r["weight_rms"] < 1 for r in records)
        assert len({r["weight_rms"] for r in records}) == 3  # the weights moved between them
        written = (tmp_path / "metrics.jsonl").read_bytes()
        rerun = run(tiny(), tmp_path)  # the same run without it: done, not trained again
        assert rerun["status"] == "ok" and (tmp_path / "metrics.jsonl").read_bytes() == written
        assert rerun["config_hash"] == summary["config_hash"]  # a runtime key, as the docs say
    finally:
        CALLBACKS.unregister("weight_rms")


@pytest.mark.parametrize(
    ("entry", "field", "says"),
    [
        ("[recordr]", "callbacks", "did you mean 'recorder'?"),
        ("[probes]", "callbacks", "built in"),
        ("[{recorder:{evry:2}}]", "callbacks.recorder.evry", "options of recorder: every"),
        ("[3]", "callbacks", "a list of callback names"),
    ],
)
def test_a_bad_callbacks_entry_is_refused_before_any_tensor_work(tmp_path, monkeypatch, registered, entry, field,
                                                                 says):  # fmt: skip
    class Recorder(Callback):
        """Does nothing."""

        def __init__(self, every: int = 1) -> None:
            self.every = every

    registered("recorder", Recorder)
    monkeypatch.setattr("zoo.lab.planning.run_model.RunModel.build", lambda *a: pytest.fail("built a model"))
    summary = run(tiny(f"callbacks={entry}"), tmp_path)
    assert summary["status"] == "failed" and f"{field}=" in summary["error"] and says in summary["error"]


def test_the_loop_names_none_of_its_callbacks():
    """trainer.py calls hooks; the records, the bar, probes, spikes and checkpoint writing live in callbacks."""
    source = (ROOT / "zoo" / "lab" / "training" / "trainer.py").read_text()
    code = "\n".join(line.split("#")[0] for line in source.splitlines() if not line.lstrip().startswith(('"', "#")))
    for word in ("tqdm", "Probes", "probe_every", "spikes", "checkpoint_every", "MetricsLog", "Tracker", "writer"):
        assert not re.search(rf"\b{word}\b", code), word
    assert set(HOOKS) == {name for name in dir(Callback) if name.startswith("on_")}


def test_zoo_parts_lists_the_callbacks(capsys):
    from zoo.lab.commands.parts import parts_main

    parts_main([])
    out = capsys.readouterr().out
    listed = out.split("callback:", 1)[1]
    for name in ("records", "progress", "probes", "spikes", "checkpoints"):
        assert re.search(rf"^  {name}\b", listed, re.M), name


def test_a_refused_callbacks_name_is_offered_only_names_callbacks_takes(registered):
    """The did-you-mean and the list name only callbacks ``callbacks`` accepts (each offered name is then taken);
    the built-in ones are listed apart, each with the key that turns it on."""
    from zoo.core.errors import ConfigError
    from zoo.lab.training.loop_callbacks import check_callbacks

    class Recorder(Callback):
        """Does nothing."""

    registered("recorder", Recorder)
    built_in = [part for part in CALLBACKS.parts() if part.cls.always]
    for name in ("progres", "progress", "spikes", "recordr", "nosuch"):
        with pytest.raises(ConfigError) as refused:
            check_callbacks([name])
        text = str(refused.value)
        offered = re.findall(r"did you mean '(\w+)'", text) + text.split("to name here: ")[1].split(";")[0].split(", ")
        assert offered and all(check_callbacks([n]) == [(n, {})] for n in offered), text
        listed = text.split("built in, each on by its own key: ")[1]
        assert listed == ", ".join(f"{p.name} ({p.cls.own_key or 'every run'})" for p in built_in), text
    assert {p.name: p.cls.own_key for p in built_in if p.cls.own_key} == {
        "progress": "progress", "probes": "train.probe_every", "tail_ema": "train.tail_ema",
        "checkpoints": "train.checkpoint_every",
    }  # fmt: skip
