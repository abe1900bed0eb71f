"""docs/adding-a-part.md, followed literally in a copy of the repository."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import zoo

ROOT = Path(zoo.__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "adding-a-part.md"


def files_in_tutorial() -> dict[str, str]:
    """The code blocks headed ``title="<path>"``: path -> content."""
    blocks = re.findall(r'^```\w+ title="([^"]+)"\n(.*?)^```', TUTORIAL.read_text(), flags=re.DOTALL | re.MULTILINE)
    return dict(blocks)


@pytest.mark.slow
def test_tutorial_part_appears_in_zoo_parts_the_contract_suite_and_a_sweep(tmp_path):
    repo = tmp_path / "zoo"
    for folder in ("zoo", "conf", "tests", "sweeps", "docs"):
        shutil.copytree(ROOT / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for data in ("conf", "sweeps"):  # laid out as pyproject's package-dir installs them: zoo.conf, zoo.sweeps
        (repo / "zoo" / data).symlink_to(repo / data, target_is_directory=True)
    files = files_in_tutorial()
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
    listing = run("-c", "from zoo.lab.cli import parts_main; parts_main([])")
    assert re.search(r"^\s+dyt\s+DyT: .*\[alpha_init=0.5\]", listing, flags=re.MULTILINE), listing
    # The contract suite covers it with no test edit: its combinations are collected by name.
    collected = run("-m", "pytest", "--co", "-q", "-p", "no:xdist", "tests/test_contract.py", "-k", "dyt")
    assert "test_block_contract[pre-dyt-gqa-rotary-swiglu]" in collected, collected[-2000:]
    # And a sweep from the command line trains with it.
    small = [
        "block.d_model=32",
        "block.n_heads=4",
        "model.n_layers=1",
        "task.max_bytes=20000",
        "task.seq_len=16",
        "train.steps=2",
        "train.batch_size=2",
        "train.eval_batches=1",
        "threads=1",
    ]
    run("-m", "zoo.lab.train", "-m", "norm=layernorm,dyt", *small, "hydra.sweep.dir=sweep")
    statuses = {p.parent.name: json.loads(p.read_text())["status"] for p in (repo / "sweep").glob("*/summary.json")}
    assert len(statuses) == 2 and set(statuses.values()) == {"ok"}, statuses
    assert any("dyt" in name for name in statuses), statuses
