"""The scaling ladder's fit (zoo/lab/studies/ladder.py) on synthetic ladders drawn from a known law: a variant
that is the baseline with its compute divided by m has multiplier m at every compute, recovered from fake
run folders; a variant equal to the baseline gets an interval holding 1; seeds paired wrongly, or FLOPs read
from the wrong run, fail; a ladder too small is refused by name."""

from __future__ import annotations

import csv
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fake_run, tiny_cli
from matplotlib.image import imread

from zoo.core.errors import ConfigError
from zoo.lab.planning.sweep import check_ladder
from zoo.lab.reports.report import write_report
from zoo.lab.studies import ladder
from zoo.lab.studies.ladder import Cell, LadderError, envelope, fit_law, ladder_study
from zoo.lab.studies.tune import variant_hash
from zoo.lab.studies.variants import build_report
from zoo.lab.training.ladder_runs import branch_name

WIDTHS = (32, 48, 64, 96)
BUDGETS = (250, 500, 1000)
TOKENS_PER_STEP = 1536
#: Each seed's offset, shared by every variant on that seed (its data order and initial draw).
SEED_OFFSET = {0: -0.03, 1: 0.0, 2: 0.04}


def params(width: int) -> int:
    return 24 * width * width + 256 * width


def true_loss(width: int, steps: int) -> float:
    """A Chinchilla-shaped law in parameters and tokens: every width wins at some budget."""
    return 1.2 + 30.0 / params(width) ** 0.34 + 90.0 / (steps * TOKENS_PER_STEP) ** 0.28


def write_ladder(root: Path, variants: dict[str, float], noise: float = 0.002, seed: int = 0) -> None:
    """Fake run folders: for each ``{mlp value: compute divisor m}``, every width, budget and seed; the loss is
    the law's (plus the seed's shared offset and a little independent noise), the FLOPs ``6 P T / m``."""
    rng = random.Random(seed)
    for job, (name, m) in enumerate(variants.items()):
        for width in WIDTHS:
            for steps in BUDGETS:
                for s, offset in SEED_OFFSET.items():
                    loss = true_loss(width, steps) * (1 + offset) + rng.gauss(0, noise)
                    flops = 6 * params(width) * steps * TOKENS_PER_STEP / m
                    config = {"seed": s, "block": {"d_model": width}, "train": {"steps": steps},
                              "ladder": {"steps": list(BUDGETS[:-1]), "extrapolate": 10}}  # fmt: skip
                    overrides = [f"mlp={name}", f"block.d_model={width}", f"train.steps={steps}", f"seed={s}"]
                    fake_run(root, overrides, value=loss, config=config, flops=flops, job=job)


def study(root: Path, test: str = "t", extrapolate: float = 10.0) -> ladder.LadderStudy:
    report = build_report(root)
    return ladder_study(report.runs, report.axes, {"mlp": "base"}, "val_bpb", "min", test, extrapolate)


def test_the_synthetic_law_has_an_envelope_of_several_widths():
    cells = [Cell(w, s, 6 * params(w) * s * TOKENS_PER_STEP, true_loss(w, s)) for w in WIDTHS for s in BUDGETS]
    assert len({c.width for c in envelope(cells)}) >= 3  # the ladder can show what it is for


def test_a_known_multiplier_is_recovered_within_2_percent(tmp_path):
    write_ladder(tmp_path, {"base": 1.0, "better": 1.5, "worse": 0.8})
    result = study(tmp_path)
    assert not result.errors, result.errors
    better, worse = result.rows[("better",)], result.rows[("worse",)]
    assert better.multiplier.mean == pytest.approx(1.5, rel=0.02) and better.multiplier.verdict == "better"
    assert better.multiplier.low < 1.5 < better.multiplier.high
    assert worse.multiplier.mean == pytest.approx(0.8, rel=0.02) and worse.multiplier.verdict == "worse"
    far = better.multiplier_far  # a compute shift holds at every compute; ten times further out, less sure
    assert far.low < 1.5 < far.high and far.high - far.low > better.multiplier.high - better.multiplier.low
    assert abs(better.alpha_delta.mean) < 0.02 and better.alpha_delta.verdict == "within noise"
    for s, fit in better.seed_fits.items():  # each seed's multiplier, its own variant against its own baseline
        base = result.rows[("base",)].seed_fits[s]
        assert ladder.multiplier(fit, base, better.compute) == pytest.approx(1.5, rel=0.05)


def test_a_variant_that_changes_nothing_gets_an_interval_holding_1(tmp_path):
    write_ladder(tmp_path, {"base": 1.0, "same": 1.0}, noise=0.004)
    same = study(tmp_path).rows[("same",)]
    assert same.multiplier.low < 1 < same.multiplier.high and same.multiplier.verdict == "within noise"


