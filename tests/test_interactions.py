"""The report's interactions: the per-seed difference of differences of two axes, against a hand computation."""

from __future__ import annotations

import csv

import pytest
from scipy import stats

from zoo.core.errors import ConfigError
from zoo.lab.commands.report import main as report_main
from zoo.lab.planning.options import report_interaction
from zoo.lab.records.summary import RunRecord, write_record
from zoo.lab.reports.report import write_report
from zoo.lab.studies.variants import build_report

#: val_loss per (optim, mlp, seed): swiglu is ahead under adamw on every seed and behind under muon.
LOSS = {
    ("adamw", "gelu"): [3.10, 3.05, 3.12], ("adamw", "swiglu"): [3.07, 3.01, 3.10],
    ("muon", "gelu"): [2.90, 2.86, 2.93], ("muon", "swiglu"): [2.94, 2.89, 2.97],
}  # fmt: skip


def sweep(root, more: dict[str, str] | None = None, interaction=None) -> None:
    for (optim, mlp), losses in LOSS.items():
        for extra_value in (more or {"": ""}).values():
            for seed, loss in enumerate(losses):
                overrides = [f"optim={optim}", f"mlp={mlp}", f"seed={seed}"] + ([f"lr={extra_value}"] if more else [])
                config = {"seed": seed, "report": {"interaction": interaction}}
                record = RunRecord(status="ok", overrides=overrides, config=config, job=len(list(root.glob("*"))),
                                   metric={"name": "val_loss", "mode": "min", "value": loss},
                                   final={"val_loss": loss + (0.01 if extra_value == "b" else 0.0)})  # fmt: skip
                write_record(root / ",".join(overrides), record)


def by_hand() -> tuple[float, float, float]:
    dd = [
        (LOSS["muon", "swiglu"][s] - LOSS["adamw", "swiglu"][s]) - (LOSS["muon", "gelu"][s] - LOSS["adamw", "gelu"][s])
        for s in range(3)
    ]
    mean = sum(dd) / 3
    half = stats.t.ppf(0.975, 2) * stats.tstd(dd) / 3**0.5
    return mean, mean - half, mean + half


def test_a_two_axis_sweep_states_its_interaction_as_computed_by_hand(tmp_path):
    sweep(tmp_path)
    report = build_report(tmp_path, test="t")
    assert len(report.interactions) == 1
    found = report.interactions[0]
    mean, low, high = by_hand()  # (optim's effect at mlp=swiglu) - (at mlp=gelu): +0.07 on each seed's scale
    c = found.comparison
    assert found.axes == tuple(report.axes) and c.units == 3
    assert (c.delta_mean, c.low, c.high) == pytest.approx((mean, low, high), abs=1e-9)
    assert low > 0 and found.verdict == "interaction"
    text = write_report(tmp_path, plots=False, test="t")
    line = next(line for line in text.splitlines() if line.startswith("- interaction "))
    assert f"{mean:+.4f} [{low:+.4f}, {high:+.4f}]" in line and line.endswith(": interaction")
    assert "interact (below)" in text  # the pooled effects say they average over effects that differ
    with open(tmp_path / "report.csv") as f:
        rows = {(r["optim"], r["mlp"]): r for r in csv.DictReader(f)}
    assert float(rows["muon", "swiglu"]["interaction_delta"]) == pytest.approx(mean)
    assert rows["muon", "swiglu"]["interaction_verdict"] == "interaction"
    assert rows["adamw", "gelu"]["interaction_delta"] == ""  # only the variant away from both baselines


def test_parallel_effects_are_within_noise(tmp_path):
    global LOSS
    saved = dict(LOSS)
    try:
        LOSS = {**LOSS, ("muon", "swiglu"): [m - a + s for m, a, s in zip(LOSS["muon", "gelu"], LOSS["adamw", "gelu"],
                                                                        LOSS["adamw", "swiglu"], strict=True)]}
        sweep(tmp_path)
        (found,) = build_report(tmp_path, test="t").interactions
        assert found.comparison.delta_mean == pytest.approx(0, abs=1e-9) and found.verdict != "interaction"
    finally:
        LOSS = saved


def test_a_named_pair_is_stated_in_a_sweep_of_more_axes(tmp_path):
    sweep(tmp_path, more={"a": "a", "b": "b"}, interaction=["optim", "mlp"])
    report = build_report(tmp_path, test="t")
    assert len(report.axes) == 3 and [i.axes for i in report.interactions] == [("optim", "mlp")]
    assert report.interactions[0].comparison.delta_mean == pytest.approx(by_hand()[0])  # lr's shift cancels
    assert build_report(tmp_path, test="t", interaction=[]).interactions == []  # none unless named, beyond two


@pytest.mark.parametrize("bad", [["optim"], [["optim", "mlp", "pos"]], [3, 4], "optim"])
def test_a_bad_report_interaction_is_refused(bad):
    with pytest.raises(ConfigError, match="report.interaction"):
        report_interaction(bad)


def test_zoo_report_refuses_an_interaction_of_axes_it_did_not_sweep_before_writing_anything(tmp_path, capsys):
    """An axis the runs do not sweep (or the seed, or one axis twice): exit 1, one line naming the swept axes,
    and the report already there left as it is (its own interaction line kept)."""
    sweep(tmp_path)
    report_main([str(tmp_path), "--no-plots"])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert b"- interaction " in before["report.md"]
    capsys.readouterr()
    swept = ", ".join(build_report(tmp_path).axes)
    for bad, says in [
        ("nosuch,mlp", f"report.interaction='nosuch,mlp': 'nosuch' is not a swept axis; swept: {swept}"),
        ("optim,seed", f"report.interaction='optim,seed': 'seed' is not a swept axis; swept: {swept}"),
        ("mlp,mlp", "report.interaction='mlp,mlp': two different swept axes ('mlp' is named twice)"),
    ]:
        with pytest.raises(SystemExit) as exited:
            report_main([str(tmp_path), "--interaction", bad])
        printed = capsys.readouterr()
        assert exited.value.code == 1 and printed.out == "" and printed.err == f"zoo-report: {says}\n", printed
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_a_recorded_interaction_of_axes_not_swept_keeps_the_sweeps_own(tmp_path, caplog):
    """Runs recorded with a report.interaction naming an axis they do not sweep (launched before it was checked):
    the report says so and states the two-axis sweep's own interaction, not none."""
    sweep(tmp_path, interaction=["nosuch", "mlp"])
    report = build_report(tmp_path, test="t")
    assert [i.axes for i in report.interactions] == [tuple(report.axes)]
    assert "'nosuch' is not a swept axis" in caplog.text
