"""zoo-coordcheck (zoo.lab.studies.coordcheck): flat under param=mup, growing under param=standard for the same
model, so the check passes for one and fails for the other; its CSV and PNG are written."""

from __future__ import annotations

import csv
import math
from contextlib import nullcontext

import pytest
from helpers import BYTES

from zoo.assembly import mup
from zoo.lab.commands.coordcheck import main
from zoo.lab.studies.coordcheck import slopes

MODEL = ["block.n_heads=4", "model.n_layers=2", *BYTES, "train.batch_size=8", "threads=1"]
SMALL = ["--widths", "32,64,128", "--steps", "4", "--seeds", "2"]


def test_flat_under_mup_growing_under_standard(tmp_path, capsys):
    assert main([*MODEL, *SMALL, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "coordcheck passed" in out and "tolerance" in out
    assert main([*MODEL, *SMALL, "--out", str(tmp_path / "sp"), "--check", "standard"]) == 1  # the check can fail
    assert "standard FAIL" in capsys.readouterr().out
    with open(tmp_path / "coordcheck.csv") as f:
        rows = list(csv.DictReader(f))
    names = {r["quantity"] for r in rows}
    assert names == {"embedding", "block.0", "block.1", "attn_logits.0", "attn_logits.1", "output_logits"}
    assert {r["param"] for r in rows} == {"standard", "mup"} and {r["width"] for r in rows} == {"32", "64", "128"}
    assert (tmp_path / "coordcheck.png").stat().st_size > 10_000


def test_a_planted_wrong_hidden_rate_fails_the_mup_check(tmp_path, monkeypatch):
    monkeypatch.setitem(mup.LR_RULES["adamw"], "hidden", "1")  # hidden matrices at the full rate
    assert main([*MODEL, *SMALL, "--out", str(tmp_path)]) == 1


def test_slopes_are_least_squares_in_log_width():
    rows = [("mup", w, 0, "x", 3.0 * w**0.5) for w in (32, 64, 128)] + [("mup", w, 0, "y", 1.0) for w in (32, 64)]
    found = slopes(rows)
    assert found[("mup", 0, "x")] == pytest.approx(0.5) and found[("mup", 0, "y")] == pytest.approx(0.0)
    assert math.isfinite(found[("mup", 0, "y")])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--widths", "64,x"], "argument --widths: '64,x': block.d_model values, two or more distinct positive"),
        (["--widths", "64,64"], "argument --widths: '64,64': block.d_model values, two or more distinct"),
        (["--widths", "64"], "argument --widths: '64': block.d_model values, two or more"),
        (["--widths", "0,64"], "argument --widths: '0,64': block.d_model values, two or more distinct positive"),
        (["--steps", "0"], "argument --steps: '0': a positive integer"),
        (["--seeds", "-1"], "argument --seeds: '-1': a positive integer"),
        (["nrom=rmsnorm"], "zoo-coordcheck: nrom='rmsnorm': unknown key 'nrom'; did you mean 'norm'?"),
        (["block.n_heads=5"], "zoo-coordcheck: block.n_heads=5: must divide d_model=32"),
        (["param=mup"], "zoo-coordcheck: param='mup': set by zoo-coordcheck"),
        (["train.lr=[1"], "zoo-coordcheck: no viable alternative at input '[1'"),
    ],
)
def test_bad_arguments_are_refused_by_name_before_any_training(tmp_path, capsys, argv, message):
    """A bad width list, count or override: one line naming it (status 2), before any model is built or file written
    (a bad override once surfaced as Hydra's traceback after the first widths had trained)."""
    with pytest.raises(SystemExit) if argv[0].startswith("--") else nullcontext():
        small = ["--widths", "32,64", "--steps", "1", "--seeds", "1"]
        code = main([*MODEL, *small, *argv, "--out", str(tmp_path / "out")])
        assert code == 2
    captured = capsys.readouterr()
    assert message in captured.err, captured.err
    assert not (tmp_path / "out").exists()
