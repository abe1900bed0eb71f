"""Learning-rate sensitivity (Wortsman et al. 2023) from a sweep's tuning runs, the report's lr section,
columns and lr.png, and the spike column: all from fake summaries, checked against hand computations."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest
from helpers import fake_run
from matplotlib.image import imread
from scipy import stats as sps

from zoo.lab.reports.plots import plot_lr
from zoo.lab.reports.report import write_report
from zoo.lab.studies import sensitivity
from zoo.lab.studies.runset import grid_edge
from zoo.lab.studies.variants import build_report

RATES = (1e-3, 1e-2, 1e-1)
#: Each variant's final val_bpb per seed at each rate (None: the run diverged, no final metric).
GRID = {
    "none": {0: (3.0, 2.5, None), 1: (3.1, 2.6, 9.0), 2: (3.2, 2.7, 3.5)},  # seed 1 at 1e-1 ends above its init
    "rmsnorm": {0: (3.0, 2.6, 2.4), 1: (3.1, 2.7, 2.5), 2: (3.3, 2.6, 2.5)},
}
INITIAL = {0: 8.0, 1: 8.1, 2: 8.2}  # each seed's val_bpb at initialization (the same at every rate)
#: By hand: per seed, mean over the rates of min(value, initial) less the least of them (diverged: initial).
HAND = {
    "none": {0: (3.0 + 2.5 + 8.0) / 3 - 2.5, 1: (3.1 + 2.6 + 8.1) / 3 - 2.6, 2: (3.2 + 2.7 + 3.5) / 3 - 2.7},
    "rmsnorm": {0: (3.0 + 2.6 + 2.4) / 3 - 2.4, 1: (3.1 + 2.7 + 2.5) / 3 - 2.5, 2: (3.3 + 2.6 + 2.5) / 3 - 2.5},
}


def tuned_sweep(root: Path, initial: dict | None = INITIAL, metric: dict | None = None, grid: dict = GRID,
                searched: dict | None = None) -> None:  # fmt: skip
    """A sweep of qk_norm x 3 seeds whose tune/ holds every variant at every rate on the 3 tune seeds (each run
    recording its seed's ``initial`` metric, but seed 0's diverged runs; none when ``initial`` is None); the
    sweep's runs record ``searched`` as the rates tune.lr searched (none by default)."""
    metric = metric or {"name": "val_bpb", "mode": "min"}
    for norm, seeds in grid.items():
        for seed, values in seeds.items():
            for rate, value in zip(RATES, values, strict=True):
                extra = {"initial": {metric["name"]: initial[seed]}} if initial else {}
                if value is None and seed == 0:
                    extra = {}  # a run that diverged early may record nothing: its seed's initial is the others'
                status = "ok" if value is not None else "diverged"
                fake_run(root / "tune", [f"block.attn.qk_norm={norm}", f"seed={seed}", f"train.lr={rate}"],
                         status=status, value=value, metric=metric, **extra)  # fmt: skip
            tune = {"lr": 1e-2, "searched": searched or {}, "seeds": [0, 1, 2], "metric": metric["name"]}
            fake_run(root, [f"block.attn.qk_norm={norm}", f"seed={seed}"], value=2.5 + 0.01 * seed, metric=metric,
                     tune=tune, job=seed)  # fmt: skip


def rows(root: Path) -> dict[str, dict[str, str]]:
    with open(root / "report.csv") as f:
        return {r["block.attn.qk_norm"]: r for r in csv.DictReader(f)}


def test_the_sensitivity_per_seed_is_the_hand_computation_diverged_runs_at_init(tmp_path):
    tuned_sweep(tmp_path)
    study = build_report(tmp_path).lr
    assert study is not None and study.rates == list(RATES) and study.seeds == [0, 1, 2]
    for norm, hand in HAND.items():
        assert study.curves[(norm,)].per_seed == pytest.approx(hand, abs=1e-12)
    assert HAND["none"][1] != pytest.approx((3.1 + 2.6 + 9.0) / 3 - 2.6)  # without the min, seed 1 differs


