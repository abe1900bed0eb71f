"""The sweep report from run folders: grouping by swept keys, mean ± std over seeds, order, files."""

from __future__ import annotations

import csv
import json
import shutil
import statistics
from pathlib import Path

import pytest
from helpers import fake_run
from matplotlib.image import imread

from zoo.lab.commands.report import main as report_main
from zoo.lab.reports.report import write_report
from zoo.lab.reports.sections import markdown
from zoo.lab.studies.variants import build_report


def sweep(root: Path) -> None:
    for seed, (a, b, c) in enumerate([(3.0, 2.5, 2.8), (3.2, 2.7, 2.9)]):
        fake_run(root, ["norm=layernorm", f"seed={seed}", "train.steps=10"], value=a, job=3 * seed)
        fake_run(root, ["norm=rmsnorm", f"seed={seed}", "train.steps=10"], value=b, job=3 * seed + 1)
        fake_run(root, ["norm=dyt", f"seed={seed}", "train.steps=10"], value=c, job=3 * seed + 2)
    fake_run(root, ["norm=broken", "seed=0", "train.steps=10"], status="failed")
    fake_run(root, ["norm=broken", "seed=1", "train.steps=10"], status="diverged", reason="loss nan at step 4")


def test_variants_grouped_over_seeds_sorted_best_first(tmp_path):
    sweep(tmp_path)
    report = build_report(tmp_path)
    assert report.axes == ["norm"]  # train.steps is the same everywhere; seeds are averaged over
    assert [v.key for v in report.variants] == [("rmsnorm",), ("dyt",), ("layernorm",), ("broken",)]
    mean, std = report.variants[0].mean_std("val_bpb")
    assert mean == pytest.approx(2.6) and std == pytest.approx(statistics.stdev([2.5, 2.7]))
    broken = report.variants[-1]
    assert broken.status == "1 failed, 1 diverged" and broken.mean_std("val_bpb") == (None, None)


def test_markdown_table_says_who_won_and_by_how_much(tmp_path):
    sweep(tmp_path)
    text = markdown(build_report(tmp_path))
    lines = text.splitlines()
    assert "8 runs, 4 variants, sorted by val_bpb (lower is better)" in lines[0]
    assert lines[2].startswith("Δ: each variant minus the baseline norm=layernorm, paired by seed")
    assert (
        lines[3] == "Test: t (report.test=auto: t for val_bpb, an unbounded metric; one of auto, t, permutation, "
        "bootstrap)."
    )
    head = "| # | norm | seeds | params | val_bpb (mean ± std) | Δ vs norm=layernorm [95% CI] | verdict | tokens/s |"
    assert lines[5].startswith(head)
    # two seeds: the mean paired difference, no interval
    assert lines[7].startswith("| 1 | rmsnorm | 2 | 1,000 | 2.6000 ± 0.1414 | -0.5000 | too few seeds (2 pairs) |")
    assert lines[8].startswith("| 2 | dyt | 2 | 1,000 | 2.8500 ± 0.0707 | -0.2500 | too few seeds (2 pairs) |")
    assert lines[9].startswith("| 3 | layernorm | 2 | 1,000 | 3.1000 ± 0.1414 | baseline |  | 5,000 | 10.0 | ok |")
    assert lines[10].endswith("| 1 failed, 1 diverged |")
    assert "- norm=broken: failed: ConfigError: block.n_heads=5" in text
    assert "- norm=broken: diverged: loss nan at step 4" in text


def test_higher_is_better_metrics_sort_descending(tmp_path):
    accuracy = {"name": "val_accuracy", "mode": "max"}
    fake_run(tmp_path, ["attn=mha"], value=0.5, metric=accuracy)
    fake_run(tmp_path, ["attn=mqa"], value=0.9, metric=accuracy)
    report = build_report(tmp_path)
    assert [v.key for v in report.variants] == [("mqa",), ("mha",)]
    assert "(higher is better)" in markdown(report)


def test_higher_is_better_ranks_every_output_best_first(tmp_path):
    """Accuracy over three variants and two seeds: the table, its deltas and report.csv all put the
    highest mean first and the lowest last, a failed variant after them."""
    accuracy = {"name": "val_accuracy", "mode": "max"}
    for seed, values in enumerate([(0.50, 0.90, 0.70), (0.52, 0.94, 0.72)]):
        for attn, value in zip(("mha", "mqa", "gqa"), values, strict=True):
            fake_run(tmp_path, [f"attn={attn}", f"seed={seed}"], value=value, metric=accuracy)
    fake_run(tmp_path, ["attn=broken", "seed=0"], status="failed", metric=accuracy)
    text = write_report(tmp_path, plots=False)
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[1] for row in rows] == ["mqa", "gqa", "mha", "broken"]
    # against the baseline (the first run that finished ok: attn=gqa, seed 0), the signs say higher is better
    assert " | 0.9200 ± 0.0283 | 2/2 | +0.2100 | too few seeds (2 pairs) |" in rows[0]  # 2/2: at or above 0.9
    assert " | baseline |" in rows[1] and " | -0.2000 |" in rows[2]
    with open(tmp_path / "report.csv") as f:
        assert [r["attn"] for r in csv.DictReader(f)] == ["mqa", "gqa", "mha", "broken"]


