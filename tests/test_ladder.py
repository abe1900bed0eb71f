"""The scaling ladder (zoo/lab/studies/ladder/study.py) on synthetic ladders shaped like sweeps/ladder.yaml
(zoo/lab/studies/ladder/planted.py), drawn from known laws of each run's compute: crossing curves are scale-dependent
where they cross, a variant under every loss the baseline reaches is not reached with its measured bound, a
pair's answer does not move with a third variant, seeds that disagree or are paired wrongly are caught, the
wall-time reading counts each run's seconds, the envelope is read in logs, the law's held-out check holds its
largest width out and its floor rule reads half the interval. Their error rates: tests/test_ladder_rates.py.
In-memory cells, but for one report written from run folders end to end."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import fake_run, tiny_cli
from matplotlib.image import imread

from zoo.core.errors import ConfigError
from zoo.lab.planning.sweep import check_ladder
from zoo.lab.records.config import config_hash
from zoo.lab.reports.report import write_report
from zoo.lab.studies.ladder import iso
from zoo.lab.studies.ladder import study as ladder
from zoo.lab.studies.ladder.law import HeldOut, PowerLaw, fit_laws, held_out, parameters
from zoo.lab.studies.ladder.planted import BUDGETS, C0, LARGEST, SEEDS, WIDTHS, answers, base_law, draw, flops
from zoo.lab.studies.ladder.study import Cell, LadderError, LadderStudy, answer_all, check_rungs, envelope, fit_law
from zoo.lab.studies.tune import variant_hash
from zoo.lab.training.ladder_runs import branch_name

#: Bootstrap draws where one answer is read (the report's are zoo.lab.studies.ladder.iso.DRAWS).
DRAWS = 200


def steep(x):
    """A companion whose loss falls faster, to a lower floor: a sweep-wide fit's floor follows it."""
    return 2.0 + 0.6 * x**-0.5


def test_crossing_curves_are_scale_dependent_where_they_cross():
    for i in range(3):
        study = answers({"base": base_law, "cross": lambda x: 3.0 + 0.5 * x**-0.6}, np.random.default_rng(200 + i))
        a = study.rows[("cross",)].answer
        assert a.verdict == "scale-dependent", a.verdict
        assert 0.5 < a.crossing_compute / C0 < 2  # the laws cross at C0


def test_a_variant_under_every_loss_the_baseline_reaches_is_not_reached_with_its_measured_bound():
    below = lambda x: 2.0 + 0.5 * x**-0.3  # noqa: E731
    a = answers({"base": base_law, "below": below}, np.random.default_rng(400)).rows[("below",)].answer
    assert a.verdict == "not reached" and math.isnan(a.multiplier) and math.isnan(a.low)
    smallest = flops(WIDTHS[0], BUDGETS[0])
    assert a.data_lower_bound == pytest.approx(LARGEST / smallest)  # the baseline's most over the variant's least
    worse = answers({"base": base_law, "above": lambda x: 4.5 + 0.5 * x**-0.3}, np.random.default_rng(401))
    a = worse.rows[("above",)].answer
    assert a.verdict == "not reached" and a.data_upper_bound == pytest.approx(smallest / LARGEST)


def test_a_third_steep_variant_moves_a_pairs_answer_by_less_than_half_its_interval():
    shift = lambda x: base_law(2 * x)  # noqa: E731
    pair = answers({"base": base_law, "shift": shift}, np.random.default_rng(500), law=20)
    three = answers({"base": base_law, "shift": shift, "steep": steep},
                    np.random.default_rng(500), law=20)  # the same draws for base and shift, then steep's
    a, b = pair.rows[("shift",)].answer, three.rows[("shift",)].answer
    assert abs(math.log(a.multiplier / b.multiplier)) < math.log(a.high / a.low) / 4
    assert abs(math.log(a.law.multiplier / b.law.multiplier)) < math.log(a.law.high / a.law.low) / 4