def test_forgetting_the_min_with_the_initial_metric_is_caught(tmp_path, monkeypatch):
    """A planted bug: a run that ends worse than its initialization counted at its own value."""
    tuned_sweep(tmp_path)
    monkeypatch.setattr(sensitivity, "clipped", lambda value, initial, mode: initial if value is None else value)
    study = build_report(tmp_path).lr
    assert study.curves[("none",)].per_seed != pytest.approx(HAND["none"], abs=1e-12)


def test_diverged_runs_counted_as_missing_are_caught(tmp_path, monkeypatch):
    """A planted bug: diverged runs left out of the mean rather than counted at initialization."""
    tuned_sweep(tmp_path)

    def dropping(values, initial, mode):
        kept = [min(v, initial) for v in values if v is not None]
        return statistics.fmean(kept) - min(kept)

    monkeypatch.setattr(sensitivity, "seed_sensitivity", dropping)
    assert build_report(tmp_path).lr.curves[("none",)].per_seed != pytest.approx(HAND["none"], abs=1e-12)


def test_the_report_columns_carry_the_mean_interval_paired_difference_and_best_lr(tmp_path):
    tuned_sweep(tmp_path)
    text = write_report(tmp_path)
    got = rows(tmp_path)
    for norm, hand in HAND.items():
        values = list(hand.values())
        mean = statistics.fmean(values)
        half = sps.t.ppf(0.975, 2) * statistics.stdev(values) / 3**0.5
        row = got[norm]
        assert float(row["lr_sensitivity"]) == pytest.approx(mean)
        assert float(row["lr_sensitivity_ci_low"]) == pytest.approx(max(mean - half, 0.0))  # never below 0
        assert float(row["lr_sensitivity_ci_high"]) == pytest.approx(mean + half)
        assert row["lr_sensitivity_clipped"] == str(mean - half < 0).lower()
        assert row["lr_sensitivity_seeds"] == "3"
    assert got["none"]["lr_sensitivity_clipped"] == "true"  # 2.0, 2.0, 0.43: the t interval reaches -0.77
    # best_lr: the best mean over seeds among rates where every seed finished (none: 1e-1 diverged on seed 0)
    assert float(got["none"]["best_lr"]) == 1e-2 and float(got["rmsnorm"]["best_lr"]) == 1e-1
    diffs = [HAND["rmsnorm"][s] - HAND["none"][s] for s in range(3)]  # the baseline: qk_norm=none (job 0)
    d, half = statistics.fmean(diffs), sps.t.ppf(0.975, 2) * statistics.stdev(diffs) / 3**0.5
    rms = got["rmsnorm"]
    assert float(rms["lr_sensitivity_delta"]) == pytest.approx(d)
    assert float(rms["lr_sensitivity_delta_ci_low"]) == pytest.approx(d - half)
    assert float(rms["lr_sensitivity_delta_ci_high"]) == pytest.approx(d + half)
    assert rms["lr_sensitivity_verdict"] == ("better" if d + half < 0 else "within noise")
    assert got["none"]["lr_sensitivity_verdict"] == "baseline" and got["none"]["lr_sensitivity_delta"] == ""
    assert "Learning rate: the tuning runs (tune/), each variant at 3 rates on 3 seeds (0, 1, 2)" in text
    assert "| block.attn.qk_norm=none | 0.01 | 3.1000 [" in text and "| none ok (3 runs) |" not in text
    assert "(2/3 ok)" in text  # 1e-1 for none: one seed diverged
    assert "| best lr | lr sensitivity [95% CI] | Δ lr sensitivity vs block.attn.qk_norm=none |" in text
    assert imread(tmp_path / "lr.png").shape[1] > 600