def test_files_beside_the_runs(tmp_path, capsys):
    sweep(tmp_path)
    report_main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "| 1 | rmsnorm |" in out and "curves.png" in out
    assert (tmp_path / "report.md").read_text() in out
    with open(tmp_path / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["norm"] for r in rows] == ["rmsnorm", "dyt", "layernorm", "broken"]
    assert float(rows[0]["val_bpb_mean"]) == pytest.approx(2.6) and rows[0]["ok"] == "2"
    assert float(rows[0]["val_loss_mean"]) == pytest.approx(2.6 * 0.69)
    with open(tmp_path / "runs.csv") as f:
        assert len(list(csv.DictReader(f))) == 8
    for png in ("curves.png", "final.png"):
        image = imread(tmp_path / png)
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 400


def test_a_column_is_one_entry_of_the_table_shown_in_markdown_and_csv(tmp_path, monkeypatch):
    from zoo.lab.reports import table as module

    sweep(tmp_path)
    share = module.Column(
        "ok share", "ok_share", lambda r, v, k: len(v.ok) / len(v.runs), lambda r, v, k: f"{len(v.ok)}"
    )
    hidden = module.Column("never", "never", lambda r, v, k: "x", when=lambda r: False)  # Markdown only when shown
    status = next(i for i, c in enumerate(module.COLUMNS) if c.csv == "status")
    monkeypatch.setattr(module, "COLUMNS", [*module.COLUMNS[:status], share, hidden, *module.COLUMNS[status:]])
    text = write_report(tmp_path, plots=False)
    head = next(line for line in text.splitlines() if line.startswith("| # |"))
    assert head.endswith("| tokens/s | wall s | ok share | status |") and "never" not in text
    assert "|  |  | 0 | 1 failed, 1 diverged |" in text and "| 10.0 | 2 | ok |" in text
    with open(tmp_path / "report.csv") as f:
        rows = list(csv.DictReader(f))
    names = list(rows[0])
    assert names[names.index("flops_per_token") + 1 : names.index("status")] == ["ok_share", "never"]
    assert [(r["norm"], r["ok_share"], r["never"]) for r in rows][::3] == [
        ("rmsnorm", "1.0", "x"),
        ("broken", "0.0", "x"),
    ]


def test_many_variants_still_plot(tmp_path):
    for i in range(14):
        fake_run(tmp_path, [f"block.d_ff={16 * (i + 1)}"], value=3.0 - i / 100)
    write_report(tmp_path)
    assert imread(tmp_path / "final.png").shape[0] > imread(tmp_path / "curves.png").shape[0]  # one row each


def test_empty_folder_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        report_main([str(tmp_path)])
    assert exit_.value.code == 1 and "no summary.json under" in capsys.readouterr().err


# -- statistics against the baseline ---------------------------------------------------------------------------

SEEDS_NOISE = [0.031, -0.054, 0.012, 0.047, -0.021]  # what the seed moves every variant by (shared: paired)


def planted(root: Path, effects: dict[str, list[float]], seeds: list[int] | dict[str, list[int]], **extra) -> None:
    """Runs of ``norm=<name>`` whose metric is 3.0 + the seed's shift + the planted per-seed effect."""
    job = 0
    for name, effect in effects.items():
        for i, seed in enumerate(seeds[name] if isinstance(seeds, dict) else seeds):
            fake_run(root, [f"norm={name}", f"seed={seed}"], value=3.0 + SEEDS_NOISE[seed % 5] + effect[i], job=job,
                     **extra)  # fmt: skip
            job += 1


def rows_of(root: Path) -> dict[str, dict[str, str]]:
    with open(root / "report.csv") as f:
        return {r["norm"]: r for r in csv.DictReader(f)}


def test_paired_differences_and_interval_match_scipy(tmp_path):
    from scipy import stats

    effects = {"layernorm": [0.0, 0.0, 0.0, 0.0], "rmsnorm": [-0.05, -0.03, -0.07, -0.04]}
    planted(tmp_path, effects, [0, 1, 2, 3])
    write_report(tmp_path, plots=False)
    row = rows_of(tmp_path)["rmsnorm"]
    # independently: the per-seed differences are the planted effects (the seed's shift cancels)
    test = stats.ttest_rel([-0.05, -0.03, -0.07, -0.04], [0, 0, 0, 0])
    interval = test.confidence_interval(0.95)
    assert float(row["delta_mean"]) == pytest.approx(-0.0475)
    assert float(row["delta_ci_low"]) == pytest.approx(interval.low)
    assert float(row["delta_ci_high"]) == pytest.approx(interval.high)
    assert float(row["p_value"]) == pytest.approx(test.pvalue)
    assert (row["verdict"], row["baseline"], row["pairs"], row["test"]) == ("better", "norm=layernorm", "4", "paired t")
    assert rows_of(tmp_path)["layernorm"]["verdict"] == "baseline"
    # unpaired, the seed noise would hide the effect: Welch's interval over the same runs contains 0
    base = [3.0 + n for n in SEEDS_NOISE[:4]]
    welch = stats.ttest_ind([b + e for b, e in zip(base, effects["rmsnorm"], strict=True)], base, equal_var=False)
    assert welch.confidence_interval(0.95).low < 0 < welch.confidence_interval(0.95).high


