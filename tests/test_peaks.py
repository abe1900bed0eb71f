"""The probes' peaks in the report (zoo/lab/studies/peaks.py): each run's largest attention logit and log-partition
over its probe records, per variant on a log scale, paired by seed against the baseline's."""

from __future__ import annotations

import csv
import json
import math
import statistics

import pytest
from helpers import fake_run
from scipy import stats as sps

from zoo.lab.reports.report import write_report
from zoo.lab.studies.peaks import run_peaks
from zoo.lab.studies.variants import build_report

#: Per variant and seed: the probe records' attn_logit_max (per layer; None: a mixer without logits) and log_z.
PROBES = {
    "none": {0: [([0.1, 0.2], 5.5), ([40.0, None], 9.0), ([30.0, 900.0], 7.0)],
             1: [([0.1, 0.1], 5.5), ([300.0, 20.0], 6.0)],
             2: [([0.2, 0.1], 5.6), ([5.0, 5000.0], 8.0)]},
    "layernorm": {0: [([3.0, 2.0], 5.5), ([12.0, 8.0], 5.9)],
                  1: [([2.5, 9.5], 5.5), ([10.0, 11.0], 6.1)],
                  2: [([3.1, 2.9], 5.6), ([14.0, 7.0], 5.8)]},
}  # fmt: skip
#: By hand: each run's largest logit over records and layers, and its largest log_z.
LOGIT = {"none": {0: 900.0, 1: 300.0, 2: 5000.0}, "layernorm": {0: 12.0, 1: 11.0, 2: 14.0}}
LOG_Z = {"none": {0: 9.0, 1: 6.0, 2: 8.0}, "layernorm": {0: 5.9, 1: 6.1, 2: 5.8}}