def test_higher_is_better_metrics_are_mirrored(tmp_path):
    """Accuracy: per seed, the greatest of max(value, initial) less their mean; the best rate is the highest."""
    grid = {"none": {0: (0.3, 0.9, None), 1: (0.4, 0.8, 0.05), 2: (0.5, 0.95, 0.6)},
            "rmsnorm": {0: (0.8, 0.9, 0.9), 1: (0.85, 0.9, 0.95), 2: (0.9, 0.9, 0.9)}}  # fmt: skip
    acc = {"name": "val_accuracy", "mode": "max"}
    init = {0: 0.1, 1: 0.11, 2: 0.12}  # near chance
    tuned_sweep(tmp_path, initial=init, metric=acc, grid=grid)
    hand = {0: 0.9 - (0.3 + 0.9 + init[0]) / 3, 1: 0.8 - (0.4 + 0.8 + init[1]) / 3, 2: 0.95 - (0.5 + 0.95 + 0.6) / 3}
    study = build_report(tmp_path).lr
    assert study.mode == "max" and study.curves[("none",)].per_seed == pytest.approx(hand, abs=1e-12)
    assert study.curves[("none",)].best_lr == 1e-2 and study.curves[("rmsnorm",)].best_lr == 1e-1


def test_seed_sensitivity_is_zero_when_every_rate_reaches_the_best():
    assert sensitivity.seed_sensitivity([2.0, 2.0, 2.0], 5.0, "min") == 0
    assert sensitivity.seed_sensitivity([None, None], 5.0, "min") == 0  # all at init: nothing learned anywhere
    assert sensitivity.seed_sensitivity([1.0, None], 5.0, "min") == pytest.approx(2.0)
    assert sensitivity.seed_sensitivity([0.9, None], 0.1, "max") == pytest.approx(0.4)


def test_runs_without_an_initial_metric_get_no_sensitivity_and_the_report_says_why(tmp_path):
    tuned_sweep(tmp_path, initial=None)
    text = write_report(tmp_path)
    assert "Sensitivity not computed: no tuning run records its val_bpb at initialization" in text
    got = rows(tmp_path)
    assert got["none"]["lr_sensitivity"] == "" and got["none"]["lr_sensitivity_verdict"] == ""
    assert float(got["none"]["best_lr"]) == 1e-2  # the best rate needs no initial metric
    assert "lr sensitivity [" not in text.split("Learning rate:")[0]  # not in the main table
    assert (tmp_path / "lr.png").is_file()


def test_lr_png_draws_each_variants_mean_over_seeds_on_a_log_axis(tmp_path):
    tuned_sweep(tmp_path)
    report = build_report(tmp_path)
    fig = plot_lr(report, tmp_path / "lr.png")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    line = next(x for x in ax.get_lines() if x.get_label().startswith("block.attn.qk_norm=rmsnorm"))
    means = [statistics.fmean(GRID["rmsnorm"][s][i] for s in range(3)) for i in range(3)]
    assert list(line.get_xdata()) == list(RATES) and list(line.get_ydata()) == pytest.approx(means)
    none = next(x for x in ax.get_lines() if x.get_label().startswith("block.attn.qk_norm=none"))
    assert none.get_ydata()[2] == pytest.approx(statistics.fmean([9.0, 3.5]))  # the seeds that finished
    assert len(ax.collections) == 2  # one interval band per variant


def test_a_sweep_without_tuning_runs_has_no_lr_section_and_empty_columns(tmp_path):
    for seed in range(3):
        fake_run(tmp_path, ["norm=layernorm", f"seed={seed}"], value=3.0)
        fake_run(tmp_path, ["norm=rmsnorm", f"seed={seed}"], value=2.9)
    text = write_report(tmp_path)
    assert "Learning rate:" not in text and not (tmp_path / "lr.png").exists()
    assert rows_by_norm(tmp_path)["rmsnorm"]["lr_sensitivity"] == ""


def rows_by_norm(root: Path) -> dict[str, dict[str, str]]:
    with open(root / "report.csv") as f:
        return {r["norm"]: r for r in csv.DictReader(f)}


