"""docs/adding-a-part.md, followed literally: the DyT steps in a copy of the repository, and the
package of its per-axis examples (``my_parts``), built from the page's code blocks and installed as
a plugin (a ``.dist-info`` with its entry points on the path)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
from helpers import ROOT, as_overrides, tiny_cli

import zoo
from zoo.testing.combos import paired_choices, product_names

TUTORIAL = ROOT / "docs" / "adding-a-part.md"


def files_in_tutorial(*prefixes: str) -> dict[str, str]:
    """The code blocks headed ``title="<path>"`` whose path starts with one of ``prefixes``: path -> content."""
    blocks = re.findall(r'^```\w+ title="([^"]+)"\n(.*?)^```', TUTORIAL.read_text(), flags=re.DOTALL | re.MULTILINE)
    return {path: text for path, text in blocks if path.startswith(prefixes)}


@pytest.mark.slow
def test_tutorial_part_appears_in_zoo_parts_the_contract_suite_and_a_sweep(tmp_path):
    repo = tmp_path / "zoo"
    for folder in ("zoo", "conf", "tests", "sweeps", "docs"):
        shutil.copytree(ROOT / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for data in ("conf", "sweeps"):  # laid out as pyproject's package-dir installs them: zoo.conf, zoo.sweeps
        (repo / "zoo" / data).symlink_to(repo / data, target_is_directory=True)
    files = files_in_tutorial("zoo/", "conf/")
    assert set(files) == {"zoo/parts/norms.py", "conf/norm/dyt.yaml"}
    with open(repo / "zoo/parts/norms.py", "a") as f:  # step 1: append the class
        f.write("\n\n" + files["zoo/parts/norms.py"])
    (repo / "conf/norm/dyt.yaml").write_text(files["conf/norm/dyt.yaml"])  # step 2
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    # Step 3: zoo-parts lists it with its option.
    listing = run("-c", "from zoo.lab.commands.parts import parts_main; parts_main([])")
    assert re.search(r"^\s+dyt\s+DyT: .*\[alpha_init=0.5\]", listing, flags=re.MULTILINE), listing
    # The contract suite covers it with no test edit: its combinations are collected by name.
    collected = run("-m", "pytest", "--co", "-q", "-p", "no:xdist", "tests/test_contract.py", "--part", "norm=dyt")
    ids = re.findall(r"test_block_contract\[(.*?)\]", collected)
    assert "pre-dyt-gqa-rotary-swiglu" in ids and all(i.split("-")[1] == "dyt" for i in ids), collected[-2000:]
    others = [axis for axis in zoo.AXES if axis != "norm"]
    product = math.prod(len(product_names(axis)) for axis in others if not zoo.AXES[axis].paired)
    paired = sum(len(paired_choices(axis)) for axis in others)  # variants, paired parts, a paired axis' other parts
    assert len(ids) == len(set(ids)) == product + paired  # the product with dyt, and dyt with each of those
    # And a sweep from the command line trains with it.
    small = as_overrides(tiny_cli(d_model=32))
    run("-m", "zoo.train", "-m", "norm=layernorm,dyt", *small, "hydra.sweep.dir=sweep")
    statuses = {p.parent.name: json.loads(p.read_text())["status"] for p in (repo / "sweep").glob("*/summary.json")}
    assert len(statuses) == 2 and set(statuses.values()) == {"ok"}, statuses
    assert any("dyt" in name for name in statuses), statuses


def test_the_example_plugins_files_are_the_ones_the_page_shows():
    shown = files_in_tutorial("examples/")
    assert set(shown) == {
        "examples/zoo-dyt/pyproject.toml",
        "examples/zoo-dyt/zoo_dyt/__init__.py",
        "examples/zoo-dyt/zoo_dyt/conf/norm/dyt.yaml",
    }
    for path, text in shown.items():
        assert (ROOT / path).read_text() == text, f"{path} differs from docs/adding-a-part.md"


@pytest.mark.slow
def test_every_axis_example_is_a_part_like_the_built_in_ones(tmp_path):
    files = files_in_tutorial("my_parts/", "my_conf/")
    assert {p.split("/")[-2] for p in files if p.endswith(".yaml")} == {"placement", "mlp", "pos", "attn"}
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / "my_parts" / "conf" / "__init__.py").touch()
    info = tmp_path / "my_parts-0.1.dist-info"  # what pip install leaves, for importlib.metadata
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-parts\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[zoo.parts]\nmy_parts = my_parts\n\n[zoo.conf]\nmy_parts = my_parts.conf\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    listing = run("-c", "from zoo.lab.commands.parts import parts_main; parts_main([])")
    for name in ("deepnorm", "rezero", "glu", "kerple", "gated"):
        assert re.search(rf"^  {name} +\S.*  \(from my-parts\)$", listing, flags=re.MULTILINE), listing
    # Parameter matching takes the new MLP with nothing declared: glu lands at gelu's count.
    table = run("-c", "from zoo.lab.commands.parts import parts_main; parts_main(['--params', '--d-model', '64', "
                "'--n-heads', '4', 'placement=pre', 'norm=rmsnorm', 'attn=mha', 'pos=none', 'mlp=gelu,glu', "
                "'block.mlp.match=params'])")  # fmt: skip
    lines = [line for line in table.splitlines() if line.startswith("| pre ")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    counts = {row[4]: [int(cell.replace(",", "")) for cell in row[-2:]] for row in rows}  # params, matched to
    assert counts["gelu"][0] == counts["gelu"][1] == counts["glu"][1], table
    assert abs(counts["glu"][0] - counts["glu"][1]) <= 3 * 64, table  # within one hidden unit
    # The contract suite on the combinations with all four (each was run on every combination with it).
    parts = ["--part", "placement=deepnorm", "--part", "attn=gated", "--part", "pos=kerple", "--part", "mlp=glu"]
    contract = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rA",
         str(ROOT / "tests" / "test_contract.py"), *parts],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert contract.returncode == 0, contract.stdout[-3000:]
    passed = set(re.findall(r"^PASSED \S+::test_block_contract\[(.*?)\]", contract.stdout, flags=re.MULTILINE))
    expected = {f"deepnorm-{norm}-gated-kerple-glu" for norm in zoo.AXES["norm"].names()}
    assert passed == expected, contract.stdout[-3000:]
    # One sweep: post vs DeepNorm at alpha = 1.414 (an option file per setting), and partial rotary
    # from a folder of option files of one's own (--config-dir), with every new part in training.
    small = ["block.d_model=16", "block.n_heads=4", "model.n_layers=2", "task.max_bytes=20000", "task.seq_len=16",
             "train.steps=2", "train.batch_size=2", "train.eval_batches=1", "threads=1"]  # fmt: skip
    run("-m", "zoo.train", "-m", "--config-dir", "my_conf", "placement=post,deepnorm_a1414",
        "pos=kerple,rotary_half", "attn=gated", "mlp=glu", *small, "hydra.sweep.dir=sweep")  # fmt: skip
    runs = [json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/summary.json")]
    assert sorted(r["status"] for r in runs) == ["ok"] * 4
    settings = {(r["choices"]["placement"], r["choices"]["pos"]): r["config"]["block"] for r in runs}
    assert settings[("deepnorm_a1414", "kerple")]["placement"] == {"name": "deepnorm", "alpha": 1.414}
    assert settings[("post", "rotary_half")]["pos"] == {"name": "rotary", "base": 10000.0, "rotary_fraction": 0.5}
    report = (tmp_path / "sweep" / "report.md").read_text()
    assert "| placement | pos |" in report and "| deepnorm_a1414 | kerple |" in report, report
    # The norm-free example passes the contract, and its runs record no norm choice.
    rezero = run("-m", "zoo.testing", "placement=rezero", "--coverage", "pairwise")
    assert re.search(r"contract \(placement=rezero, pairwise\): \d+ combinations, \d+ run .*: \d+ passed, 0 failed",
                     rezero), rezero[-2000:]  # fmt: skip
    run("-m", "zoo.train", "-m", "placement=rezero", "norm=rmsnorm,layernorm", *small, "hydra.sweep.dir=rezero")
    runs = [json.loads(p.read_text()) for p in (tmp_path / "rezero").glob("*/summary.json")]
    assert [(r["status"], r["unused_axes"], "norm" in r["choices"]) for r in runs] == [("ok", ["norm"], False)] * 2
    assert "1 variants" in (tmp_path / "rezero" / "report.md").read_text()