def test_seeds_that_disagree_by_more_than_10x_leave_the_answer_unidentified():
    study = answers({"base": base_law, "shift": lambda x: base_law(2 * x)}, np.random.default_rng(600))
    row = study.rows[("shift",)]
    for s, shift in ((0, 40.0), (1, 40.0)):  # two seeds' runs of the variant at 40x the compute's worth
        row.per_seed[s] = [Cell(c.width, c.steps, c.compute, base_law(shift * c.compute / C0), c.time)
                           for c in row.per_seed[s]]  # fmt: skip
    a = ladder.compare(study.rows[("base",)], row, DRAWS)
    assert a.seed_spread > 10 and a.verdict == "unidentified"


def test_the_multiplier_in_wall_time_counts_each_runs_seconds():
    """Worth 2x the baseline's FLOPs but twice as slow per FLOP: half as much in wall time, its interval the
    FLOPs' own halved (times without noise of their own add none)."""
    study = answers({"base": base_law, "slow": lambda x: base_law(2 * x)}, np.random.default_rng(700),
                    slow={"seconds_per_flop": 2e-9})  # fmt: skip
    a = study.rows[("slow",)].answer
    own = a.pair.interval(a.pair.draws_low / 2)
    assert a.low > 1 and a.time == pytest.approx(a.multiplier / 2, rel=1e-9)
    assert (a.time_low, a.time_high) == pytest.approx(own, rel=1e-9)


def test_seeds_paired_wrongly_are_caught():
    """A planted bug: the variant's replicates against the baseline's of another seed. A seed's offset is
    shared by its runs of both variants (its data order), so only the right pairing cancels it."""
    rng = np.random.default_rng(800)
    offsets = rng.normal(0, 0.05, SEEDS)

    def seeded(law):
        return {s: [Cell(w, b, flops(w, b), law(flops(w, b) / C0) + offsets[s] + rng.normal(0, 0.003))
                    for w in WIDTHS for b in BUDGETS] for s in range(SEEDS)}  # fmt: skip

    base, shift = seeded(base_law), seeded(lambda x: base_law(2 * x))
    rotated = {(s + 1) % SEEDS: cells for s, cells in shift.items()}
    right, wrong = (answer_all(LadderStudy("val_bpb", ["mlp"], ("base",), 10.0), {("base",): base, ("shift",): v},
                               DRAWS, law=0).rows[("shift",)].answer for v in (shift, rotated))  # fmt: skip
    assert right.low < 2 < right.high
    assert math.log(wrong.high / wrong.low) > 3 * math.log(right.high / right.low)


def test_the_synthetic_law_has_an_envelope_of_every_width():
    cells = [Cell(w, s, flops(w, s), base_law(flops(w, s) / C0)) for w in WIDTHS for s in BUDGETS]
    assert {c.width for c in envelope(cells)} == set(WIDTHS)


def test_the_fit_recovers_a_pure_power_law_exactly():
    law = PowerLaw(E=1.1, A=0.7, alpha=0.3, c0=1e12)
    cells = [Cell(i, 1, c, law.loss(c)) for i, c in enumerate((1e11, 3e11, 1e12, 3e12, 1e13))]
    fit = fit_law(cells, 1e12, "pure")
    assert (fit.E, fit.A, fit.alpha) == pytest.approx((1.1, 0.7, 0.3), rel=1e-3)
    assert max(abs(r) for r in fit.residuals) < 1e-6
    assert math.isinf(fit.compute_for(1.0))  # below the floor E: never reached


def test_a_ladder_too_small_is_refused_by_name():
    cells = draw(base_law, np.random.default_rng(900))
    two = {s: [c for c in cs if c.width in (32, 48)] for s, cs in cells.items()}
    message = "mlp=base: 2 widths (block.d_model) finished (32, 48); a ladder needs at least 3"
    with pytest.raises(LadderError, match=re.escape(message)):
        check_rungs(two, "mlp=base")
    with pytest.raises(LadderError, match="2 cells on the compute-optimal envelope"):
        fit_law([Cell(32, 100, 1e9, 3.0), Cell(64, 100, 4e9, 2.5)], 1e9, "two cells")


def test_a_data_seed_left_null_keeps_every_existing_runs_hash():
    config = {"seed": 3, "block": {"d_model": 32}, "train": {"steps": 10, "lr": 1e-3}}
    # the hash main 9facfbe gave this config, before data_seed existed
    assert config_hash({**config, "data_seed": None}) == config_hash(config) == "3fbe93cb8e0d3a42"
    assert config_hash({**config, "data_seed": 3}) != config_hash(config)  # set, it is what the run computes


