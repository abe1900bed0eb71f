"""One training run in-process: records, determinism, divergence, bad configs, resume."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import yaml
from helpers import folder_bytes, tiny, without_timings
from omegaconf import OmegaConf

from zoo import ConfigError, build_model, compose
from zoo.lab.keys import run_dirname
from zoo.lab.planning.train_config import TrainConfig
from zoo.lab.records.metrics import read_metrics
from zoo.lab.records.summary import read_summary
from zoo.lab.tasks import TASKS, build_task
from zoo.lab.training.run import run
from zoo.lab.training.trainer import make_optimizer


def test_run_writes_metrics_and_summary(tmp_path):
    summary = run(tiny(), tmp_path)
    assert summary == read_summary(tmp_path)
    assert summary["status"] == "ok" and summary["error"] is None
    assert summary["steps"] == 12 and summary["tokens"] == 12 * 4 * 32
    assert summary["parameters"]["total"] == sum(v for k, v in summary["parameters"].items() if k != "total")
    assert summary["flops_per_token"] > 6 * summary["parameters"]["attention"]
    assert summary["metric"] == {"name": "val_bpb", "mode": "min", "value": summary["final"]["val_bpb"]}
    assert summary["final"]["val_bpb"] == pytest.approx(summary["final"]["val_loss"] / math.log(2))
    assert summary["tokens_per_s"] > 0 and summary["wall_time_s"] > 0 and summary["peak_memory_mib"] > 0
    assert len(summary["data"]["sha256"]) == 64 and summary["data"]["bytes"] == 30000
    assert summary["versions"]["torch"] == torch.__version__ and summary["config"]["train"]["steps"] == 12
    assert summary["versions"]["cpu"]["kernels"] == torch.backends.cpu.get_cpu_capability()  # its last digits move
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 4, 6, 8, 12]
    assert [r["step"] for r in records if r["kind"] == "val"] == [0, 6, 12]  # 0: the initial weights
    assert summary["initial"] == {k: v for k, v in records[0].items() if k not in ("kind", "step", "tokens")}
    assert {"loss", "lr", "tokens_per_s", "tokens", "grad_norm", "grad_norm_max"} <= set(records[1])
    assert summary["spikes"] == {"count": 0, "steps": [], "by": {"loss": [], "grad_norm": []}, "judged": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "manifest.json",  # model.safetensors' sha256
        "metrics.jsonl",
        "model.safetensors",
        "summary.json",
    ]  # no temp files left


def test_training_lowers_the_loss(tmp_path):
    summary = run(tiny("train.steps=30", "train.eval_every=0", "train.lr=1e-2"), tmp_path)
    first = next(r for r in read_metrics(tmp_path) if r["kind"] == "train")["loss"]
    assert first == pytest.approx(math.log(256), abs=0.3)  # uniform over bytes at init
    assert summary["final"]["val_loss"] < first - 1.0


def test_same_seed_same_metrics_other_seed_other(tmp_path):
    a = run(tiny("preset=llama"), tmp_path / "a")
    b = run(tiny("preset=llama"), tmp_path / "b")
    c = run(tiny("preset=llama", "seed=1"), tmp_path / "c")
    assert without_timings(read_metrics(tmp_path / "a")) == without_timings(read_metrics(tmp_path / "b"))
    assert a["final"] == b["final"] and a["config_hash"] == b["config_hash"]
    assert c["final"] != a["final"]


def test_diverging_run_stops_early_and_is_recorded(tmp_path):
    summary = run(tiny("train.lr=1000.0", "train.warmup_steps=0", "train.steps=40", "train.log_every=2"), tmp_path)
    assert summary["status"] == "diverged" and summary["error"] is None
    assert summary["steps"] < 40 and "loss" in summary["reason"]
    assert summary["metric"]["value"] is None
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "diverged"


def test_a_learned_table_shorter_than_the_sequence_fails_on_the_config_before_any_data(tmp_path, monkeypatch):
    monkeypatch.setattr("zoo.lab.planning.plan.RunPlan.build_task", lambda plan: pytest.fail("read the data first"))
    summary = run(tiny("pos=learned", "block.max_len=8", "task.seq_len=64"), tmp_path)
    assert summary["status"] == "failed" and "traceback" not in summary, summary["error"]
    assert summary["error"] == (
        "ConfigError: block.max_len=8: below task.seq_len=64: learned positions need block.max_len >= "
        "task.seq_len; set block.max_len=64 or lower task.seq_len"
    )
    monkeypatch.undo()
    assert run(tiny("pos=learned", "block.max_len=32", "task.seq_len=32"), tmp_path / "fits")["status"] == "ok"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"train": {"lr": -1.0}}, "train.lr=-1.0: must be a positive number"),
        ({"train": {"stesp": 3}}, "train.stesp=3: unknown key"),
        ({"block": {"n_heads": 5}}, "block.n_heads=5: must divide d_model=32"),
        ({"task": {"name": "bytse"}}, "task.name='bytse': unknown task; did you mean 'bytes'"),
        ({"model": {"vocab_size": 100}}, "model.vocab_size=100: at least task 'bytes'"),
        ({"device": "tpu"}, "device='tpu': cpu, cuda or cuda:<index>"),
        ({"seeed": 1}, "seeed=1: unknown top-level key"),
    ],
)
def test_bad_config_is_recorded_not_raised(tmp_path, change, message):
    cfg = OmegaConf.merge(tiny(), change)
    summary = run(cfg, tmp_path)
    assert summary["status"] == "failed"
    assert summary["error"].startswith("ConfigError: ") and message in summary["error"], summary["error"]
    assert read_summary(tmp_path)["status"] == "failed"
    assert "traceback" not in summary  # a config error is one line, not a stack


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_cuda_asked_without_cuda_is_a_clear_failure(tmp_path):
    summary = run(tiny("device=cuda"), tmp_path)
    assert "device='cuda': CUDA is not available on this machine" in summary["error"]


def test_resume_skips_ok_runs_and_reruns_the_rest(tmp_path):
    first = run(tiny(), tmp_path)
    stamp = (tmp_path / "metrics.jsonl").stat().st_mtime_ns
    again = run(tiny(), tmp_path)
    assert again == first and (tmp_path / "metrics.jsonl").stat().st_mtime_ns == stamp  # skipped
    assert run(tiny("threads=2"), tmp_path) == first  # runtime-only keys do not force a re-run
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    changed = run(tiny("train.steps=8"), tmp_path)  # the config changed under the same folder: refused, untouched
    assert changed["status"] == "refused" and "another config (train.steps: " in changed["error"], changed
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files
    summary = read_summary(tmp_path)
    summary["status"] = "failed"
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    redone = run(tiny(), tmp_path)  # a failed run of this config is trained again
    assert redone["status"] == "ok" and redone["finished"] >= summary["finished"]
    assert without_timings(read_metrics(tmp_path))[-1]["step"] == first["steps"]


def test_a_run_that_fails_before_it_trains_never_writes_a_folder_holding_a_finished_run(tmp_path):
    """Whatever fails before a run trains (a tuning without a rate, a bad runtime key under the same config hash),
    a folder holding a finished run (ok or diverged) keeps every byte; the run says so and is ``refused``."""
    ok, diverged = tmp_path / "ok", tmp_path / "diverged"
    assert run(tiny(), ok)["status"] == "ok"
    assert run(tiny("train.lr=1000", "train.warmup_steps=0"), diverged)["status"] == "diverged"
    for folder, change in [(ok, "tune.lr=[1e-3]"), (diverged, "threads=0")]:
        before = folder_bytes(folder)
        config = tiny("train.lr=1000", "train.warmup_steps=0", change) if folder == diverged else tiny(change)
        failed = run(config, folder, multirun=True, tune_dir=tmp_path / "no_tuning")
        assert failed["status"] == "refused", failed
        key = change.split("=")[0]
        assert "holds a finished run (status " in failed["error"] and f"ConfigError: {key}=" in failed["error"]
        assert folder_bytes(folder) == before, change


def test_mqar_and_longer_evaluation_lengths(tmp_path):
    mqar = run(tiny("task.n_pairs=4", "task.n_queries=4", "task.eval_lengths=[1,2]", task="mqar"), tmp_path / "m")
    assert mqar["status"] == "ok" and mqar["metric"]["name"] == "val_accuracy" and mqar["metric"]["mode"] == "max"
    assert set(mqar["final"]) == {"train_loss", "val_accuracy", "val_accuracy_2x", "val_loss", "val_loss_2x"}
    assert 0 <= mqar["final"]["val_accuracy_2x"] <= 1
    lengthgen = run(tiny("task.seq_len=16", "preset=llama", task="lengthgen"), tmp_path / "l")
    assert lengthgen["metric"]["name"] == "val_bpb_4x" and lengthgen["metric"]["value"] > 0
    assert {"val_bpb", "val_bpb_2x", "val_bpb_4x"} <= set(lengthgen["final"])


def test_learning_rate_schedule():
    cfg = TrainConfig(steps=110, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [cfg.lr_at(s) for s in range(110)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)  # linear warmup
    assert lrs[10] == pytest.approx(1.0) and lrs[60] == pytest.approx(0.55)  # cosine half-way
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3) and all(a >= b for a, b in zip(lrs[9:-1], lrs[10:], strict=True))


@pytest.mark.parametrize(("steps", "warmup"), [(110, 10), (7, 3), (5, 0), (4, 4)])
def test_learning_rate_at_every_step_follows_the_formula(steps, warmup):
    """Step s (0-based) of W warmup steps: lr (s + 1) / W, then lr_min + (lr - lr_min)(1 + cos(pi p)) / 2
    with p = (s - W) / (steps - W): the first step after warmup is at the peak, none is above it."""
    cfg = TrainConfig(steps=steps, lr=2.0, warmup_steps=warmup, min_lr_ratio=0.25)
    for s in range(steps):
        if s < warmup:
            expected = 2.0 * (s + 1) / warmup
        else:
            p = (s - warmup) / max(1, steps - warmup)
            expected = 0.5 + 0.75 * (1 + math.cos(math.pi * p))
        assert cfg.lr_at(s) == pytest.approx(expected, rel=1e-12), s
    assert max(cfg.lr_at(s) for s in range(steps)) == pytest.approx(2.0)


def test_each_step_trains_at_the_scheduled_rate(tmp_path):
    """The rate logged for step n (1-based) is lr_at(n - 1), and it is what the optimizer used."""
    cfg = tiny("train.steps=5", "train.warmup_steps=2", "train.log_every=1", "train.eval_every=0")
    run(cfg, tmp_path)
    logged = {r["step"]: r["lr"] for r in read_metrics(tmp_path) if r["kind"] == "train"}
    schedule = TrainConfig.from_config(cfg["train"])
    assert logged == {n: pytest.approx(schedule.lr_at(n - 1)) for n in range(1, 6)}


def test_weight_decay_shrinks_matrices_never_biases_nor_norm_gains():
    """With every gradient zero, one AdamW step moves only what decays, by lr * weight_decay."""
    model = build_model(compose(["preset=gpt", "block.d_model=16", "block.n_heads=2", "model.n_layers=1",
                                 "model.tie_embeddings=false"]))  # fmt: skip
    cfg = TrainConfig(lr=0.5, weight_decay=0.1)
    optimizer = make_optimizer(model, cfg)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    kept = sorted(name for name, p in model.named_parameters() if torch.equal(p, before[name]))
    norms = {name for name, module in model.named_modules() if "norm" in type(module).__name__.lower()}
    no_decay = sorted(n for n in before if n.endswith(".bias") or n.rsplit(".", 1)[0] in norms)
    assert kept == no_decay and any(n.endswith(".bias") for n in kept) and any(".norm" in n for n in kept)
    for name, p in model.named_parameters():
        if name not in no_decay:
            torch.testing.assert_close(p, before[name] * (1 - 0.5 * 0.1), rtol=0, atol=1e-7)


def test_run_folder_names_are_path_safe_and_stable():
    assert run_dirname("attn=gqa,norm=rmsnorm,seed=0") == "attn=gqa,norm=rmsnorm,seed=0"
    assert "/" not in run_dirname("task.path=/data/x y.txt") and run_dirname("") == "default"
    long = ",".join(f"k{i}=v{i}" for i in range(80))
    assert len(run_dirname(long)) == 200 and run_dirname(long) == run_dirname(long) != run_dirname(long + "x")


def test_the_adding_a_task_example_in_the_docs_trains(tmp_path):
    text = (Path(__file__).resolve().parent.parent / "docs" / "sweeps.md").read_text()
    code = re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    option_file = re.findall(r"^```yaml\n(# @package task\n.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    assert len(code) == 1 and len(option_file) == 1
    try:
        exec(compile(code[0], "docs/sweeps.md", "exec"), {})
        options = yaml.safe_load(option_file[0])
        assert build_task(options).metric == "val_accuracy"
        cfg = {**tiny(task="mqar"), "task": {**options, "length": 4, "vocab": 16, "eval_lengths": [1, 2]}}
        summary = run(cfg, tmp_path)
        assert summary["status"] == "ok" and summary["data"] == {"task": "copy", "source": "generated"}
        assert {"val_accuracy", "val_accuracy_2x"} <= set(summary["final"])
    finally:
        if "copy" in TASKS:
            TASKS.unregister("copy")


def test_the_loss_skips_exactly_the_tasks_ignore_value(monkeypatch):
    """The loss names the tasks' IGNORE itself rather than relying on cross_entropy's default (-100)."""
    import zoo.lab.training.step as step

    logits = torch.randn(2, 3, 5)
    targets = torch.tensor([[1, 4, -7], [-7, 0, 2]])
    kept = targets != -7
    expected = torch.nn.functional.cross_entropy(logits[kept], targets[kept])
    monkeypatch.setattr(step, "IGNORE", -7)
    torch.testing.assert_close(step.loss_fn(logits, targets), expected)


@pytest.mark.slow
def test_sinusoidal_positions_train_at_least_as_well_as_none(tmp_path):
    """sinusoidal once drowned the tokens under its table (4.60 bits per byte against 3.46 for none at the
    quick size). At the quick size (d_model 64, 2 layers, seq_len 64: sweeps/quick.yaml) trained 100 steps
    of 12 at lr 1e-2, it now ends below none: 3.88-3.89 against 4.01-4.15 over seeds 0-2 (docs/testing.md)."""

    def val_bpb(pos: str) -> float:
        overrides = ["+sweeps=quick", f"pos={pos}", "seed=0", "train.steps=100", "train.batch_size=12",
                     "train.lr=1e-2", "train.warmup_steps=10", "train.eval_every=0", "train.save=none",
                     "train.checkpoint_every=0", "progress=false"]  # fmt: skip
        cfg = OmegaConf.to_container(compose(overrides), resolve=True)
        cfg.pop("hydra", None)
        return run(cfg, tmp_path / pos)["final"]["val_bpb"]

    sinusoidal, none = val_bpb("sinusoidal"), val_bpb("none")
    assert sinusoidal <= none, (sinusoidal, none)


def test_a_norm_free_placement_records_no_norm_choice_and_its_norm_sweep_is_one_variant(tmp_path):
    from torch import nn

    from zoo import PLACEMENTS
    from zoo.lab.studies.variants import build_report
    from zoo.parts.placements import Placement

    @PLACEMENTS.register("test_nonorm", formula="x = x + f(x)")
    class NoNorm(Placement):
        """No norm anywhere: the residual sum of the branches."""

        uses_norm = False
        final_norm = False

        @classmethod
        def norm_count(cls, n_branches: int) -> int:
            return 0

        def forward(self, x, branches):
            for branch in branches:
                x = x + self.drop(branch(x))
            return x

    try:
        for placement, norm in [("test_nonorm", "rmsnorm"), ("test_nonorm", "layernorm"), ("pre", "rmsnorm")]:
            said = [f"placement={placement}", f"norm={norm}"]
            cfg = OmegaConf.merge(tiny(f"norm={norm}"), {"block": {"placement": {"name": placement}}})
            summary = run(
                cfg, tmp_path / ",".join(said), overrides=said, choices={"placement": placement, "norm": norm}
            )
            assert summary["status"] == "ok", summary["error"]
            free = placement == "test_nonorm"
            assert ("norm" in summary["choices"]) is not free and summary["unused_axes"] == (["norm"] if free else [])
            assert not any(isinstance(m, nn.LayerNorm) for m in build_model(summary["config"]).modules()) or not free
        report = build_report(tmp_path)
        assert report.axes == ["placement", "norm"]
        assert sorted(report.label(v) for v in report.variants) == [
            "placement=pre norm=rmsnorm",
            "placement=test_nonorm norm=unused",  # one variant, its two identical runs counted once
        ]
        assert [len(v.runs) for v in report.variants] == [1, 1]
    finally:
        PLACEMENTS.unregister("test_nonorm")


def test_a_task_with_its_own_metric_trains_without_a_trainer_change(tmp_path):
    """A task owns its scoring: the trainer adds up the sums it names, then hands them to its compute."""
    from zoo.lab.tasks import IGNORE, register_task
    from zoo.lab.tasks.mqar import MQARTask

    scored, computed = [], []

    class MarginTask(MQARTask):
        """MQAR scored by the log-probability margin of the right value over the best other token."""

        metrics = {"margin": "max", "loss": "min"}
        sums = ("margin_sum", "count", "loss_sum")

        def score(self, model, batch, logits):
            kept = batch.targets != IGNORE
            logp, target = logits.log_softmax(-1)[kept], batch.targets[kept][:, None]
            right = logp.gather(-1, target)[:, 0]
            best_other = logp.scatter(-1, target, -math.inf).amax(-1)
            sums = {"margin_sum": (right - best_other).sum().double(), "count": kept.sum().double(),
                    "loss_sum": -right.sum().double()}  # fmt: skip
            scored.append({name: value.item() for name, value in sums.items()})
            return sums

        def compute(self, sums):
            computed.append(dict(sums))
            return {"margin": sums["margin_sum"] / sums["count"], "loss": sums["loss_sum"] / sums["count"]}

    register_task("margin")(MarginTask)
    try:
        cfg = tiny(task="mqar")
        cfg["task"] = {**cfg["task"], "name": "margin", "metric": "val_margin"}
        summary = run(cfg, tmp_path)
        assert summary["status"] == "ok", summary["error"]
        assert len(computed) == 3 and len(scored) == 3 * 2  # three evaluations (0: the initial weights) of 2 batches
        last = scored[-2:]  # the final evaluation's batches, added up in order
        assert computed[-1] == {name: last[0][name] + last[1][name] for name in MarginTask.sums}
        margin = computed[-1]["margin_sum"] / computed[-1]["count"]
        assert summary["metric"] == {"name": "val_margin", "mode": "max", "value": margin}
        assert summary["final"]["val_margin"] == margin and "val_accuracy" not in summary["final"]
        assert summary["final"]["val_loss"] == computed[-1]["loss_sum"] / computed[-1]["count"]
    finally:
        TASKS.unregister("margin")


def test_the_trainer_trains_with_the_shared_step(tmp_path, monkeypatch):
    """Trainer.fit runs zoo.lab.training.step's Stepper once per step (the step the benchmarks time)."""
    from zoo.lab.training import step

    calls = []
    original = step.Stepper.__call__

    def counted(self, batch):
        calls.append(batch.inputs.shape)
        return original(self, batch)

    monkeypatch.setattr(step.Stepper, "__call__", counted)
    summary = run(tiny("train.eval_every=0"), tmp_path)
    assert summary["status"] == "ok" and len(calls) == 12 and calls[0] == (4, 32)