def test_the_spikes_column_counts_each_variants_spikes_and_says_which_runs(tmp_path):
    counts = {"layernorm": [0, 2, 1], "rmsnorm": [0, 0, 0]}
    for norm, per_seed in counts.items():
        for seed, n in enumerate(per_seed):
            spikes = {"count": n, "steps": list(range(10, 10 + 10 * n, 10)), "judged": 90}
            fake_run(tmp_path, [f"norm={norm}", f"seed={seed}"], value=3.0 - 0.1 * seed, spikes=spikes)
    fake_run(tmp_path, ["norm=dyt", "seed=0"], value=3.0)  # an older run: no spike score
    too_short = {"count": None, "steps": [], "judged": 0, "reason": "not measurable: ..."}
    fake_run(tmp_path, ["norm=layernorm", "seed=3"], value=3.0, spikes=too_short)
    logged_only = {"count": 0, "steps": []}  # judged on the logged curve only (an earlier score): it could not see
    for seed in range(2):
        fake_run(tmp_path, ["norm=none", f"seed={seed}"], value=3.0, spikes=logged_only)
    text = write_report(tmp_path)
    got = rows_by_norm(tmp_path)
    assert float(got["layernorm"]["spikes"]) == pytest.approx(1.0) and got["layernorm"]["spiked_runs"] == "2/3"
    assert float(got["rmsnorm"]["spikes"]) == 0 and got["rmsnorm"]["spiked_runs"] == "0/3"
    assert got["dyt"]["spikes"] == "" and got["dyt"]["spiked_runs"] == ""
    assert got["none"]["spikes"] == "" and got["none"]["spiked_runs"] == "not measurable"  # never 0
    assert "| spikes (mean; runs) |" in text and "| 1; 2/3 (1 not measurable) |" in text
    assert "| not measurable |" in text and "| 0; 0/3 |" in text
    with open(tmp_path / "runs.csv") as f:
        per_run = {(r["norm"], r["seed"]): r["spikes"] for r in csv.DictReader(f)}
    assert per_run[("layernorm", "1")] == "2" and per_run[("dyt", "0")] == ""
    assert per_run[("layernorm", "3")] == per_run[("none", "0")] == "not measurable"


def test_grid_edge_names_the_end_a_rate_is_at():
    assert grid_edge(1e-3, [1e-2, 1e-3, 1e-1]) == "lowest" and grid_edge(0.1, ["0.001", "0.01", "0.1"]) == "highest"
    assert grid_edge(1e-2, [1e-3, 1e-2, 1e-1]) is None
    assert grid_edge(1e-2, [1e-2]) is None and grid_edge(None, [1e-3, 1e-2]) is None  # no grid to be at the end of


def test_a_best_rate_at_the_end_of_the_grid_is_flagged_in_every_output(tmp_path):
    """rmsnorm's best rate is 0.1, the highest tried; none's 0.01 is inside the grid."""
    tuned_sweep(tmp_path)
    text = write_report(tmp_path)
    got = rows(tmp_path)
    assert got["rmsnorm"]["best_lr_edge"] == "highest" and got["none"]["best_lr_edge"] == ""
    assert "| block.attn.qk_norm=rmsnorm | 0.1 (edge: highest) |" in text
    assert "| block.attn.qk_norm=none | 0.01 |" in text
    edge = next(line for line in text.splitlines() if line.startswith("Edge of the grid"))
    assert edge.startswith("Edge of the grid: the best rate is the highest rate tried for block.attn.qk_norm=rmsnorm,")
    assert "qk_norm=none" not in edge and "lowest" not in edge and "one-sided" in edge
    fig = plot_lr(build_report(tmp_path), tmp_path / "lr.png")
    assert [t.get_text() for t in fig.axes[0].texts] == ["edge (highest)"]