def test_seeds_that_do_not_pair_get_welch_labelled_unpaired(tmp_path):
    from scipy import stats

    effects = {"layernorm": [0.0, 0.0, 0.0], "rmsnorm": [0.3, 0.3, 0.3]}
    planted(tmp_path, effects, {"layernorm": [0, 1, 2], "rmsnorm": [5, 6, 7]})
    text = write_report(tmp_path, plots=False)
    row = rows_of(tmp_path)["rmsnorm"]
    a = [3.3 + SEEDS_NOISE[s % 5] for s in (5, 6, 7)]
    b = [3.0 + SEEDS_NOISE[s] for s in (0, 1, 2)]
    interval = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert float(row["delta_ci_low"]) == pytest.approx(interval.low)
    assert float(row["delta_ci_high"]) == pytest.approx(interval.high)
    assert (row["test"], row["pairs"], row["verdict"]) == ("Welch (unpaired)", "0", "worse")
    assert "unpaired | worse |" in text


@pytest.mark.parametrize(("mode", "sign", "verdict"), [("min", -1, "better"), ("min", 1, "worse"),
                                                       ("max", 1, "better"), ("max", -1, "worse")])  # fmt: skip
def test_a_planted_large_effect_is_found_in_the_metrics_direction(tmp_path, mode, sign, verdict):
    metric = {"name": "val_bpb" if mode == "min" else "val_accuracy", "mode": mode}
    effects = {"layernorm": [0.0] * 3, "rmsnorm": [sign * 0.2 + e for e in (0.01, -0.01, 0.004)]}
    planted(tmp_path, effects, [0, 1, 2], metric=metric)
    write_report(tmp_path, plots=False, test="t")  # 3 seeds: the permutation test (auto for accuracy) never decides
    assert rows_of(tmp_path)["rmsnorm"]["verdict"] == verdict


def test_identical_variants_are_within_noise_and_too_few_seeds_say_so(tmp_path):
    wobble = [0.004, -0.006, 0.001]  # a difference of pure noise around 0
    planted(tmp_path / "same", {"layernorm": [0.0] * 3, "rmsnorm": [0.0] * 3, "dyt": wobble}, [0, 1, 2])
    write_report(tmp_path / "same", plots=False)
    rows = rows_of(tmp_path / "same")
    assert rows["rmsnorm"]["verdict"] == rows["dyt"]["verdict"] == "within noise"
    assert float(rows["rmsnorm"]["delta_mean"]) == 0.0
    assert float(rows["dyt"]["delta_ci_low"]) < 0 < float(rows["dyt"]["delta_ci_high"])

    planted(tmp_path / "two", {"layernorm": [0.0] * 2, "rmsnorm": [-0.5] * 2}, [0, 1])  # huge, but 2 seeds
    text = write_report(tmp_path / "two", plots=False)
    row = rows_of(tmp_path / "two")["rmsnorm"]
    assert (row["verdict"], row["pairs"], row["delta_ci_low"], row["delta_ci_high"]) == ("too few seeds", "2", "", "")
    assert float(row["delta_mean"]) == pytest.approx(-0.5)
    assert "| -0.5000 | too few seeds (2 pairs) |" in text


def test_holm_correction_is_named_and_adjusts_the_verdicts(tmp_path):
    from scipy import stats

    effects = {"layernorm": [0.0] * 3, "rmsnorm": [-0.2, -0.21, -0.19], "dyt": [-0.02, -0.05, -0.005],
               "scalenorm": [0.01, 0.0, 0.02]}  # fmt: skip
    planted(tmp_path, effects, [0, 1, 2])
    write_report(tmp_path, plots=False)
    plain = rows_of(tmp_path)
    text = write_report(tmp_path, plots=False, correction="holm")
    holm = rows_of(tmp_path)
    assert "Correction: Holm, family-wise over the 3 comparisons" in text
    # Holm by hand: sort the p-values, multiply the k-th smallest by (m - k), keep them increasing
    names = ["rmsnorm", "dyt", "scalenorm"]
    p = {n: stats.ttest_rel(effects[n], [0.0] * 3).pvalue for n in names}
    expected, running = {}, 0.0
    for k, name in enumerate(sorted(names, key=p.get)):
        running = max(running, min(1.0, (3 - k) * p[name]))
        expected[name] = running
    for name in names:
        assert float(holm[name]["p_adjusted"]) == pytest.approx(expected[name])
        assert holm[name]["verdict"] == ("within noise" if expected[name] >= 0.05 else plain[name]["verdict"])
    assert plain["dyt"]["p_adjusted"] == "" and plain["rmsnorm"]["verdict"] == holm["rmsnorm"]["verdict"] == "better"


def test_the_baseline_is_the_first_launched_value_unless_given(tmp_path, capsys):
    planted(tmp_path, {"rmsnorm": [0.0] * 3, "layernorm": [0.1] * 3}, [0, 1, 2])  # rmsnorm: jobs 0-2
    assert build_report(tmp_path).baseline == ("rmsnorm",)
    assert build_report(tmp_path, baseline={"norm": "layernorm"}).baseline == ("layernorm",)
    report_main([str(tmp_path), "--baseline", "norm=layernorm", "--no-plots"])
    assert "| Δ vs norm=layernorm [95% CI] |" in capsys.readouterr().out
    assert rows_of(tmp_path)["rmsnorm"]["verdict"] == "better"
    with pytest.raises(SystemExit):
        report_main([str(tmp_path), "--baseline", "norm=dyt"])
    assert "report.baseline='norm=dyt': one of norm's values: layernorm, rmsnorm" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        report_main([str(tmp_path), "--baseline", "pos=rotary"])
    assert "report.baseline='pos=rotary': pos is not a swept axis; swept: norm: layernorm, rmsnorm" in \
        capsys.readouterr().err  # fmt: skip
    # launched with report.baseline in the runs' config: the report follows it
    for summary in tmp_path.glob("*/summary.json"):
        data = json.loads(summary.read_text())
        data["config"]["report"] = {"baseline": {"norm": "layernorm"}, "correction": "none"}
        summary.write_text(json.dumps(data))
    assert build_report(tmp_path).baseline == ("layernorm",)


