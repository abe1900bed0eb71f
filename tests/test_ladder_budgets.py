"""Which budgets a ladder's fit reads: those its sweep asked for (ladder.steps) and the longest (train.steps),
never a budget an earlier sweep into the same folder left there."""

from __future__ import annotations

from pathlib import Path

from helpers import fake_run
from omegaconf import OmegaConf

from zoo.lab.reports.ladder import ladder_lines
from zoo.lab.reports.report import asked_budgets
from zoo.lab.studies.variants import build_report


def ladder_folder(root: Path) -> None:
    """Runs of 40 steps at two widths, and their branches at 10, 20 and 30 steps under budgets/ (30: an earlier
    sweep's budget), every record saying ladder.steps=[10,30] as the first sweep launched them."""
    section = {"steps": [10, 30], "extrapolate": 10}
    for width in (16, 32):
        for seed in (0, 1):
            train = {"steps": 40, "branch": {"from": None, "step": None}}
            config = {"seed": seed, "block": {"d_model": width}, "train": train, "ladder": section}
            fake_run(root, [f"block.d_model={width}", f"seed={seed}"], value=3.0, config=config, flops=1e9)
            for budget in (10, 20, 30):
                branch = {"from": str(root / f"block.d_model={width},seed={seed}"), "step": budget // 2}
                config = {**config, "train": {"steps": budget, "branch": branch}}
                overrides = [f"block.d_model={width}", f"seed={seed}", f"train.steps={budget}"]
                fake_run(root / "budgets", overrides, value=3.5, config=config, flops=1e8, branch=branch)


def read_steps(monkeypatch) -> list[set[int]]:
    """The budgets (train.steps) of the runs each ladder fit is given, call by call."""
    seen: list[set[int]] = []

    def study(runs, *args, **kwargs):
        seen.append({r.record.config["train"]["steps"] for r in runs})
        from zoo.lab.studies.ladder.study import LadderStudy

        return LadderStudy("val_bpb", [], (), 10.0)

    monkeypatch.setattr("zoo.lab.studies.ladder.study.ladder_study", study)
    return seen


def test_a_ladder_reads_the_budgets_it_was_asked_for_and_says_which_it_left_out(tmp_path, monkeypatch):
    ladder_folder(tmp_path)
    seen = read_steps(monkeypatch)
    asked = build_report(tmp_path, ladder=[10, 20])  # the sweep run again with ladder.steps=[10,20]
    recorded = build_report(tmp_path)  # zoo-report: the budgets its runs recorded
    assert seen == [{10, 20, 40}, {10, 30, 40}]
    assert asked.ladder_left_out == [30] and recorded.ladder_left_out == [20]
    assert "Budgets read: 10, 20, 40 (ladder.steps and train.steps); left out: 30 (in the folder, not asked for)." \
        in ladder_lines(asked)  # fmt: skip


def test_the_sweeps_report_asks_for_the_sweeps_own_budgets():
    config = OmegaConf.create({"ladder": {"steps": [10, 20], "extrapolate": 10}, "train": {"steps": 40}})
    assert asked_budgets(config) == [10, 20]
    assert asked_budgets(OmegaConf.create({"ladder": {"steps": None}, "train": {"steps": 40}})) is None