def test_the_trainer_and_the_run_entry_name_no_task():
    """The trainer and zoo-train leave how a batch reaches the model, how it is scored and which model
    it needs to the task (zoo/lab/tasks): no encoder-decoder inputs, no task's metric, no model kind."""
    lab = Path(__file__).resolve().parent.parent / "zoo" / "lab"
    for path in [*(lab / "training").glob("*.py"), lab / "commands" / "train.py"]:
        text, name = path.read_text(), path.name
        for word in ("source", "exact_match", "seq2seq", "build_seq2seq", "transduce"):
            found = [line for line in text.splitlines() if re.search(rf"\b{word}\b", line)]
            assert not found, (name, word, found)


def test_a_checkpoint_records_the_loops_running_values_as_before(tmp_path):
    """state.json's ``loop`` keeps its keys (checkpoints written before still resume): the first loss,
    the last logged one, the last evaluation, steps summed since the last log and the training time;
    and, added since (an older checkpoint resumes without them), the initial evaluation and the callbacks'
    state (the spike detector's: the logs of every step's loss and gradient norm up to the last log step,
    the steps after it kept per rank until the next)."""
    from zoo.lab.records import checkpoint as ckpt

    summary = run(tiny("train.checkpoint_every=4", "train.keep_checkpoints=5", "train.log_every=3"), tmp_path)
    assert summary["status"] == "ok"
    loop = ckpt.read_state(ckpt.step_dir(tmp_path, 8))["state"]["loop"]
    assert set(loop) == {"n_summed", "reference", "last_loss", "final_val", "train_time", "initial", "callback_state"}
    records = read_metrics(tmp_path)
    train = {r["step"]: r["loss"] for r in records if r["kind"] == "train"}  # logged at 1, 3, 6, 9, 12
    val = next(r for r in records if r["kind"] == "val" and r["step"] == 6)
    assert loop["reference"] == train[1] and loop["last_loss"] == train[6] and loop["n_summed"] == 2
    assert loop["final_val"] == {k: v for k, v in val.items() if k.startswith("val_")}
    assert 0 < loop["train_time"] < summary["train_time_s"]
    assert loop["initial"] == summary["initial"]
    spikes = loop["callback_state"]["spikes"]
    assert [len(h) for h in spikes["history"].values()] == [6, 6]  # steps 1 to 6, the last log step before 8
    assert spikes["judged"] == 0 and spikes["steps"] == []  # none has 10 earlier steps yet
    assert math.exp(spikes["history"]["loss"][0]) == pytest.approx(train[1])  # step 1 logged alone
    rank = ckpt.read_state(ckpt.step_dir(tmp_path, 8))["state"]["ranks"][0]
    assert tuple(rank["pending"].shape) == (2, 2)  # steps 7 and 8: loss and gradient norm, until step 9's log