def multi_axis(root: Path) -> dict[tuple[str, str], list[float]]:
    """pos x mlp x 3 seeds: rotary lowers the metric by 0.2, swiglu by 0.05 (plus a little noise)."""
    values = {}
    job = 0
    for pos in ("none", "rotary"):
        for mlp in ("gelu", "swiglu"):
            values[pos, mlp] = []
            for seed, wobble in zip((0, 1, 2), (0.003, -0.004, 0.002), strict=True):
                value = 3.0 + SEEDS_NOISE[seed] - 0.2 * (pos == "rotary") - 0.05 * (mlp == "swiglu") + wobble * job / 4
                fake_run(root, [f"pos={pos}", f"mlp={mlp}", f"seed={seed}"], value=value, job=job)
                values[pos, mlp].append(value)
                job += 1
    return values


def test_several_axes_get_pooled_effects_and_interaction_plots(tmp_path):
    from scipy import stats

    values = multi_axis(tmp_path)
    text = write_report(tmp_path)
    report = build_report(tmp_path)
    assert report.baseline == ("none", "gelu")
    with open(tmp_path / "effects.csv") as f:
        effects = {(r["axis"], r["value"]): r for r in csv.DictReader(f)}
    # mlp=swiglu vs gelu pooled over pos: pairs are (seed, pos), 6 of them; each seed's 2 averaged, t over 3 seeds
    pairs = [zip(values[pos, "swiglu"], values[pos, "gelu"], strict=True) for pos in ("none", "rotary")]
    diffs = [s - g for pos_pairs in pairs for s, g in pos_pairs]
    per_seed = [statistics.fmean(diffs[seed::3]) for seed in range(3)]
    interval = stats.ttest_1samp(per_seed, 0.0).confidence_interval(0.95)
    row = effects["mlp", "swiglu"]
    assert (row["pairs"], row["units"]) == ("6", "3") and row["baseline"] == "mlp=gelu" and row["verdict"] == "better"
    assert float(row["delta_ci_low"]) == pytest.approx(interval.low)
    assert float(row["delta_mean"]) == pytest.approx(statistics.fmean(diffs))
    assert effects["pos", "rotary"]["verdict"] == "better" and "| pos | rotary | none |" in text
    assert imread(tmp_path / "interactions.png").shape[1] > 800

    from zoo.lab.reports.plots import plot_interactions

    fig = plot_interactions(report, tmp_path / "again.png")
    panel = fig.axes[0]  # metric vs pos, one line per mlp
    lines = {line.get_label(): line for line in panel.get_lines()}
    assert set(lines) == {"mlp=gelu", "mlp=swiglu"}
    expected = [statistics.fmean(values[pos, "swiglu"]) for pos in ("none", "rotary")]
    assert list(lines["mlp=swiglu"].get_ydata()) == pytest.approx(expected)
    band = panel.collections[1].get_paths()[0].vertices[:, 1]  # the swiglu band, low and high edges
    lows = [stats.t.interval(0.95, 2, loc=m, scale=stats.sem(values[pos, "swiglu"]))[0]
            for m, pos in zip(expected, ("none", "rotary"), strict=True)]  # fmt: skip
    assert min(band) == pytest.approx(min(lows))


def test_final_plot_draws_the_paired_intervals_and_the_baseline(tmp_path):
    from scipy import stats

    from zoo.lab.reports.plots import plot_final

    effects = {"layernorm": [0.0] * 3, "rmsnorm": [-0.05, -0.03, -0.07]}
    planted(tmp_path, effects, [0, 1, 2])
    report = build_report(tmp_path)
    fig = plot_final(report, tmp_path / "final.png")
    values_ax, delta_ax = fig.axes
    interval = stats.ttest_rel(effects["rmsnorm"], [0.0] * 3).confidence_interval(0.95)
    (bars,) = [c for c in delta_ax.containers if len(c.lines[2])]  # the rmsnorm difference (the baseline: a point)
    (segment,) = bars.lines[2][0].get_segments()
    assert [segment[0][0], segment[1][0]] == pytest.approx([interval.low, interval.high])
    base_mean = statistics.fmean(3.0 + n for n in SEEDS_NOISE[:3])
    assert [line.get_xdata()[0] for line in values_ax.get_lines() if "baseline" in line.get_label()] == pytest.approx(
        [base_mean]
    )


def test_sparse_variants_show_active_beside_total_parameters(tmp_path):
    fake_run(tmp_path, ["mlp=swiglu"], value=2.5, active_parameters=1000)
    fake_run(tmp_path, ["mlp=moe"], value=2.4, parameters={"total": 3000}, active_parameters=1100)
    lines = markdown(build_report(tmp_path)).splitlines()
    head = next(line for line in lines if line.startswith("| # |"))
    moe = next(line for line in lines if "| moe |" in line)
    dense = next(line for line in lines if "| swiglu |" in line)
    assert "| params | active params |" in head
    assert "| 3,000 | 1,100 |" in moe and "| 1,000 | 1,000 |" in dense
    fake = tmp_path / "dense_only"
    fake_run(fake, ["mlp=swiglu"], value=2.5, active_parameters=1000)
    assert "active params" not in markdown(build_report(fake))  # every parameter active: one count


