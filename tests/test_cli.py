"""Command-line tools and generated docs."""

from __future__ import annotations

from pathlib import Path

from zoo import AXES
from zoo.lab.cli import parts_main, parts_markdown

ROOT = Path(__file__).resolve().parent.parent


def test_zoo_parts_lists_every_registered_part(capsys):
    parts_main([])
    out = capsys.readouterr().out
    for axis, registry in AXES.items():
        assert f"{axis}:" in out
        for name in registry.names():
            assert f"  {name} " in out


def test_parts_catalogue_is_current():
    assert (ROOT / "docs" / "parts.md").read_text() == parts_markdown(), (
        "docs/parts.md is stale: run `zoo-parts --markdown > docs/parts.md`"
    )


def test_zoo_parts_params_counts_a_restricted_grid_with_matching(capsys):
    parts_main(
        ["--params", "--d-model", "64", "placement=pre", "norm=rmsnorm", "attn=mha,gqa", "pos=rotary,learned"]
        + ["mlp=gelu,swiglu", "block.mlp.match=params", "block.mlp.match_attn=mha", "block.max_len=32"]
    )
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| pre ")]
    assert len(rows) == 8
    matched = [row.split(" | ") for row in rows]
    reference = {row[-1].rstrip(" |") for row in matched}
    assert len(reference) == 1  # every variant matched to the same mha + gelu block
    target = int(next(iter(reference)).replace(",", ""))
    assert all(abs(int(row[-2].replace(",", "")) - target) < 200 for row in matched)
