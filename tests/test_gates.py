"""report.gates: the section checked before any run, each rule's answer and reason on planted sweeps with a known
answer (better at equal steps but slower: fails at equal time), a null case's false-pass rate, and the files."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from helpers import fake_run

import zoo
from zoo.lab.planning.gates import GATES, Finding, check_gates, evaluate, gate_options
from zoo.lab.records.summary import RunRecord
from zoo.lab.studies.runset import Run, Variant
from zoo.lab.studies.variants import Report, build_report


def test_report_gates_is_read_as_names_or_a_mapping_and_refuses_what_no_gate_is():
    assert gate_options(None) == [] and gate_options([]) == []
    assert gate_options("better,ladder_better") == [("better", {}), ("ladder_better", {})]
    sized = {"axis": "block.d_model", "at": "flops"}
    assert gate_options({"better_at_every_size": {"at": "flops"}}) == [("better_at_every_size", sized)]
    assert gate_options(["better", {"better_at_every_size": None}])[1] == (
        "better_at_every_size", {"axis": "block.d_model", "at": "time"})  # fmt: skip
    for bad, says in [
        (["nosuch"], f"report.gates='nosuch': a gate name; allowed: {', '.join(GATES)}"),
        ({"better_at_every_size": {"width": 3}}, "report.gates.better_at_every_size.width=3: an option of "
                                                 "better_at_every_size: axis (default block.d_model), at"),
        ({"better_at_every_size": {"at": "joules"}}, "report.gates.better_at_every_size.at='joules': time or flops "
                                                     "or steps"),
        (3, "report.gates=3: a list of gate names"),
    ]:  # fmt: skip
        with pytest.raises(zoo.ConfigError) as refused:
            gate_options(bad)
        assert str(refused.value).startswith(says), str(refused.value)
    with pytest.raises(zoo.ConfigError, match=r"report.gates.better_at_every_size.axis='block.d_model': a swept "
                                              r"axis; swept: mlp"):  # fmt: skip
        check_gates(["better_at_every_size"], ["mlp"], ladder=False)
    with pytest.raises(zoo.ConfigError, match=r"report.gates='ladder_better': a ladder sweep \(ladder.steps\)"):
        check_gates(["ladder_better"], ["mlp", "block.d_model"], ladder=False)
    assert check_gates(["ladder_better"], ["block.d_model"], ladder=True) == [("ladder_better", {})]


def test_a_sweep_naming_an_unknown_gate_is_refused_before_any_run():
    from test_sweep import hydra_config

    from zoo.lab.planning.sweep import check_sweep

    check_sweep(hydra_config("+sweeps=quick", "report.gates=[better]"))
    for bad, says in [
        ("report.gates=[nosuch]", "report.gates='nosuch': a gate name; allowed: better, better_at_every_size"),
        ("report.gates=[better_at_every_size]", "report.gates.better_at_every_size.axis='block.d_model': a swept "
                                                "axis; swept: pos, mlp"),
        ("report.gates=[ladder_better]", "report.gates='ladder_better': a ladder sweep"),
    ]:  # fmt: skip
        with pytest.raises(zoo.ConfigError) as refused:
            check_sweep(hydra_config("+sweeps=quick", bad))
        assert str(refused.value).startswith(says), str(refused.value)


class Stub:
    """Evidence with planted findings."""

    metric = "val_bpb"

    def __init__(self, comparison=None, sizes=None, ladder=None, target=None):
        self.found, self.sizes, self.found_ladder, self.found_target = comparison, sizes, ladder, target

    def comparison(self):
        return self.found

    def at_sizes(self, axis, at):
        return self.sizes

    def ladder(self):
        return self.found_ladder

    def target(self):
        return self.found_target


def test_each_rule_passes_only_on_its_evidence_and_says_why():
    better, noise = Finding("better", "Δ -0.1 [-0.2, -0.05]"), Finding("within noise", "Δ -0.01 [-0.1, +0.08]")
    gates = gate_options(["better", "better_at_every_size", "ladder_better"])
    passed = evaluate(gates, Stub(better, {"64": better, "128": better}, Finding("better", "compute multiplier 1.3")))
    assert [r.passed for r in passed] == [True, True, True]
    assert passed[1].reason.startswith("better at block.d_model=64, 128 at equal time (block.d_model=64: better")
    failed = evaluate(gates, Stub(noise, {"64": better, "128": noise}, Finding("within noise", "multiplier 1.0")))
    assert [r.passed for r in failed] == [False, False, False]
    assert failed[0].text == "fails (within noise on val_bpb, Δ -0.01 [-0.1, +0.08])"
    assert failed[1].reason.startswith("not better at block.d_model=128 at equal time")
    assert failed[2].reason == "ladder verdict within noise, multiplier 1.0"
    alone = evaluate(gates, Stub(None, {"64": better}, None))  # the baseline's; one size; no ladder
    assert [r.reason for r in alone] == ["no comparison with the baseline", "one size only (block.d_model=64: "
                                         "better, Δ -0.1 [-0.2, -0.05])", "no ladder verdict (not a ladder sweep, or "
                                         "no ladder row)"]  # fmt: skip
    assert not evaluate(gates, Stub(better, None, None))[1].passed  # the axis is not swept


def test_the_target_gate_passes_on_the_target_rules_pass_alone_and_needs_a_target():
    gates = gate_options(["target"])
    rule = "(target - mean) x sqrt(3) = 0.05 > margin 0.02"
    assert evaluate(gates, Stub(target=Finding("pass", rule)))[0].text == f"passes (target rule pass: {rule})"
    for verdict in ("fail", "too few runs"):
        assert not evaluate(gates, Stub(target=Finding(verdict, "...")))[0].passed
    assert evaluate(gates, Stub())[0].reason == "no report.target"
    with pytest.raises(zoo.ConfigError, match=r"report.gates='target': a report.target for target"):
        check_gates(["target"], ["mlp"], ladder=False)
    assert check_gates(["target"], ["mlp"], ladder=False, target=True) == [("target", {})]


def planted_sweep(root: Path, slower: float) -> None:
    """Two widths x two MLPs x 3 seeds: swiglu's curve lies 0.1 below gelu's at every step, and its steps take
    ``slower`` times as long."""
    for seed in range(3):
        for width in (16, 32):
            for mlp, shift, time in (("gelu", 0.0, 10.0), ("swiglu", -0.1, 10.0 * slower)):
                overrides = [f"block.d_model={width}", f"mlp={mlp}", f"seed={seed}"]
                curve = {s: 5.0 - 0.2 * s + shift + 0.01 * seed - width / 100 for s in (0, 5, 10)}
                fake_run(root, overrides, value=curve[10], steps=10, train_time_s=time, flops=1e8 * time,
                         job=4 * seed + 2 * (width == 32) + (mlp == "swiglu"))  # fmt: skip
                lines = [{"kind": "val", "step": s, "val_bpb": v} for s, v in curve.items()]
                (root / ",".join(overrides) / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_better_at_every_size_compares_at_equal_time_flops_or_steps(tmp_path):
    """swiglu is better at equal steps at both widths but takes twice as long a step: at equal training time it is
    read at its step 5 against gelu's step 10, and fails; at equal FLOPs too (its FLOPs doubled)."""
    planted_sweep(tmp_path, slower=2.0)
    report = build_report(tmp_path, baseline={"mlp": "gelu", "block.d_model": "16"})
    from zoo.lab.studies.gates import report_gates

    gates = [{"better_at_every_size": {"at": at}} for at in ("steps", "time", "flops")]
    results = report_gates(report, gates)
    assert report.axes == ["mlp", "block.d_model"]
    steps, time, flops = results[("swiglu", "32")]
    assert steps.passed and steps.reason.startswith("better at block.d_model=16, 32 at equal steps")
    assert "Δ -0.1000 [-0.1000, -0.1000]" in steps.reason
    assert not time.passed and time.reason.startswith("not better at block.d_model=16, 32 at equal time")
    assert "worse, Δ +0.9000" in time.reason  # swiglu at step 5 (4.0 - 0.1) against gelu at step 10 (3.0)
    assert not flops.passed
    alone = report_gates(report, ["better_at_every_size"])[("gelu", "32")][0]
    assert alone.reason == "the variant differs from the baseline in block.d_model alone"


