"""zoo as a library: its wheel, installed (not editable) into a fresh virtual environment beside the
example plugin's (examples/zoo-dyt), works from an empty folder; the plugin's part shows up in
zoo-parts, composes, trains, sweeps, and passes the contract suite like a built-in part.

The environment is new but borrows torch and the rest from this interpreter's site-packages (a
``.pth`` file, read after the environment's own packages, so the wheel's zoo is the one imported and
no editable install's import hook is). One test: the subprocess work shares a wheel build.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, as_overrides, tiny_cli

PLUGIN = ROOT / "examples" / "zoo-dyt"
TINY = as_overrides(tiny_cli())


def files_in(page: Path, prefix: str) -> dict[str, str]:
    """The code blocks of ``page`` headed ``title="<prefix>..."``: path -> content."""
    blocks = re.findall(r'^```\w+ title="([^"]+)"\n(.*?)^```', page.read_text(), flags=re.DOTALL | re.MULTILINE)
    return {path: text for path, text in blocks if path.startswith(prefix)}


def builds_wheels_here() -> bool:
    """Whether this interpreter's setuptools builds wheels itself (bdist_wheel built in since 70.1)."""
    try:
        major, minor = (int(x) for x in importlib.metadata.version("setuptools").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (70, 1)


def build_wheels(tmp: Path) -> list[Path]:
    """zoo's wheel and the plugin's, built from copies (an in-tree build leaves build/ behind)."""
    source = tmp / "source"
    for name in ("zoo", "conf", "sweeps"):
        shutil.copytree(ROOT / name, source / "zoo" / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "pytest_zoo.py"):
        shutil.copy(ROOT / name, source / "zoo" / name)
    shutil.copytree(PLUGIN, source / "zoo-dyt", ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    isolation = ["--no-build-isolation"] if builds_wheels_here() else []  # else pip fetches setuptools
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(tmp / "dist")]
    done = subprocess.run([*command, str(source / "zoo"), str(source / "zoo-dyt")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return sorted((tmp / "dist").glob("*.whl"))


def make_venv(path: Path, wheels: list[Path]) -> Path:
    """A virtual environment holding the wheels, with this interpreter's site-packages behind its own."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    own = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                         text=True, check=True).stdout.strip()  # fmt: skip
    borrowed = [p for p in [*site.getsitepackages(), site.getusersitepackages()] if Path(p).is_dir()]
    (Path(own) / "borrowed-site-packages.pth").write_text("".join(f"{p}\n" for p in borrowed))
    install(path, wheels, "--ignore-installed")
    return path / "bin"


def install(venv: Path, wheels: list[Path], *flags: str) -> None:
    """pip install the wheels into ``venv``, offline, without their dependencies."""
    command = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-index"]
    done = subprocess.run([*command, "--no-deps", *flags, *map(str, wheels)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


#: Forward passes that break the contract, and the start of the failure line zoo-contract must print.
BROKEN = {
    # averages over the time axis: every position sees the future
    "return (x - x.mean(dim=1, keepdim=True)) * self.weight": r"future tokens do not change the past: ",
    # NaN wherever the input is large
    "return torch.where(x.abs() > 1e3, torch.nan, torch.tanh(self.alpha * x) * self.weight)": (
        r"finite on huge inputs: float32 inputs at scale 1e4: \d+ of \d+ outputs are not finite"
    ),
}


def plugin_copy(tmp: Path, forward: str) -> Path:
    """The example plugin's wheel, its norm's forward pass replaced by ``forward``."""
    source = tmp / "broken" / str(len(list((tmp / "broken").glob("*"))) if (tmp / "broken").exists() else 0)
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    module = source / "zoo_dyt" / "__init__.py"
    text = module.read_text()
    body = text[text.index("        y = torch.tanh(self.alpha * x) * self.weight") :]
    module.write_text(text.replace(body, f"        {forward}\n"))
    isolation = ["--no-build-isolation"] if builds_wheels_here() else []
    out = tmp / "broken-dist" / source.name
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(out), str(source)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return next(out.glob("*.whl"))


@pytest.mark.slow
def test_the_wheel_and_a_plugin_work_from_an_empty_folder(tmp_path):
    wheels = build_wheels(tmp_path)
    assert [w.name.split("-")[0] for w in wheels] == ["zoo", "zoo_dyt"]
    bin_ = make_venv(tmp_path / "venv", wheels)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")

    def run(*args: str | Path, returncode: int = 0, cwd: Path = empty) -> str:
        program = str(args[0]) if "/" in str(args[0]) else str(bin_ / args[0])
        done = subprocess.run([program, *map(str, args[1:])], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=600)  # fmt: skip
        assert done.returncode == returncode, f"{args}: " + done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout + done.stderr

    # The wheel's zoo is imported, with its config tree and sweeps inside it, and composes from here.
    script = (
        "import zoo, zoo.lab.commands.sweep as s; cfg = zoo.compose(['preset=llama', 'norm=dyt', 'block.d_model=32']); "
        "zoo.build_block(cfg.block); print(zoo.__file__, zoo.CONF_DIR, s.SWEEPS_DIR, cfg.block.norm.name, sep='\\n')"
    )
    module, conf, sweeps, norm = run("python", "-c", script).split()
    site_packages = str(tmp_path / "venv" / "lib")
    assert all(path.startswith(site_packages) for path in (module, conf, sweeps)), (module, conf, sweeps)
    assert norm == "dyt"

    # zoo-parts names the plugin's part and where it comes from; --check speaks zoo, not Hydra.
    listing = run("zoo-parts")
    assert re.search(r"^  dyt +DyT: .*\[alpha_init=0\.5\]  \(from zoo-dyt\)$", listing, flags=re.MULTILINE), listing
    assert "plugins (entry points zoo.parts): zoo-dyt 0.1.0 (dyt = zoo_dyt)" in listing
    typo = run("zoo-parts", "--check", "norm=dyt", "block.norm.alhpa_init=2", returncode=1)
    assert "invalid: block.norm.alhpa_init=2: not an option of norm 'dyt'; options: alpha_init" in typo

    pytest_ = ["python", "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist"]

    # One run with the plugin's part, then the quick sweep, both at tiny sizes.
    run("zoo-train", "norm=dyt", *TINY, "hydra.run.dir=one")
    summary = json.loads((empty / "one" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["choices"]["norm"] == "dyt"
    assert summary["versions"]["zoo"] == "0.1.0"
    out = run("zoo-sweep", "quick", "seed=0", *TINY, "hydra.sweep.dir=quick")
    statuses = [json.loads(p.read_text())["status"] for p in (empty / "quick").glob("*/summary.json")]
    assert statuses == ["ok"] * 4 and (empty / "quick" / "report.md").is_file(), out[-2000:]

    # A Hydra app of one's own (docs/composing.md) composes zoo's groups, a preset and the plugin's part.
    for path, text in files_in(ROOT / "docs" / "composing.md", "my_app/").items():
        (empty / path).parent.mkdir(parents=True, exist_ok=True)
        (empty / path).write_text(text)
    assert (empty / "my_app" / "app.py").is_file() and (empty / "my_app" / "conf" / "config.yaml").is_file()
    shown = run("python", "my_app/app.py", "preset=llama", "norm=dyt", "hydra.run.dir=app").strip().splitlines()
    assert shown[-1].startswith("pre dyt gqa rotary swiglu: (2, 8, 64)"), shown

    # The contract on the plugin's part from here, without zoo's sources: zoo-contract and the pytest plugin.
    contract = run("zoo-contract", "norm=dyt", "--coverage", "pairwise")
    assert re.search(r"contract \(norm=dyt, pairwise\): \d+ combinations, \d+ run .*: \d+ passed, 0 failed", contract)
    tests = run(*pytest_, "--zoo-part", "norm=dyt", "--zoo-coverage", "pairwise", "--zoo-shard", "1/4")
    assert re.search(r"\b\d+ passed\b", tests) and not re.search(r"\b[1-9]\d* failed", tests), tests[-2000:]
    assert re.search(r"contract \(zoo-contract\): \d+ combinations", tests), tests[-2000:]

    # Copies of the plugin that break the contract fail it, naming the property, a combination and the values.
    for forward, failure in BROKEN.items():
        install(bin_.parent, [plugin_copy(tmp_path, forward)], "--force-reinstall")
        out = run("zoo-contract", "norm=dyt", "--coverage", "pairwise", "--shard", "1/4", returncode=1)
        assert re.search(rf"^FAILED \w+-dyt-[\w+]+-[\w+]+-[\w+]+: {failure}", out, flags=re.MULTILINE), out[-3000:]
    install(bin_.parent, [w for w in wheels if w.name.startswith("zoo_dyt")], "--force-reinstall")
    option_file = run(*pytest_, ROOT / "tests" / "test_config.py", "-k", "every_option_file and dyt")
    assert "1 passed" in option_file, option_file[-2000:]