# -- run folders that cannot be read ----------------------------------------------------------------------------


def test_a_run_folder_that_cannot_be_read_is_named_and_fails_the_exit_status(tmp_path, capsys):
    multi_axis(tmp_path)  # 12 runs
    (tmp_path / "pos=none,mlp=gelu,seed=2" / "summary.json").write_text('{"status": "ok", "final": {')  # cut short
    (tmp_path / "pos=rotary,mlp=gelu,seed=1" / "summary.json").write_text("[1, 2]")
    summary = tmp_path / "pos=rotary,mlp=swiglu,seed=0" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "final": {"val_bpb": "3.1"}}))
    killed = tmp_path / "pos=none,mlp=swiglu,seed=7"  # trained, then lost its summary
    killed.mkdir()
    (killed / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 5.0}\n')
    with pytest.raises(SystemExit) as exit_:
        report_main([str(tmp_path), "--no-plots"])
    assert exit_.value.code == 1
    out, err = capsys.readouterr()
    reasons = {
        "pos=none,mlp=gelu,seed=2": "summary.json is not valid JSON (Expecting property name enclosed in double "
        "quotes at line 1 column 28)",
        "pos=rotary,mlp=gelu,seed=1": "summary.json: not a JSON object (a list)",
        "pos=rotary,mlp=swiglu,seed=0": "summary.json: final.val_bpb='3.1': not a number",
        "pos=none,mlp=swiglu,seed=7": "no summary.json",
    }
    assert "4 run folder(s) not read, left out of the report" in err
    text = (tmp_path / "report.md").read_text()  # the rest of the report is still written
    lines = text.splitlines()
    assert lines[0].endswith(": 9 runs (4 not read: below), 4 variants, sorted by val_bpb (lower is better)")
    assert lines[2] == "Not read: 4 run folders, left out of every table and interval below:"
    assert sorted(lines[3:7]) == sorted(f"- {folder}: {reason}" for folder, reason in reasons.items())
    for folder, reason in reasons.items():
        assert f"{folder}: {reason}" in err
    assert text in out and "| 1 | rotary | swiglu | 2 |" in text  # seeds 1 and 2 only
    with open(tmp_path / "runs.csv") as f:
        rows = {r["run_dir"]: r for r in csv.DictReader(f)}
    assert len(rows) == 13 and {(rows[k]["status"], rows[k]["error"]) for k in reasons} == {
        ("not read", reason) for reason in reasons.values()
    }
    from zoo.lab.records.exit_status import runs_not_done  # a sweep's exit status names the reason too

    assert (tmp_path / "pos=rotary,mlp=gelu,seed=1", reasons["pos=rotary,mlp=gelu,seed=1"]) in runs_not_done(tmp_path)
    for folder in reasons:  # mended, the report reads every run again and exits 0
        shutil.rmtree(tmp_path / folder)
    report_main([str(tmp_path), "--no-plots"])
    assert "not read" not in (tmp_path / "report.md").read_text()


def test_a_sweep_whose_report_fails_exits_1_with_the_reports_error(tmp_path, capsys):
    """The report callback's failure (no run to read here) is the sweep's exit status and its last words on
    stderr, after its runs' own; a sweep whose report is written and whose runs did their work exits 0."""
    from omegaconf import OmegaConf

    from zoo.lab.records.exit_status import SweepStatus, exit_if_a_run_failed
    from zoo.lab.reports.callback import ReportCallback

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}, "report": {"baseline": None}})
    SweepStatus().on_multirun_end(config)
    ReportCallback().on_multirun_end(config)
    with pytest.raises(SystemExit) as exit_:
        exit_if_a_run_failed()
    assert str(exit_.value.code).startswith(f"the report of {tmp_path} was not written: FileNotFoundError: no "
                                            "summary.json under ")  # fmt: skip
    sweep(tmp_path)
    for seed in (0, 1):
        shutil.rmtree(tmp_path / f"norm=broken,seed={seed},train.steps=10")
    SweepStatus().on_multirun_end(config)
    ReportCallback().on_multirun_end(config)
    exit_if_a_run_failed()  # no failed run, a report written: nothing to say
    assert (tmp_path / "report.md").is_file() and "report:" in capsys.readouterr().out


def residual_runs(root: Path) -> None:
    """zoo-sweep residual (add, scaled, hyper; 4 seeds), then the same sweep again into its folder with
    residual=hyper block.residual.sinkhorn_iters=20 (mHC): an option only hyper has."""
    hyper = {"name": "hyper", "n_streams": 4, "dynamic": False, "sinkhorn_iters": 0}
    for seed in range(4):
        for i, (name, node, extra) in enumerate([("add", {"name": "add"}, []), ("scaled", {"name": "scaled"}, []),
                                                 ("hyper", hyper, []),
                                                 ("hyper", {**hyper, "sinkhorn_iters": 20},
                                                  ["block.residual.sinkhorn_iters=20"])]):  # fmt: skip
            config = {"seed": seed, "block": {"residual": node}}
            fake_run(root, ["+sweeps=residual", f"residual={name}", *extra, f"seed={seed}"], value=3.0 - 0.1 * i
                     + 0.01 * seed, config=config, choices={"residual": name}, job=4 * seed + i)  # fmt: skip


