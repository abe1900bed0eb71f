"""The report's line of settings a sweep fixed on every run (zoo/lab/studies/fixed.py)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from zoo.assembly.compose import compose_with_choices
from zoo.lab.records.summary import RunRecord
from zoo.lab.studies.fixed import fixed_line, fixed_settings
from zoo.lab.studies.runset import Run


def run_of(overrides: list[str]) -> Run:
    """A run as zoo-train records it: the composed config and Hydra's group choices."""
    cfg, choices = compose_with_choices(overrides)
    record = RunRecord(config=OmegaConf.to_container(cfg, resolve=True), choices=choices, overrides=overrides)
    return Run(Path("/runs") / ",".join(overrides), record, {})


def test_settings_every_run_shares_beyond_the_defaults_and_nothing_else():
    fixed = ["norm=rmsnorm", "block.attn.window=4", "train.steps=7", "threads=1", "+model.layers.1.attn=mqa"]
    runs = [run_of([f"placement={p}", f"attn={a}", *fixed]) for p, a in (("pre", "gqa"), ("post", "mha"))]
    assert fixed_settings(runs) == [
        "norm=rmsnorm",  # a group choice zoo's defaults do not make
        "block.attn.window=4",  # set beside the choice; rmsnorm's own eps (1e-6) is not listed
        "model.layers.1.attn=mqa",
        "train.steps=7",  # threads is runtime-only; placement and attn vary, so the table shows them
    ]
    assert fixed_line(runs) == [
        "",
        "Fixed in every run (not zoo's defaults): norm=rmsnorm, block.attn.window=4, model.layers.1.attn=mqa, "
        "train.steps=7",
    ]
    assert fixed_line([run_of([]), run_of(["seed=1"])]) == []  # only defaults: no line


def test_a_sweep_files_settings_are_listed_not_hidden_behind_its_choice():
    runs = [run_of(["+sweeps=quick", f"pos={pos}"]) for pos in ("none", "rotary")]
    settings = fixed_settings(runs)
    assert settings[:2] == ["block.d_model=64", "block.n_heads=4"] and "train.steps=200" in settings
    assert not any(s.startswith(("sweeps=", "threads=", "pos=")) for s in settings)


def test_the_vocabulary_a_run_took_from_its_task_is_no_setting_but_one_set_by_hand_is():
    """model.vocab_size: null records the task's vocabulary (zoo.lab.planning.run_model): not listed as fixed."""
    from zoo.lab.planning.run_model import with_task_vocab

    def recorded(overrides: list[str]) -> Run:
        run = run_of(overrides)
        run.record.config = with_task_vocab(run.record.config)  # as zoo-train records it
        return run

    assert fixed_settings([recorded([f"seed={s}"]) for s in (0, 1)]) == []
    assert fixed_settings([recorded([f"seed={s}", "model.vocab_size=512"]) for s in (0, 1)]) == ["model.vocab_size=512"]