def test_seeds_paired_wrongly_are_caught(tmp_path, monkeypatch):
    """A planted bug: each variant seed's law compared with the baseline's of another seed."""
    write_ladder(tmp_path, {"base": 1.0, "better": 1.5})
    right = study(tmp_path).rows[("better",)].multiplier

    def rotated(row, base, test, extrapolate):
        seeds = sorted(base.seed_fits)
        base.seed_fits = {s: base.seed_fits[seeds[(i + 1) % len(seeds)]] for i, s in enumerate(seeds)}
        return compare(row, base, test, extrapolate)

    compare = ladder.compare_rows
    monkeypatch.setattr(ladder, "compare_rows", rotated)
    wrong = study(tmp_path).rows[("better",)].multiplier
    assert wrong.high - wrong.low > 3 * (right.high - right.low)  # the shared seed offsets no longer cancel


def test_flops_not_the_runs_own_are_caught(tmp_path, monkeypatch):
    """A planted bug: each cell's compute taken from its rung (width and budget, as another variant's run of the
    same rung spent) rather than from the run's own FLOPs: the variant's saving vanishes."""
    write_ladder(tmp_path, {"base": 1.0, "better": 1.5})
    cells = ladder.ladder_cells

    def by_rung(runs, metric):
        out = cells(runs, metric)
        return {s: [Cell(c.width, c.steps, 6 * params(c.width) * c.steps * TOKENS_PER_STEP, c.loss) for c in cs]
                for s, cs in out.items()}  # fmt: skip

    monkeypatch.setattr(ladder, "ladder_cells", by_rung)
    assert study(tmp_path).rows[("better",)].multiplier.mean == pytest.approx(1.0, abs=0.02)


def test_a_ladder_too_small_is_refused_by_name(tmp_path):
    write_ladder(tmp_path, {"base": 1.0, "better": 1.5})
    for path in tmp_path.glob("*block.d_model=9*"):
        for f in path.iterdir():
            f.unlink()
        path.rmdir()
    for path in tmp_path.glob("*block.d_model=64*"):
        for f in path.iterdir():
            f.unlink()
        path.rmdir()
    result = study(tmp_path)
    assert not result.rows
    assert any("mlp=base: 2 widths (block.d_model) finished (32, 48); a ladder needs at least 3" in e
               for e in result.errors)  # fmt: skip
    with pytest.raises(LadderError, match="2 cells on the compute-optimal envelope"):
        fit_law([Cell(32, 100, 1e9, 3.0), Cell(64, 100, 4e9, 2.5)], 1e9, "two cells")


def test_the_fit_recovers_a_pure_power_law_exactly():
    law = ladder.PowerLaw(E=1.1, A=0.7, alpha=0.3, c0=1e12)
    cells = [Cell(i, 1, c, law.loss(c)) for i, c in enumerate((1e11, 3e11, 1e12, 3e12, 1e13))]
    fit = fit_law(cells, 1e12, "pure")
    assert (fit.E, fit.A, fit.alpha) == pytest.approx((1.1, 0.7, 0.3), rel=1e-3)
    assert max(abs(r) for r in fit.residuals) < 1e-6
    assert math.isinf(fit.compute_for(1.0))  # below the floor E: never reached


def test_the_report_of_a_ladder_has_its_section_csv_and_plot(tmp_path):
    write_ladder(tmp_path, {"base": 1.0, "better": 1.5})
    text = write_report(tmp_path)
    section = text[text.index("Ladder (ladder.steps"):]
    assert "| mlp=better |" in section and "| better |" in section and "| mlp=base |" in section
    with open(tmp_path / "ladder.csv") as f:
        rows = {r["mlp"]: r for r in csv.DictReader(f)}
    assert float(rows["better"]["multiplier"]) == pytest.approx(1.5, rel=0.02)
    assert float(rows["better"]["multiplier_ci_low"]) < 1.5 < float(rows["better"]["multiplier_ci_high"])
    assert rows["better"]["verdict"] == "better" and rows["base"]["verdict"] == "baseline"
    assert float(rows["better"]["compute_extrapolated"]) == pytest.approx(10 * float(rows["better"]["compute"]))
    assert int(rows["base"]["envelope_cells"]) >= 3 and rows["base"]["seeds"] == "3"
    assert imread(tmp_path / "ladder.png").shape[1] > 1000


def test_a_sweep_that_is_not_a_ladder_gets_no_ladder_section(tmp_path):
    for seed in range(3):
        fake_run(tmp_path, ["mlp=gelu", f"seed={seed}"], value=3.0 + seed * 0.01)
        fake_run(tmp_path, ["mlp=swiglu", f"seed={seed}"], value=2.9 + seed * 0.01)
    text = write_report(tmp_path)
    assert "Ladder" not in text and not (tmp_path / "ladder.csv").exists() and not (tmp_path / "ladder.png").exists()


WSD_LADDER = {"schedule": {"name": "wsd", "decay_fraction": 0.2}, "ladder": {"steps": [200, 400]},
              "train": {"steps": 800, "checkpoint_every": 160, "keep_checkpoints": 4}}  # fmt: skip