def test_an_option_only_one_parts_runs_have_is_folded_into_its_axis(tmp_path):
    """block.residual.sinkhorn_iters exists under residual=hyper only: it is no axis of its own (whose pooled rows
    would pair runs that do not differ by it) but part of residual's value, each variant its 4 seeds."""
    residual_runs(tmp_path)
    report = build_report(tmp_path)
    assert report.axes == ["residual"]
    assert sorted(v.key for v in report.variants) == [("add",), ("hyper sinkhorn_iters=0",),
                                                      ("hyper sinkhorn_iters=20",), ("scaled",)]  # fmt: skip
    assert all(len(v.runs) == 4 for v in report.variants) and not report.effects and not report.interactions
    assert report.baseline == ("add",)
    text = markdown(report)
    assert "sinkhorn_iters=20" in text and "unset" not in text
    mhc = build_report(tmp_path, baseline={"residual": "hyper sinkhorn_iters=0"})
    assert mhc.baseline == ("hyper sinkhorn_iters=0",)


def test_an_option_every_run_has_stays_an_axis_of_its_own(tmp_path):
    for seed in range(3):
        for i, (attn, gate) in enumerate([("mha", "none"), ("mha", "headwise"), ("gqa", "none"), ("gqa", "headwise")]):
            config = {"seed": seed, "block": {"attn": {"name": attn, "gate": gate}}}
            fake_run(tmp_path, [f"attn={attn}", f"block.attn.gate={gate}", f"seed={seed}"], value=3.0 - 0.1 * i,
                     config=config, choices={"attn": attn})  # fmt: skip
    report = build_report(tmp_path)
    assert report.axes == ["attn", "block.attn.gate"] and len(report.effects) == 2


# -- pooled effects: the seed is the unit ------------------------------------------------------------------------


def test_pooled_effects_count_seeds_not_pairs(tmp_path):
    """Each seed moves swiglu - gelu by the same amount at both pos values (pairs correlated within a seed): the
    interval is the t-interval over the 4 per-seed means, wider than the naive one over the 8 pairs, and says so."""
    from scipy import stats

    seed_effect = [-0.10, -0.01, -0.07, 0.01]  # the swiglu - gelu difference each seed gives, at every pos
    diffs: dict[int, list[float]] = {}
    job = 0
    for pos, shift, wobble in (("none", 0.0, 0.002), ("rotary", -0.2, -0.003)):
        for mlp in ("gelu", "swiglu"):
            for seed in range(4):
                value = 3.0 + SEEDS_NOISE[seed] + shift + (seed_effect[seed] + wobble * seed) * (mlp == "swiglu")
                fake_run(tmp_path, [f"pos={pos}", f"mlp={mlp}", f"seed={seed}"], value=value, job=job)
                job += 1
                if mlp == "swiglu":
                    diffs.setdefault(seed, []).append(seed_effect[seed] + wobble * seed)
    text = write_report(tmp_path, plots=False)
    with open(tmp_path / "effects.csv") as f:
        row = {(r["axis"], r["value"]): r for r in csv.DictReader(f)}["mlp", "swiglu"]
    blocked = stats.ttest_1samp([statistics.fmean(d) for d in diffs.values()], 0.0)
    naive = stats.ttest_1samp([x for d in diffs.values() for x in d], 0.0).confidence_interval(0.95)
    low, high = float(row["delta_ci_low"]), float(row["delta_ci_high"])
    assert (low, high) == pytest.approx(tuple(blocked.confidence_interval(0.95)))
    assert float(row["p_value"]) == pytest.approx(blocked.pvalue)
    assert high - low > naive.high - naive.low and naive.high < 0 < high  # the naive one would say "better"
    assert (row["pairs"], row["units"], row["verdict"]) == ("8", "4", "within noise")
    assert "blocked by seed" in text and "the independent units are the seeds, not the pairs" in text
    assert "| mlp | swiglu | gelu |" in text and "| within noise | 8 | 4 |" in text


# -- bounded and bimodal outcomes ---------------------------------------------------------------------------------

ACCURACY = {"name": "val_accuracy", "mode": "max"}
#: MQAR's outcomes (docs/results.md, section 5): a run recalls (about 1.0) or stays on the plateau (about 0.39).
RECALL = {"mha": [0.9998, 1.0, 0.3855], "gqa": [0.3933, 0.999, 1.0], "linear": [0.4019, 0.3872, 0.9]}


def recall_sweep(root: Path, outcomes: dict[str, list[float]] = RECALL) -> None:
    job = 0
    for attn, values in outcomes.items():
        for seed, value in enumerate(values):
            fake_run(root, [f"attn={attn}", f"seed={seed}"], value=value, metric=ACCURACY, job=job)
            job += 1


def rows_by(root: Path, key: str, name: str = "report.csv") -> dict[str, dict[str, str]]:
    with open(root / name) as f:
        return {r[key]: r for r in csv.DictReader(f)}