def probed(root):
    for norm, seeds in PROBES.items():
        for seed, records in seeds.items():
            overrides = [f"block.attn.qk_norm={norm}", f"seed={seed}"]
            fake_run(root, overrides, value=2.5, job=seed + 3 * (norm != "none"))  # the baseline: none
            lines = [{"kind": "probe", "step": 10 * i, "tokens": 100 * i, "attn_logit_max": a, "log_z": z,
                      "no_logits": []} for i, (a, z) in enumerate(records)]  # fmt: skip
            with open(root / ",".join(overrides) / "metrics.jsonl", "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in lines))


def t_interval(values):
    mean = statistics.fmean(values)
    half = sps.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def test_each_runs_peak_is_its_largest_value_over_records_and_layers(tmp_path):
    probed(tmp_path)
    for norm in PROBES:
        for seed in range(3):
            peaks = run_peaks(tmp_path / f"block.attn.qk_norm={norm},seed={seed}")
            assert peaks == {"attn_logit_max": LOGIT[norm][seed], "log_z": LOG_Z[norm][seed]}


def test_the_logit_peak_is_compared_on_a_log_scale_paired_by_seed(tmp_path):
    probed(tmp_path)
    text = write_report(tmp_path, plots=False)
    with open(tmp_path / "report.csv") as f:
        rows = {r["block.attn.qk_norm"]: r for r in csv.DictReader(f)}
    for norm in PROBES:
        mean, low, high = t_interval([math.log10(v) for v in LOGIT[norm].values()])
        assert float(rows[norm]["attn_logit_peak"]) == pytest.approx(10**mean)
        assert float(rows[norm]["attn_logit_peak_ci_low"]) == pytest.approx(10**low)
        assert float(rows[norm]["attn_logit_peak_ci_high"]) == pytest.approx(10**high)
        assert float(rows[norm]["log_z_peak"]) == pytest.approx(statistics.fmean(LOG_Z[norm].values()))
    diffs = [math.log10(LOGIT["layernorm"][s]) - math.log10(LOGIT["none"][s]) for s in range(3)]
    mean, low, high = t_interval(diffs)
    ln = rows["layernorm"]
    assert float(ln["attn_logit_peak_log10_delta"]) == pytest.approx(mean)
    assert float(ln["attn_logit_peak_log10_delta_ci_low"]) == pytest.approx(low)
    assert float(ln["attn_logit_peak_log10_delta_ci_high"]) == pytest.approx(high)
    assert ln["attn_logit_peak_verdict"] == ("better" if high < 0 else "within noise")
    z = t_interval([LOG_Z["layernorm"][s] - LOG_Z["none"][s] for s in range(3)])
    assert float(ln["log_z_peak_delta"]) == pytest.approx(z[0])
    assert float(ln["log_z_peak_delta_ci_high"]) == pytest.approx(z[2])
    assert rows["none"]["attn_logit_peak_verdict"] == "baseline"
    assert "Probes (train.probe_every, probes.png)" in text
    line = next(x for x in text.splitlines() if x.startswith("| block.attn.qk_norm=layernorm | 12.27"))
    assert f"{mean:+.4f} [{low:+.4f}, {high:+.4f}]" in line and ("lower" in line) == (high < 0)


def test_runs_without_probes_have_no_peaks(tmp_path):
    for seed in range(3):
        fake_run(tmp_path, ["norm=layernorm", f"seed={seed}"], value=3.0)
    report = build_report(tmp_path)
    assert report.peaks == {} and "Probes (" not in write_report(tmp_path, plots=False)


def test_the_first_position_share_and_the_residual_peak_join_the_table_when_recorded(tmp_path):
    """attn_first's peak is compared as it is (a fraction), resid_max's on a log scale; a report of runs that
    recorded neither (made before the probes had them) keeps its two peaks alone."""
    first = {"none": [0.5, 0.6, 0.4], "elementwise": [0.1, 0.3, 0.2]}
    resid = {"none": [100.0, 1000.0, 10.0], "elementwise": [10.0, 10.0, 1.0]}
    for gate in first:
        for seed in range(3):
            overrides = [f"block.attn.gate={gate}", f"seed={seed}"]
            fake_run(tmp_path, overrides, value=2.5, job=seed + 3 * (gate != "none"))
            records = [{"kind": "probe", "step": 10 * i, "tokens": 100 * i, "attn_logit_max": [1.0, 2.0],
                        "log_z": 5.0, "attn_first": [f * i, f / 2], "resid_max": [r * i, 1.0], "no_logits": {}}
                       for i, (f, r) in enumerate([(first[gate][seed], resid[gate][seed])] * 2)]  # fmt: skip
            with open(tmp_path / ",".join(overrides) / "metrics.jsonl", "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in records))
    text = write_report(tmp_path, plots=False)
    with open(tmp_path / "report.csv") as f:
        rows = {r["block.attn.gate"]: r for r in csv.DictReader(f)}
    mean, low, high = t_interval([a - b for a, b in zip(first["elementwise"], first["none"], strict=True)])
    assert float(rows["elementwise"]["attn_first_peak_delta"]) == pytest.approx(mean)
    assert float(rows["elementwise"]["attn_first_peak_delta_ci_high"]) == pytest.approx(high)
    logs = [math.log10(a) - math.log10(b) for a, b in zip(resid["elementwise"], resid["none"], strict=True)]
    assert float(rows["elementwise"]["resid_max_peak_log10_delta"]) == pytest.approx(t_interval(logs)[0])
    assert float(rows["none"]["resid_max_peak"]) == pytest.approx(100.0)  # geometric mean of 100, 1000, 10
    header = next(x for x in text.splitlines() if x.startswith("| variant | max attn logit"))
    assert "| max attn on first | Δ vs block.attn.gate=none" in header and "| max abs residual | Δ log10" in header
    old = tmp_path / "old"
    probed(old)
    header = next(x for x in write_report(old, plots=False).splitlines() if x.startswith("| variant | max attn"))
    assert header.count("|") == 6 and "first" not in header  # the two peaks' columns alone