def test_the_report_writes_its_gates_and_a_later_report_without_them_removes_the_file(tmp_path):
    from zoo.lab.reports.report import write_built

    planted_sweep(tmp_path, slower=1.0)
    text = write_built(build_report(tmp_path, baseline={"mlp": "gelu", "block.d_model": "16"}), plots=False,
                       gates=["better", "better_at_every_size"])  # fmt: skip
    written = json.loads((tmp_path / "gates.json").read_text())
    assert written["baseline"] == "mlp=gelu block.d_model=16" and written["metric"] == "val_bpb"
    entry = next(e for e in written["gates"] if e["variant"] == "mlp=swiglu block.d_model=32"
                 and e["gate"] == "better_at_every_size")  # fmt: skip
    assert entry["passed"] is True and entry["values"] == {"mlp": "swiglu", "block.d_model": "32"}
    assert f"- mlp=swiglu block.d_model=32, better_at_every_size: passes ({entry['reason']})" in text
    assert "| 2/2 pass |" in text
    write_built(build_report(tmp_path), plots=False)  # the runs recorded no gates
    assert not (tmp_path / "gates.json").exists()


def test_better_at_every_size_passes_a_null_variant_no_more_often_than_its_level(monkeypatch):
    """Variant and baseline drawn alike at two widths (3 seeds, a shared seed offset, random step times): each
    width's `better` verdict (one side of a 95% interval) comes at most 2.5% of the time, within binomial error."""
    import zoo.lab.studies.gates as gates_module

    rng, curves, cases = random.Random(0), {}, 400
    monkeypatch.setattr(gates_module, "read_metrics", lambda path: curves[path])

    def run(case: int, width: str, mlp: str, seed: int, level: float) -> Run:
        path = Path(f"{case}/{width}/{mlp}/{seed}")
        end = level + rng.gauss(0, 0.05)
        curves[path] = [{"kind": "val", "step": 0, "val_bpb": 5.0}, {"kind": "val", "step": 10, "val_bpb": end}]
        record = RunRecord(status="ok", steps=10, train_time_s=rng.uniform(9.9, 10.1), config={"seed": seed})
        return Run(path, record, {"block.d_model": width, "mlp": mlp, "seed": str(seed)})

    better_by_size, passed = [0, 0], 0
    for case in range(cases):
        variants = []
        for width in ("16", "32"):
            for mlp in ("gelu", "swiglu"):
                variants.append(Variant((width, mlp), [run(case, width, mlp, s, 3.0 + 0.2 * s) for s in range(3)]))
        report = Report(Path("."), ["block.d_model", "mlp"], variants, "val_bpb", "min", [], ("16", "gelu"))
        evidence = gates_module.ReportEvidence(report, variants[3])
        sizes = evidence.at_sizes("block.d_model", "time")
        assert list(sizes) == ["16", "32"]
        assert {f.verdict for f in sizes.values()} <= {"better", "worse", "within noise"}
        for i, found in enumerate(sizes.values()):
            better_by_size[i] += found.verdict == "better"
        passed += evaluate(gate_options(["better_at_every_size"]), evidence)[0].passed
    bound = cases * 0.025 + 3 * (cases * 0.025 * 0.975) ** 0.5
    assert all(n <= bound for n in better_by_size), better_by_size
    assert passed <= better_by_size[0]