def test_a_run_checks_each_section_once_and_builds_from_what_it_resolved(tmp_path, monkeypatch):
    """zoo.lab.planning.plan checks tune and the process mesh once each (the mesh with the task's lengths, known
    before its data is read); the model is built from the resolved layer specs, not resolved again."""
    from zoo.lab.planning import mesh, plan
    from zoo.lab.training import run as train

    calls = {"tune": 0, "mesh": 0}

    def counting(name, function):
        def counted(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)

        return counted

    monkeypatch.setattr(train, "tune_options", counting("tune", train.tune_options))
    monkeypatch.setattr(mesh.ProcessMesh, "check_model", counting("mesh", mesh.ProcessMesh.check_model))
    monkeypatch.setattr("zoo.models.language.stack_specs", lambda *a, **k: pytest.fail("resolved the block again"))
    summary = run(tiny(), tmp_path)
    assert summary["status"] == "ok", summary["error"]
    assert calls == {"tune": 1, "mesh": 1}
    resolved = plan.plan_run(tiny(), {})
    assert len(resolved.specs) == 2 and resolved.task_options["seq_len"] == 32 and resolved.train.steps == 12
    for cfg, length in [
        (tiny("task.seq_len=33"), 33),
        (tiny("task.max_len=12", "model.vocab_size=256", task="transduce"), 13),
    ]:
        cfg = {**cfg, "parallel": {"tp": 2}}
        with pytest.raises(ConfigError, match=f"parallel.tp=2: must divide the sequence length {length} "):
            plan.plan_run(cfg, {}, world=2)  # the task's length from its options: no data read


def test_default_threads_share_the_cores_and_obey_omp_num_threads(monkeypatch):
    """``threads: null``: the cores over the jobs beside this one, never more than OMP_NUM_THREADS asks (a run
    started by a process that set it, as a test suite's worker does, must not fight its parent for the cores)."""
    from zoo.lab.training import processes

    monkeypatch.setattr(processes, "usable_cores", lambda: 8)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [processes.default_threads(jobs) for jobs in (1, 2, 3, 16)] == [8, 4, 2, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert [processes.default_threads(jobs) for jobs in (1, 2, 4)] == [3, 3, 2]
    for ignored in ("", "0", "auto"):  # unset in effect: torch's own reading of these is its default
        monkeypatch.setenv("OMP_NUM_THREADS", ignored)
        assert processes.default_threads(1) == 8