@pytest.mark.parametrize(
    "change, widths, message",
    [
        ({}, ["32", "64"], "block.d_model='32,64': at least 3 widths"),
        ({"ladder": {"steps": [400]}}, ["32", "48", "64"], "at least 2 shorter budgets"),
        ({"ladder": {"steps": [200, 900]}}, ["32", "48", "64"], "distinct step counts below train.steps=800"),
        ({"schedule": {"name": "cosine"}}, ["32", "48", "64"], "schedule='cosine': wsd for a ladder"),
        ({"train": {"steps": 800, "checkpoint_every": 100, "keep_checkpoints": 4}}, ["32", "48", "64"],
         "train.checkpoint_every=100: a divisor of every branch's start, [160, 320]"),
        ({"train": {"steps": 800, "checkpoint_every": 160, "keep_checkpoints": 2}}, ["32", "48", "64"],
         "train.keep_checkpoints=2: at least 4"),
    ],
)  # fmt: skip
def test_a_ladder_that_cannot_be_fitted_or_branched_is_refused_before_any_run(change, widths, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_ladder({**WSD_LADDER, **change}, widths)


def test_a_ladder_that_can_be_branched_passes_and_names_its_branches():
    assert check_ladder(WSD_LADDER, ["32", "48", "64", "96"]) == [200, 400]
    assert check_ladder({**WSD_LADDER, "ladder": {"steps": None}}, ["32"]) == []  # not a ladder: nothing to check
    assert branch_name("block.d_model=32,seed=0,train.steps=800", 200) == "block.d_model=32,seed=0,train.steps=200"
    assert branch_name("block.d_model=32,seed=0", 200) == "block.d_model=32,seed=0,train.steps=200"


def test_tune_width_matches_a_variants_runs_at_every_width_to_its_tuning_runs():
    small = {"block": {"d_model": 64, "n_heads": 4}, "seed": 0, "train": {"lr": 1e-3}}
    wide = {"block": {"d_model": 128, "n_heads": 4}, "seed": 1, "train": {"lr": 3e-3}}
    assert variant_hash(small, any_width=True) == variant_hash(wide, any_width=True)
    assert variant_hash(small) != variant_hash(wide)
    other = {"block": {"d_model": 128, "n_heads": 2}, "seed": 1, "train": {"lr": 3e-3}}
    assert variant_hash(other, any_width=True) != variant_hash(small, any_width=True)  # another variant


@pytest.mark.slow
def test_a_ladder_sweep_branches_its_budgets_and_a_null_variant_gets_a_multiplier_of_1(tmp_path):
    """``zoo-sweep ladder`` end to end at tiny sizes: 3 widths x 3 seeds x 2 variants that compute the same
    thing (attention on sdpa and on the math backend) to 40 steps, the 10- and 20-step budgets branched from
    their checkpoints into budgets/, and the report's multiplier of one backend against the other holding 1."""
    tiny = [f"{k}={v}" for k, v in tiny_cli(steps=40).items() if k != "block.d_model"]
    args = ["ladder", "block.d_model=16,24,32", "block.attn.backend=sdpa,math", "pos=none", "mlp=gelu", "tune.lr=null",
            "train.warmup_steps=2", "train.checkpoint_every=4", "train.keep_checkpoints=10", "ladder.steps=[10,20]",
            *tiny, f"hydra.sweep.dir={tmp_path / 'ladder'}"]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "zoo.lab.commands.sweep", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    root = tmp_path / "ladder"
    branches = [json.loads(p.read_text()) for p in (root / "budgets").glob("*/summary.json")]
    assert len(branches) == 2 * 3 * 3 * 2 and {b["status"] for b in branches} == {"ok"}
    assert {(b["config"]["train"]["steps"], b["branch"]["step"]) for b in branches} == {(10, 8), (20, 16)}
    with open(root / "ladder.csv") as f:
        rows = {r["block.attn.backend"]: r for r in csv.DictReader(f)}
    assert rows["sdpa"]["verdict"] == "baseline"
    low, high = float(rows["math"]["multiplier_ci_low"]), float(rows["math"]["multiplier_ci_high"])
    assert low <= 1 <= high and rows["math"]["verdict"] == "within noise", rows["math"]
    assert "Ladder (ladder.steps" in (root / "report.md").read_text() and (root / "ladder.png").is_file()


def test_a_variant_too_small_for_a_fit_is_named_and_left_out_while_the_others_fit(tmp_path):
    write_ladder(tmp_path, {"base": 1.0, "better": 1.5, "worse": 0.8})
    for path in [*tmp_path.glob("mlp=worse,block.d_model=64*"), *tmp_path.glob("mlp=worse,block.d_model=96*")]:
        for f in path.iterdir():
            f.unlink()
        path.rmdir()
    result = study(tmp_path)
    assert set(result.rows) == {("base",), ("better",)}
    assert result.errors == ["mlp=worse: 2 widths (block.d_model) finished (32, 48); a ladder needs at least 3"]
    assert result.rows[("better",)].multiplier.mean == pytest.approx(1.5, rel=0.02)