def test_ladder_better_reads_the_ladders_row_of_the_variant():
    """The ladder's row is keyed by the variant's values of the ladder's axes (the sweep's less the widths)."""
    import zoo.lab.studies.gates as gates_module
    from zoo.lab.studies.ladder.study import Answer, LadderRow, LadderStudy

    rows = {("gelu",): LadderRow(("gelu",), [], {}, 1.0),
            ("swiglu",): LadderRow(("swiglu",), [], {}, 1.0, Answer(1.3, 1.1, 1.6, verdict="better", time=1.2,
                                                                    time_low=1.0, time_high=1.4))}  # fmt: skip
    variants = [Variant(("gelu", "64")), Variant(("swiglu", "64")), Variant(("gelu", "128"))]
    report = Report(Path("."), ["mlp", "block.d_model"], variants, "val_loss", "min", [], ("gelu", "64"))
    report.ladder = LadderStudy("val_loss", ["mlp"], ("gelu",), 10.0, rows)
    found = [gates_module.ReportEvidence(report, v).ladder() for v in variants]
    assert found[0] is None and found[2] is None  # the baseline's row: no answer
    assert found[1] == Finding("better", "compute multiplier 1.3 [1.1, 1.6], in wall time 1.2 [1, 1.4]")
    passed = evaluate(gate_options(["ladder_better"]), gates_module.ReportEvidence(report, variants[1]))[0]
    assert passed.passed and passed.reason == "ladder verdict better, compute multiplier 1.3 [1.1, 1.6], in wall " \
                                              "time 1.2 [1, 1.4]"


def test_zoo_report_takes_gates_and_refuses_an_unknown_one_before_writing(tmp_path, capsys):
    from zoo.lab.commands.report import main

    planted_sweep(tmp_path, slower=1.0)
    with pytest.raises(SystemExit) as refused:
        main([str(tmp_path), "--no-plots", "--gates", "better,nosuch"])
    assert refused.value.code == 1 and not (tmp_path / "report.md").exists()
    assert "report.gates='nosuch': a gate name; allowed: better, better_at_every_size" in capsys.readouterr().err
    main([str(tmp_path), "--no-plots", "--gates", "better_at_every_size", "--baseline", "mlp=gelu,block.d_model=16"])
    written = json.loads((tmp_path / "gates.json").read_text())["gates"]
    assert {(e["variant"], e["passed"]) for e in written} == {("mlp=swiglu block.d_model=32", True),
                                                              ("mlp=swiglu block.d_model=16", True),
                                                              ("mlp=gelu block.d_model=32", False)}  # fmt: skip
