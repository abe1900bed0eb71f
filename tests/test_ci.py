"""The CI configuration for a public host's runners (.github/workflows/ci.yml, and the example plugin's
examples/zoo-dyt/.github/workflows/contract.yml): it cannot run here, so this checks that it parses,
covers the supported Pythons and torch range, shards the suite into a whole, mirrors .ci/run, and that
every command it runs exists in the project."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import yaml
from helpers import ROOT
from packaging.specifiers import SpecifierSet

from zoo.testing.cli import parser as contract_parser

CI = ROOT / ".github" / "workflows" / "ci.yml"
PLUGIN_CI = ROOT / "examples" / "zoo-dyt" / ".github" / "workflows" / "contract.yml"
tomllib = pytest.importorskip("tomllib")  # Python 3.11+
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]


def workflow(path: Path) -> dict:
    loaded = yaml.safe_load(path.read_text())
    loaded["on"] = loaded.pop(True, loaded.get("on"))  # YAML 1.1 reads the key `on` as true
    return loaded


def commands(path: Path, shard: str = "1") -> list[list[str]]:
    """Every shell command the workflow runs, split into words, matrix values filled in."""
    found = []
    for job in workflow(path)["jobs"].values():
        for step in job["steps"]:
            text = step.get("run", "").replace("${{ matrix.shard }}", shard).replace("${{ matrix.torch }}", "2.13.0")
            for line in text.splitlines():
                for command in re.split(r"&&|\|\||;", line):
                    if command.strip(" {}"):
                        found.append(shlex.split(command.strip(" {}")))
    return found


@pytest.mark.parametrize("path", [CI, PLUGIN_CI], ids=["ci", "plugin"])
def test_a_workflow_is_well_formed(path):
    flow = workflow(path)
    assert set(flow["on"]) == {"push", "pull_request"}
    for name, job in flow["jobs"].items():
        assert job["runs-on"] == "ubuntu-latest", name
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), (name, step)
        assert job["steps"][0]["uses"].startswith("actions/checkout@"), name
        setup = [s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python@")]
        assert setup and setup[0]["with"]["cache"] == "pip", name


def test_ci_covers_the_supported_pythons_and_torch_range_and_shards_into_a_whole():
    matrix = workflow(CI)["jobs"]["tests"]["strategy"]["matrix"]
    rows = [{"python": p, "torch": t, "shard": s} for p in matrix["python"] for t in matrix["torch"]
            for s in matrix["shard"]] + matrix["include"]  # fmt: skip
    assert sorted({r["python"] for r in rows}) == PYTHONS
    assert SpecifierSet(PYPROJECT["project"]["requires-python"]).contains("3.10")
    torch_spec = SpecifierSet(next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch"))[5:])
    versions = sorted({r["torch"] for r in rows}, key=lambda v: tuple(map(int, v.split("."))))
    assert all(torch_spec.contains(v) for v in versions), (versions, torch_spec)
    lowest = next(s.version for s in torch_spec if s.operator == ">=")
    highest = next(s.version for s in torch_spec if s.operator == "<")
    assert versions[0].startswith(lowest + "."), "the lowest supported torch is tested"
    assert versions[-1].split(".")[:2] == [highest.split(".")[0], str(int(highest.split(".")[1]) - 1)]
    (test_run,) = [c for c in commands(CI) if c[:3] == ["python", "-m", "pytest"]]
    count = int(test_run[test_run.index("--zoo-shard") + 1].split("/")[1])
    for python in PYTHONS:
        for torch_version in versions:
            shards = sorted(r["shard"] for r in rows if r["python"] == python and r["torch"] == torch_version)
            assert shards in ([], list(range(1, count + 1))), (python, torch_version, shards)
    assert any(r["torch"] == versions[0] for r in rows) and any(r["torch"] == versions[-1] for r in rows)


def test_ci_mirrors_ci_run():
    # .ci/run's commands after its install step (ruff, the README's test command) run in CI too.
    local = [shlex.split(line.replace("python3", "python")) for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.startswith("python3 -m") and " pip " not in line]  # fmt: skip
    assert local, "no command found in .ci/run"
    remote = commands(CI, shard="1")
    for command in local:
        assert any(r[: len(command)] == command for r in remote), command
    assert "pytest -n 2" in (ROOT / "README.md").read_text()


def module_exists(name: str) -> bool:
    """Whether ``python -m name`` finds a module, found on sys.path as the import would. Not through
    ``importlib.util.find_spec``, for pip: setuptools' distutils hack, asked for pip, turns itself off for the rest of
    the process, and Inductor's C++ build (which imports setuptools) then fails in every later test of the worker."""
    if "." in name:
        return importlib.util.find_spec(name) is not None
    return importlib.machinery.PathFinder.find_spec(name) is not None


@pytest.mark.parametrize("path", [CI, PLUGIN_CI], ids=["ci", "plugin"])
def test_every_command_a_workflow_runs_exists_in_the_project(path):
    scripts = PYPROJECT["project"]["scripts"]
    pytest_options = re.findall(r'addoption\(\s*"(--[\w-]+)"', (ROOT / "pytest_zoo.py").read_text())
    for words in commands(path):
        program = words[0]
        if program == "python":
            assert words[1] == "-m" and module_exists(words[2]), words
            if words[2] == "pytest":
                for word in words[3:]:
                    if word.startswith("--zoo"):
                        assert word in pytest_options, word
                    elif not word.startswith("-") and not re.fullmatch(r"\d+(/\d+)?", word):
                        assert (ROOT / word).exists(), word
            if words[2] == "pip" and words[3] == "install":
                local = [w for w in words[4:] if w.startswith("./")]
                assert all((ROOT / w).is_dir() for w in local), local
        elif program.startswith("zoo-"):
            assert program in scripts, program
            if program == "zoo-contract":
                contract_parser().parse_args(words[1:])  # exits 2 on an option it does not take
        else:
            assert program in ("test", "echo", "exit"), words