def test_data_seed_orders_the_data_alone_and_names_the_replicate():
    from zoo.lab.planning.train_config import data_seed
    from zoo.lab.records.summary import RunRecord
    from zoo.lab.studies.runset import Run

    assert data_seed({"seed": 3}) == data_seed({"seed": 3, "data_seed": None}) == 3  # as before the key
    assert data_seed({"seed": 3, "data_seed": 7}) == 7
    runs = [Run(Path(f"r{s}{d}"), RunRecord(config={"seed": s, "data_seed": d}), {}) for s in (0,) for d in (1, 2)]
    assert [r.seed for r in runs] == ["0 (data 1)", "0 (data 2)"]  # two replicates, not one seed twice
    assert ladder.noise_source(runs) == "data order only (data_seed; seed fixed)"
    old = [Run(Path(f"r{s}"), RunRecord(config={"seed": s}), {}) for s in (0, 1)]
    assert [r.seed for r in old] == [0, 1] and ladder.noise_source(old) == "init and data order (seed)"


def test_the_rate_is_checked_per_budget_on_the_tuning_runs_decays():
    from zoo.lab.records.summary import RunRecord
    from zoo.lab.studies.runset import Run

    loss = {(800, 1e-3): 3.10, (800, 3e-3): 3.00, (240, 1e-3): 3.30, (240, 3e-3): 3.40, (80, 3e-3): 3.6}
    runs = [Run(Path(f"{s},{lr}"), RunRecord(status="ok", config={"train": {"steps": s, "lr": lr}},
                                             final={"val_bpb": v}), {"mlp": "gelu"}) for (s, lr), v in loss.items()]
    text = ladder.rate_check(runs, ["mlp"], "val_bpb")[("gelu",)]
    assert text == "80: the tuned 0.003; 240: 0.001 (+3.0% at the tuned 0.003); 800: the tuned 0.003"


def write_ladder(root: Path, rng: np.random.Generator) -> None:
    """Fake run folders of a base and a 2x-shifted variant (5 widths x 3 budgets x 5 seeds), no ``data_seed``
    in their configs: run folders as recorded before the key; the narrowest width's runs on a machine loaded
    past its cores."""
    for job, (name, law) in enumerate({"base": base_law, "shift": lambda x: base_law(2 * x)}.items()):
        for s, cells in draw(law, rng).items():
            for c in cells:
                config = {"seed": s, "block": {"d_model": c.width}, "train": {"steps": c.steps},
                          "ladder": {"steps": list(BUDGETS[:-1]), "extrapolate": 10}}  # fmt: skip
                overrides = [f"mlp={name}", f"block.d_model={c.width}", f"train.steps={c.steps}", f"seed={s}"]
                load = {"start": 3.5 if c.width == WIDTHS[0] else 1.0, "end": 1.0, "cores": 1, "machine_cores": 2}
                fake_run(root, overrides, value=c.loss, config=config, flops=c.compute, job=job,
                         train_time_s=c.time, load=load)  # fmt: skip


def test_the_report_of_a_ladder_has_its_section_csv_and_plot(tmp_path):
    write_ladder(tmp_path, np.random.default_rng(1000))
    text = write_report(tmp_path)
    section = text[text.index("Ladder (ladder.steps"):]
    assert "| mlp=shift |" in section and "| mlp=base |" in section and "init and data order (seed)" in section
    assert "Holm-corrected over the ladder's 1 variants" in section
    assert "30 of 150 runs trained while the machine's load average exceeded its cores" in section
    assert re.search(r"a seed's offset sd (?:0|0\.0\d+), a run's own sd 0\.0\d+ \(0\.0\d+ at 80 steps, ", section)
    with open(tmp_path / "ladder.csv") as f:
        rows = {r["mlp"]: r for r in csv.DictReader(f)}
    shift, base = rows["shift"], rows["base"]
    assert float(shift["multiplier_ci_low"]) < 2 < float(shift["multiplier_ci_high"]) and shift["verdict"] == "better"
    assert float(shift["p_holm"]) == float(shift["p_value"]) < 0.05  # one variant: Holm changes nothing
    assert float(shift["loss_lowest_shared"]) < float(shift["loss_read"]) < float(shift["loss_read_mid"])
    assert base["verdict"] == "baseline" and base["multiplier"] == "" and base["seeds"] == "5"
    assert float(shift["time_multiplier"]) == pytest.approx(float(shift["multiplier"]))
    assert float(shift["baseline_extrapolation"]) > 1 and shift["law_verdict"]
    assert shift["data_lower_bound"] == "" and shift["crossing_compute"] == ""
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
    reordered = {**wide, "data_seed": 3}  # its data order drawn apart from its seed: the same variant, tuned once
    assert variant_hash(reordered, any_width=True) == variant_hash(small, any_width=True)