def test_sign_flip_permutation_p_value_is_exact():
    from zoo.lab.studies.stats import permutation_interval

    # six differences of one sign: of the 2^6 = 64 sign patterns only the observed one reaches its sum, and only
    # all flipped reaches its negative: p = 2 / 64; the interval is the least and the largest subset mean
    mean, low, high, p, exact = permutation_interval([0.1, 0.2, 0.3, 0.05, 0.15, 0.25])
    assert (p, exact, mean) == (pytest.approx(2 / 64), True, pytest.approx(0.175))
    assert (low, high) == pytest.approx((0.05, 0.3))
    # [0.3, -0.1, 0.2], sum 0.4: sums of the 8 patterns are 0.4 (+++), 0.6 (+-+), 0.0, -0.2, 0.2, 0.0, -0.6, -0.4;
    # 2 of 8 at or above 0.4, 7 of 8 at or below: p = 2 x min(2/8, 7/8) = 0.5. Three seeds reach no 95% interval.
    mean, low, high, p, exact = permutation_interval([0.3, -0.1, 0.2])
    assert p == pytest.approx(0.5) and (low, high) == (-float("inf"), float("inf"))
    # past 13 seeds, a fixed sample of sign patterns: 16 positive differences, p about 2 / 10,000, an interval inside
    many = [0.01 * (i + 1) for i in range(16)]
    mean, low, high, p, exact = permutation_interval(many)
    assert not exact and p < 0.001 and 0.01 < low < mean < high < 0.16
    assert permutation_interval(many) == (mean, low, high, p, exact)  # the same sample every time


def test_permutation_through_the_report_names_the_test(tmp_path):
    effects = {"layernorm": [0.0] * 6, "rmsnorm": [-0.05, -0.03, -0.07, -0.04, -0.06, -0.02]}
    planted(tmp_path, effects, [0, 1, 2, 3, 4, 5])
    text = write_report(tmp_path, plots=False, test="permutation")
    row = rows_of(tmp_path)["rmsnorm"]
    assert (row["test"], row["verdict"], row["clipped"]) == ("paired sign-flip permutation (exact)", "better", "false")
    assert float(row["p_value"]) == pytest.approx(2 / 64)
    assert (float(row["delta_ci_low"]), float(row["delta_ci_high"])) == pytest.approx((-0.07, -0.02))
    assert "Test: permutation (report.test=permutation; one of auto, t, permutation, bootstrap)." in text


def test_bounded_metric_gets_permutation_clipped_intervals_and_pass_counts(tmp_path, capsys):
    from scipy import stats

    recall_sweep(tmp_path)
    text = write_report(tmp_path, plots=False)  # auto: accuracy is bounded, so permutation
    rows = rows_by(tmp_path, "attn")
    gqa = rows["gqa"]
    # by hand: differences -0.6065, -0.0010, +0.6145 (sum +0.0070); of the 8 sign patterns 4 sum to >= 0.007
    # (+++, flip the first, flip the second, flip both), 5 to <= it: p = 2 x 4/8 = 1
    assert gqa["test"] == "paired sign-flip permutation (exact)" and float(gqa["p_value"]) == pytest.approx(1.0)
    assert (gqa["delta_ci_low"], gqa["delta_ci_high"], gqa["clipped"]) == ("-1.0", "1.0", "true")
    assert "| 0.7974 ± 0.3500 | 2/3 | +0.0023 [-1.0000, +1.0000] clipped | within noise |" in text
    assert "Test: permutation (report.test=auto: permutation for val_accuracy, a bounded metric" in text
    assert "clipped to the difference's feasible range [-1, +1]" in text
    assert "| pass (≥ 0.9) |" in text
    assert (rows["mha"]["pass"], rows["gqa"]["pass"], rows["linear"]["pass"]) == ("2/3", "2/3", "1/3")  # 0.9 passes
    assert rows["mha"]["pass_threshold"] == "0.9"
    runs = rows_by(tmp_path, "run_dir", "runs.csv")
    assert [runs[f"attn=mha,seed={s}"]["pass"] for s in range(3)] == ["True", "True", "False"]
    # Student t over the same 3 pairs reaches past [-1, 1]: it is cut there and says so
    raw = stats.ttest_1samp([g - m for g, m in zip(RECALL["gqa"], RECALL["mha"], strict=True)], 0.0)
    assert raw.confidence_interval(0.95).low < -1 and raw.confidence_interval(0.95).high > 1
    report_main([str(tmp_path), "--no-plots", "--test", "t"])
    assert "+0.0023 [-1.0000, +1.0000] clipped | within noise" in capsys.readouterr().out
    assert rows_by(tmp_path, "attn")["gqa"]["test"] == "paired t"
    # an unbounded metric: no pass column, no clipping, t by default
    planted(tmp_path / "bpb", {"layernorm": [0.0] * 3, "rmsnorm": [-0.5, -0.4, -0.6]}, [0, 1, 2])
    text = write_report(tmp_path / "bpb", plots=False)
    row = rows_of(tmp_path / "bpb")["rmsnorm"]
    assert (row["test"], row["clipped"], row["pass"]) == ("paired t", "false", "") and "pass (" not in text


def test_bootstrap_interval_is_named_and_inside_the_differences(tmp_path):
    effects = {"layernorm": [0.0] * 8, "rmsnorm": [-0.05, -0.03, -0.07, -0.04, -0.06, -0.02, -0.05, -0.04]}
    planted(tmp_path, effects, list(range(8)))
    write_report(tmp_path, plots=False, test="bootstrap")
    row = rows_of(tmp_path)["rmsnorm"]
    low, high = float(row["delta_ci_low"]), float(row["delta_ci_high"])
    assert row["test"] == "paired bootstrap (percentile)" and row["verdict"] == "better"
    assert -0.07 <= low < float(row["delta_mean"]) < high <= -0.02  # a mean of resampled differences: inside them
    assert float(row["p_value"]) < 0.05