def test_a_tuned_rate_at_the_end_of_the_searched_grid_is_flagged(tmp_path):
    searched = {"0.001": 3.0, "0.01": 3.2, "0.1": None}  # as summary.json holds it: 0.1 diverged
    for norm, lr in (("none", 1e-3), ("rmsnorm", 1e-2)):
        for seed in range(3):
            tune = {"lr": lr, "searched": searched, "seeds": [0], "metric": "val_bpb"}
            fake_run(tmp_path, [f"norm={norm}", f"seed={seed}"], value=3.0 - 0.01 * seed, tune=tune)
    text = write_report(tmp_path)
    got = rows_by_norm(tmp_path)
    assert got["none"]["lr_edge"] == "lowest" and got["rmsnorm"]["lr_edge"] == ""
    assert "| 0.001 (edge: lowest) |" in text and "| 0.01 |" in text
    assert "Edge of the grid: the tuned rate is the lowest rate tried for norm=none, so" in text


def test_the_header_the_lr_section_and_the_lr_column_read_one_grid_per_variant(tmp_path):
    """tune/ holds an earlier, wider sweep's runs (up to 0.1), but this sweep's runs were tuned on 0.001 and 0.01
    (their ``tune.searched``) and took 0.01, the highest of that grid, where 0.1 would be the best of tune/: the
    header, the learning-rate section and the lr columns all read the grid tune.lr searched, and mark 0.01 as
    its highest rate; the runs at 0.1 are left out and said to be."""
    grid = {"none": {0: (3.0, 2.5, 2.0), 1: (3.1, 2.6, 2.1), 2: (3.2, 2.7, 2.2)},
            "rmsnorm": {0: (3.0, 2.6, 2.4), 1: (3.1, 2.7, 2.5), 2: (3.3, 2.8, 2.5)}}  # fmt: skip
    tuned_sweep(tmp_path, grid=grid, searched={"0.001": 3.1, "0.01": 2.6})
    text = write_report(tmp_path)
    got = rows(tmp_path)
    study = build_report(tmp_path).lr
    assert study.rates == [1e-3, 1e-2] and len(study.outside) == 6
    for norm in grid:
        assert [p.rate for p in study.curves[(norm,)].points] == [1e-3, 1e-2]
        assert float(got[norm]["best_lr"]) == float(got[norm]["lr"]) == 1e-2
        assert got[norm]["best_lr_edge"] == got[norm]["lr_edge"] == "highest"
    hand = (3.0 + 2.5) / 2 - 2.5  # seed 0 of none over the searched grid: 0.1 is not in it
    assert study.curves[("none",)].per_seed[0] == pytest.approx(hand)
    assert "Learning rate tuned per variant (tune.lr): each tried at 0.001, 0.01 on seed 0, 1, 2," in text
    assert "Learning rate: the tuning runs (tune/), each variant at 2 rates on 3 seeds (0, 1, 2)" in text
    assert "Left out: 6 tuning runs at lr 0.1, outside the grid tune.lr searched for their variants" in text
    assert "| lr 0.001 | lr 0.01 | lr sensitivity" in text and "lr 0.1 |" not in text
    labels = "block.attn.qk_norm=none, block.attn.qk_norm=rmsnorm"
    assert text.count(f"the tuned rate is the highest rate tried for {labels}, so") == 1
    assert text.count(f"the best rate is the highest rate tried for {labels}, so") == 1
    assert text.count("0.01 (edge: highest)") == 6  # per variant: lr (tuned) and best lr, and the section's best lr


def test_a_sensitivity_interval_below_zero_is_clipped_and_marked():
    curve = sensitivity.LrCurve(("x",), [], None, {0: 0.0, 1: 0.0, 2: 0.6}, [])
    mean, low, high = curve.sensitivity()
    half = sps.t.ppf(0.975, 2) * statistics.stdev([0.0, 0.0, 0.6]) / 3**0.5
    assert (mean, low, high) == pytest.approx((0.2, 0.0, 0.2 + half)) and curve.clipped
    assert not sensitivity.LrCurve(("x",), [], None, {0: 0.5, 1: 0.6, 2: 0.55}, []).clipped
