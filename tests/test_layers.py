"""The package's shape: one-way layers with no import cycles (import-linter, configured in
pyproject.toml), and every package of the tree listed for the wheel."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def test_layers_are_one_way_and_modules_acyclic():
    # lint-imports, run by this interpreter (so it analyses the zoo this test imports)
    command = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert f"{len(contracts)} kept, 0 broken" in done.stdout


def test_every_package_in_the_tree_ships_in_the_wheel():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    in_tree = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "zoo").rglob("__init__.py")}
    mapped = set(config["package-dir"]) - {""}
    assert set(config["packages"]) == in_tree | mapped, "update [tool.setuptools] packages in pyproject.toml"
    for package, folder in config["package-dir"].items():
        if package:
            assert (ROOT / folder / "__init__.py").is_file(), f"{folder}/ ships as {package}: it needs an __init__.py"
