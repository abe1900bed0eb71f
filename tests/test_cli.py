"""Command-line tools and generated docs."""

from __future__ import annotations

from pathlib import Path

from zoo import AXES
from zoo.cli import parts_main, parts_markdown

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
