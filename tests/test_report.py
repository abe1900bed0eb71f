"""The sweep report from run folders: grouping by swept keys, mean ± std over seeds, order, files."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest
from matplotlib.image import imread

from zoo.lab.records import write_json_atomic
from zoo.lab.report import markdown, report_main, write_report
from zoo.lab.variants import build_report


def fake_run(root: Path, overrides: list[str], status: str = "ok", value: float | None = None, **extra) -> None:
    """A run folder as zoo-train leaves it: summary.json and metrics.jsonl."""
    folder = root / ",".join(overrides)
    metric = extra.pop("metric", {"name": "val_bpb", "mode": "min"})
    summary = {
        "status": status,
        "error": "ConfigError: block.n_heads=5: must divide d_model=32" if status == "failed" else None,
        "overrides": overrides,
        "choices": {},
        "config": {"seed": int(dict(o.split("=") for o in overrides).get("seed", 0))},
        "parameters": {"total": 1000},
        "metric": {**metric, "value": value},
        "final": {} if value is None else {metric["name"]: value, "val_loss": value * 0.69},
        "tokens_per_s": 5000.0,
        "wall_time_s": 10.0,
        **extra,
    }
    write_json_atomic(folder / "summary.json", summary)
    steps = [{"kind": "train", "step": s, "tokens": 100 * s, "loss": 5.0 - s / 10} for s in (1, 5, 10)]
    steps += [{"kind": "val", "step": s, "tokens": 100 * s, "val_loss": 4.5 - s / 10} for s in (5, 10)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))


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
    head = "| # | norm | seeds | params | val_bpb (mean ± std) | Δ vs norm=layernorm [95% CI] | verdict | tokens/s |"
    assert lines[4].startswith(head)
    # two seeds: the mean paired difference, no interval
    assert lines[6].startswith("| 1 | rmsnorm | 2 | 1,000 | 2.6000 ± 0.1414 | -0.5000 | too few seeds (2 pairs) |")
    assert lines[7].startswith("| 2 | dyt | 2 | 1,000 | 2.8500 ± 0.0707 | -0.2500 | too few seeds (2 pairs) |")
    assert lines[8].startswith("| 3 | layernorm | 2 | 1,000 | 3.1000 ± 0.1414 | baseline |  | 5,000 | 10.0 | ok |")
    assert lines[9].endswith("| 1 failed, 1 diverged |")
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
    assert " | 0.9200 ± 0.0283 | +0.2100 | too few seeds (2 pairs) |" in rows[0]
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
    write_report(tmp_path, plots=False)
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
    # mlp=swiglu vs gelu pooled over pos: pairs are (seed, pos), 6 of them
    pairs = [zip(values[pos, "swiglu"], values[pos, "gelu"], strict=True) for pos in ("none", "rotary")]
    diffs = [s - g for pos_pairs in pairs for s, g in pos_pairs]
    interval = stats.ttest_rel(diffs, [0.0] * 6).confidence_interval(0.95)
    row = effects["mlp", "swiglu"]
    assert row["pairs"] == "6" and row["baseline"] == "mlp=gelu" and row["verdict"] == "better"
    assert float(row["delta_ci_low"]) == pytest.approx(interval.low)
    assert float(row["delta_mean"]) == pytest.approx(statistics.fmean(diffs))
    assert effects["pos", "rotary"]["verdict"] == "better" and "| pos | rotary | none |" in text
    assert imread(tmp_path / "interactions.png").shape[1] > 800

    from zoo.lab.plots import plot_interactions

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

    from zoo.lab.plots import plot_final

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