@pytest.mark.slow
def test_a_ladder_sweep_branches_its_budgets_and_a_null_variant_gets_a_multiplier_of_1(tmp_path):
    """``zoo-sweep ladder`` end to end at tiny sizes: 3 widths x 3 seeds x 2 variants that compute the same
    thing (attention on sdpa and on the math backend) to 40 steps, the 10- and 20-step budgets branched from
    their checkpoints into budgets/, and the report's multiplier of one backend against the other holding 1."""
    tiny = [f"{k}={v}" for k, v in tiny_cli(steps=40).items() if k != "block.d_model"]
    args = ["ladder", "block.d_model=16,24,32", "block.attn.backend=sdpa,math", "pos=none", "mlp=gelu", "tune.lr=null",
            "seed=0,1,2", "train.warmup_steps=2", "train.checkpoint_every=4", "train.keep_checkpoints=10",
            "ladder.steps=[10,20]",
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




def test_the_envelope_is_read_in_log_cost_and_log_loss():
    """On a pure power law (no floor) log L is a straight line in log C, so a reading between two cells is
    exact in both directions; read linearly in C or in L it would be off by percents."""
    costs = np.geomspace(1e9, 1e12, 4)
    law = lambda c: 5.0 * (c / 1e9) ** -0.2  # noqa: E731
    between = math.sqrt(costs[1] * costs[2])
    assert iso.cost_at(iso.front(costs, law(costs)), law(between)) == pytest.approx(between, rel=1e-9)
    assert iso.envelopes(costs, law(costs)).loss_at(np.array([between]))[0, 0] == pytest.approx(law(between), rel=1e-9)


def test_the_held_out_check_refits_without_the_largest_width():
    """Every width but the largest on exact laws (a shared floor), the largest 3% below them: a refit without
    it recovers the laws, and its error on the largest width is exactly |log 0.97|; a refit that kept the
    largest width would bend toward it and show less."""
    cells = {name: [Cell(w, s, flops(w, s), law(flops(w, s) / C0) * (0.97 if w == WIDTHS[-1] else 1.0))
                    for w in WIDTHS for s in BUDGETS]
             for name, law in (("b", base_law), ("v", lambda x: base_law(2 * x)))}  # fmt: skip
    fits = fit_laws(cells, C0, "pair")
    held = held_out(cells["b"], cells["v"], C0, parameters(fits["b"], fits["v"]))
    assert held is not None and held.width == WIDTHS[-1]
    assert held.base_error == pytest.approx(-math.log(0.97), rel=1e-3)
    assert held.var_error == pytest.approx(-math.log(0.97), rel=1e-3)


@pytest.mark.parametrize("half_widths, floor_dependent", [(1.5, True), (0.9, False)])
def test_the_floor_rule_holds_the_own_floors_answer_to_half_the_intervals_width(half_widths, floor_dependent):
    """The answer under each curve's own floor 1.5 half-widths (log) from the shared floor's, inside the
    interval's full width, is floor-dependent; 0.9 half-widths is not."""
    half = math.log(4.0 / 1.0) / 2
    law = ladder.Law(multiplier=2.0, low=1.0, high=4.0, own_floors=2.0 * math.exp(half_widths * half),
                     baseline_extrapolation=1.0, predicted_difference=0.1, held_out=HeldOut(128, 1e-3, 1e-3, 1.0))
    assert (ladder.law_verdict(law) == "floor-dependent") is floor_dependent