def test_bad_report_test_names_the_key_value_and_choices(tmp_path, capsys):
    from zoo.core.errors import ConfigError
    from zoo.lab.planning.options import report_options

    with pytest.raises(ConfigError) as error:
        report_options({"test": "wilcoxon"})
    assert str(error.value).startswith("report.test='wilcoxon': one of auto, t, permutation, bootstrap")
    recall_sweep(tmp_path)
    for summary in tmp_path.glob("*/summary.json"):  # launched with a bad report.test
        data = json.loads(summary.read_text())
        data["config"]["report"] = {"test": "ttest"}
        summary.write_text(json.dumps(data))
    with pytest.raises(SystemExit) as exit_:
        report_main([str(tmp_path), "--no-plots"])
    assert exit_.value.code == 1 and "report.test='ttest': one of auto, t, permutation" in capsys.readouterr().err


def test_every_function_in_the_package_fits_on_a_screen():
    import ast

    import zoo

    package = Path(zoo.__file__).parent
    too_long = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > 60:
                    too_long.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name}: {length} lines")
    assert not too_long, "\n".join(too_long)


def optimizer_runs(root, tuned: bool, optims=("adamw", "muon")) -> None:
    """Two optimizers x 3 seeds, each run's config naming its optimizer (and its tune.lr choice when ``tuned``)."""
    for seed in range(3):
        for i, name in enumerate(optims):
            extra = (
                {"tune": {"lr": 0.01, "searched": {"0.01": 3.0}, "seeds": [0], "metric": "val_bpb"}} if tuned else {}
            )
            fake_run(root, [f"optim={name}", f"seed={seed}"], value=3.0 + 0.1 * i + 0.01 * seed, **extra)
            path = root / f"optim={name},seed={seed}" / "summary.json"
            data = json.loads(path.read_text())
            data["config"]["optim"] = {"name": name}
            path.write_text(json.dumps(data))


def test_optimizers_compared_without_tune_lr_are_warned_about_in_the_report_and_on_stderr(tmp_path, capsys):
    optimizer_runs(tmp_path / "shared", tuned=False)
    report_main([str(tmp_path / "shared"), "--no-plots"])
    err = capsys.readouterr().err
    warning = "Warning: these runs differ in optim (adamw, muon) without tune.lr"
    assert warning in (tmp_path / "shared" / "report.md").read_text() and warning in err
    optimizer_runs(tmp_path / "tuned", tuned=True)  # each at its own tuned rate: fair
    report_main([str(tmp_path / "tuned"), "--no-plots"])
    assert "Warning" not in capsys.readouterr().err + (tmp_path / "tuned" / "report.md").read_text()
    optimizer_runs(tmp_path / "one", tuned=False, optims=("muon",))  # one optimizer: nothing to warn about
    report_main([str(tmp_path / "one"), "--no-plots"])
    assert "Warning" not in capsys.readouterr().err + (tmp_path / "one" / "report.md").read_text()


def test_probes_plot_the_largest_attention_logit_and_log_z_per_variant_only_when_recorded(tmp_path):
    from zoo.lab.records.metrics import read_metrics
    from zoo.lab.reports.plots import PROBE_PANELS, probe_curve

    for pos, scale in (("none", 10.0), ("rotary", 1.0)):
        for seed in (0, 1):
            fake_run(tmp_path, [f"pos={pos}", f"seed={seed}"], value=3.0)
            probes = [{"kind": "probe", "step": s, "tokens": 100 * s, "log_z": 5.0 - s / 10 + seed,
                       "attn_logit_max": [scale * s * (seed + 1), None, 1.0]} for s in (5, 10)]  # fmt: skip
            with open(tmp_path / f"pos={pos},seed={seed}" / "metrics.jsonl", "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in probes))
    (tmp_path / "probes.png").write_bytes(b"stale")
    write_report(tmp_path)
    assert imread(tmp_path / "probes.png").shape[1] > 800
    runs = [read_metrics(tmp_path / f"pos=none,seed={seed}") for seed in (0, 1)]
    (_, _, top), (_, _, log_z) = PROBE_PANELS
    assert probe_curve(runs, top) == ([5, 10], [75.0, 150.0])  # max over layers (a null layer skipped), mean of seeds
    assert probe_curve(runs, log_z) == ([5, 10], [5.0, 4.5])
    for seed in (0, 1):  # no probes: no probes.png (and the stale one gone)
        for pos in ("none", "rotary"):
            fake_run(tmp_path, [f"pos={pos}", f"seed={seed}"], value=3.0)
    write_report(tmp_path)
    assert not (tmp_path / "probes.png").exists()


def test_routing_png_is_written_listed_removed_when_stale_and_sent_to_trackers_like_every_plot(tmp_path):
    """One list of a report's files (zoo/lab/records/report_files.py): routing.png is handled as every other plot."""
    from zoo.lab.records.report_files import OPTIONAL, PLOTS
    from zoo.lab.records.trackers import PLOTS as SENT
    from zoo.lab.reports.report import written

    for seed in (0, 1):
        fake_run(tmp_path, ["mlp=moe", f"seed={seed}"], value=3.0, routing={"blocks.0.mlp": [0.25, 0.75]})
    write_report(tmp_path)
    assert imread(tmp_path / "routing.png").shape[1] > 400 and tmp_path / "routing.png" in written(tmp_path, True)
    assert "routing.png" in PLOTS and "routing.png" in OPTIONAL and SENT == PLOTS
    for seed in (0, 1):  # the same folder, no run routes tokens now: the earlier routing.png goes
        fake_run(tmp_path, ["mlp=moe", f"seed={seed}"], value=3.0)
    write_report(tmp_path)
    assert not (tmp_path / "routing.png").exists() and tmp_path / "routing.png" not in written(tmp_path, True)
