"""zoo.testing as a tool: the combinations a run selects, shards that split them, the ``zoo-contract``
command's lines and exit status, and the pytest plugin (``--zoo-part``) from a folder without zoo's
sources, on parts that break the contract on purpose."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import registered
from torch import nn

from zoo import AXES, NORMS
from zoo.testing.cli import main
from zoo.testing.combos import choices, combinations, combo_id, covering_combinations, has_part, select, shard


class Leaky(nn.Module):
    """Subtracts the mean over the time axis: every position sees the future."""

    def __init__(self, dims) -> None:  # noqa: ANN001
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dims.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean(dim=1, keepdim=True)) * self.weight


class Overflowing(nn.Module):
    """RMS norm that returns NaN wherever the input is large."""

    def __init__(self, dims) -> None:  # noqa: ANN001
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dims.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return torch.where(x.abs() > 1e3, torch.nan, y)


@pytest.fixture
def broken_norms():
    with registered((NORMS, "leaky", Leaky), (NORMS, "overflowing", Overflowing)):
        yield


@pytest.mark.parametrize("coverage", ["full", "pairwise"])
def test_shards_are_disjoint_balanced_deterministic_and_make_up_the_whole(coverage):
    combos = select(coverage)
    whole = [combo_id(c) for c in combos]
    assert len(set(whole)) == len(whole)
    for count in (1, 2, 3, 4, 7):
        shards = [[combo_id(c) for c in shard(combos, i, count)] for i in range(1, count + 1)]
        assert sorted(itertools.chain(*shards)) == sorted(whole)  # union, each once: disjoint
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
        assert shards == [[combo_id(c) for c in shard(select(coverage), i, count)] for i in range(1, count + 1)]
    with pytest.raises(ValueError, match="shard 5/4"):
        shard(combos, 5, 4)


def test_full_coverage_of_a_part_is_every_combination_with_it_or_its_variants():
    chosen = select("full", [("attn", "gqa")])
    assert chosen == [c for c in combinations() if c["attn"].partition("+")[0] == "gqa"]
    assert {c["attn"] for c in chosen} == {"gqa"} | {c for c in choices("attn") if c.startswith("gqa+")}
    assert select("full", [("attn", "gqa+window")]) == [c for c in combinations() if c["attn"] == "gqa+window"]
    both = select("full", [("norm", "rmsnorm"), ("mlp", "moe")])  # the union
    assert {combo_id(c) for c in both} == {combo_id(c) for c in combinations() if c["norm"].startswith("rmsnorm") or
                                           c["mlp"].startswith("moe")}  # fmt: skip


@pytest.mark.parametrize("part", [("norm", "rmsnorm"), ("mlp", "moe"), ("attn", "gqa+window")])
def test_pairwise_coverage_of_a_part_meets_every_pair_of_other_parts_with_it(part):
    axis, name = part
    rows = select("pairwise", [part])
    assert rows and all(has_part(row, part) for row in rows)
    others = [a for a in AXES if a != axis]
    met = {
        (a, r[a].partition("+")[0], b, r[b].partition("+")[0]) for r in rows for a, b in itertools.combinations(AXES, 2)
    }
    for a, b in itertools.combinations(others, 2):
        for x, y in itertools.product(AXES[a].names(), AXES[b].names()):
            assert (a, x, b, y) in met, f"{a}={x} never meets {b}={y} beside {axis}={name}"
    for a in others:  # every variant of every other axis runs once at least (on the first part that takes it)
        variants = {label.partition("+")[2] for label in choices(a)[len(AXES[a].names()) :]}
        assert variants <= {r[a].partition("+")[2] for r in rows}, a
    own = [c for c in choices(axis) if c == name or ("+" not in name and c.startswith(f"{name}+"))]
    assert {r[axis] for r in rows} == set(own)
    if "+" not in name:
        assert len(rows) < len(select("full", [part])) / 5


def test_covering_set_is_unchanged_without_a_fixed_part():
    assert covering_combinations({}) == covering_combinations()
    assert select("pairwise") == covering_combinations()


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    out = capsys.readouterr()
    return done.value.code, out.out + out.err


def test_a_subjects_other_backends_take_the_configured_blocks_weights_in_any_order():
    """Asked for math first, the subject builds its configured block (sdpa) first and loads its weights into the
    math block: both compute the same function, and the configured block is the one randomized."""
    from zoo.testing.contract import Subject

    subject = Subject.of({"placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "none", "mlp": "gelu"})
    assert subject.backends[:2] == ["sdpa", "math"]
    with torch.no_grad():
        math = subject.block("math")
        assert list(subject._blocks) == ["sdpa", "math"]
        torch.testing.assert_close(math(subject.x), subject.block()(subject.x), rtol=0, atol=1e-12)


def test_zoo_contract_names_the_combination_property_and_values_that_failed(broken_norms, capsys):
    code, out = run_cli(capsys, "norm=leaky", "--coverage", "pairwise")
    assert code == 1
    lines = [line for line in out.splitlines() if line.startswith("FAILED ")]
    causal = [line for line in lines if ": future tokens do not change the past: " in line]
    named = r"FAILED [\w+]+-leaky-[\w+]+-[\w+]+-[\w+]+(-[\w+]+)?: "  # the residual's label when not add
    assert causal and all(re.match(named, line) for line in lines), out
    assert re.search(r"changing the tokens after position 0 changed outputs 0\.\.0: max \|difference\| [\d.e+-]+ > "
                     r"1e-12 allowed", causal[0]), causal[0]  # fmt: skip
    assert any(": the Jacobian is zero on future inputs: sdpa: output 0 depends on later input 1" in x for x in lines)
    summary = next(line for line in out.splitlines() if line.startswith("contract (norm=leaky, pairwise): "))
    ran = int(re.search(r"(\d+) run", summary).group(1))
    assert f": 0 passed, {ran} failed, " in summary, summary  # every valid combination leaks
    assert len({line.split(":")[0] for line in causal}) == ran  # one line per failing combination and property

    code, out = run_cli(capsys, "norm=overflowing", "--coverage", "pairwise", "--shard", "1/4")
    assert code == 1
    finite = [line for line in out.splitlines() if ": finite on huge inputs: " in line]
    pattern = r"float32 inputs at scale 1e4: \d+ of \d+ outputs are not finite, first nan at sample \d, position \d"
    assert finite and all(re.search(pattern + r", feature \d+$", line) for line in finite), out
    assert "contract (norm=overflowing, pairwise, shard 1/4): " in out


def test_zoo_contract_passes_a_sound_part_and_counts_what_it_ran(capsys):
    code, out = run_cli(capsys, "norm=rmsnorm", "pos=alibi", "--coverage", "pairwise", "--shard", "2/3")
    assert code == 0 and "FAILED" not in out, out
    rows = shard(select("pairwise", [("norm", "rmsnorm"), ("pos", "alibi")]), 2, 3)
    head = re.search(r"contract \(norm=rmsnorm, pos=alibi, pairwise, shard 2/3\): (\d+) combinations, (\d+) run .*: "
                     r"(\d+) passed, 0 failed, (\d+) skipped as invalid", out)  # fmt: skip
    assert head and int(head.group(1)) == len(rows), out
    assert int(head.group(2)) == int(head.group(3)) + int(re.search(r"(\d+) failing only", out).group(1))
    assert "  skipped " in out and "contract exceptions declared by parts (combinations):" in out  # linear + alibi; moe


@pytest.mark.parametrize(
    "argv, message",
    [
        (["nrom=rmsnorm"], "part='nrom=rmsnorm': AXIS=NAME with AXIS one of placement, norm"),
        (["norm=rmsnrom"], "did you mean 'rmsnorm'"),
        (["attn=mha+narrow"], "a variant mha takes: mha+window"),
        (["--shard", "3/2"], "shard='3/2': I/N with 1 <= I <= N"),
        (["-n", "0"], "-n=0: at least 1"),
    ],
)
def test_zoo_contract_refuses_bad_arguments_before_any_tensor_work(capsys, argv, message):
    code, out = run_cli(capsys, *argv)
    assert code == 2 and message in out, out


def test_zoo_contract_in_worker_processes_gives_the_same_outcomes(tmp_path):
    command = [sys.executable, "-m", "zoo.testing", "norm=scalenorm", "--coverage", "pairwise", "--shard", "1/5"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    outs = [subprocess.run([*command, *extra], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
            for extra in ([], ["-n", "2"])]  # fmt: skip
    assert [o.returncode for o in outs] == [0, 0], outs[1].stderr[-2000:]
    assert outs[0].stdout.splitlines()[:-1] == outs[1].stdout.splitlines()[:-1]  # all but the timing line


def write_plugin(root: Path, name: str, source: str) -> None:
    """A norm plugin as pip leaves one: its module and a .dist-info with the zoo.parts entry point."""
    (root / f"{name}.py").write_text(textwrap.dedent(source))
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[zoo.parts]\n{name} = {name}\n")


LEAKY_PLUGIN = """
    import torch
    from torch import nn
    from zoo import NORMS


    @NORMS.register("leaky")
    class Leaky(nn.Module):
        def __init__(self, dims):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dims.d_model))

        def forward(self, x):
            return (x - x.mean(dim=1, keepdim=True)) * self.weight
"""


def test_pytest_plugin_runs_the_contract_in_a_project_without_zoos_sources(tmp_path):
    site, project = tmp_path / "site", tmp_path / "project"
    site.mkdir()
    project.mkdir()
    write_plugin(site, "zoo_leaky", LEAKY_PLUGIN)
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}

    def pytest_(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rf", *args]
        return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=300)

    listed = pytest_("--co", "-q", "--zoo-part", "norm=leaky", "--zoo-coverage", "pairwise")
    ids = re.findall(r"^zoo-contract::(\S+)$", listed.stdout, flags=re.MULTILINE)
    assert ids and all(i.split("-")[1] == "leaky" for i in ids), listed.stdout[-2000:]
    sharded = [pytest_("--co", "-q", "--zoo-part", "norm=leaky", "--zoo-coverage", "pairwise", "--zoo-shard", f"{i}/2")
               for i in (1, 2)]  # fmt: skip
    halves = [re.findall(r"^zoo-contract::(\S+)$", s.stdout, flags=re.MULTILINE) for s in sharded]
    assert sorted(halves[0] + halves[1]) == sorted(ids) and not set(halves[0]) & set(halves[1])

    one = pytest_("--zoo-part", "norm=leaky", "--zoo-coverage", "pairwise", "-k", ids[0])
    assert one.returncode == 1, one.stdout[-3000:]
    assert f"FAILED zoo-contract::{ids[0]}" in one.stdout
    assert f"FAILED {ids[0]}: future tokens do not change the past: sdpa: changing the tokens after" in one.stdout
    assert re.search(r"contract \(zoo-contract\): 1 combinations, 1 run .*: 0 passed, 1 failed", one.stdout)

    typo = pytest_("--zoo-part", "norm=leaky", "--zoo-part", "norm=rmsnrom")
    assert typo.returncode == 4 and "did you mean 'rmsnorm'" in typo.stderr, typo.stderr[-2000:]


def test_pytest_plugin_adds_nothing_and_imports_neither_zoo_nor_torch_unless_asked(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    script = (
        "import sys, pytest; code = pytest.main(['-q', '-p', 'no:cacheprovider', '-p', 'no:xdist', '.']); "
        "print(int(code), 'torch' in sys.modules, 'zoo' in sys.modules, 'pytest_zoo' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-1] == "0 False False True", done.stdout[-2000:]
    assert "1 passed" in done.stdout


def test_a_bad_part_option_is_a_usage_error_naming_it_under_xdist_too(tmp_path):
    """``pytest -n 2 --part norm=nosuch`` (zoo's own tests) and ``pytest -n 2 --zoo-part norm=nosuch`` (the plugin, in
    any project): pytest's usage error naming the option and the registered norms, from the controlling process
    before any worker starts. Checked at collection, each worker failed alone: xdist answered the first with an
    internal error that hid the message, the second with "no tests ran"."""
    root = Path(__file__).parent.parent
    for cwd, option in ((root, ["tests/test_contract.py", "--part"]), (tmp_path, ["--zoo-part"])):
        argv = [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", *option, "norm=nosuch"]
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
        shown = done.stdout[-2000:] + done.stderr[-2000:]
        assert done.returncode == pytest.ExitCode.USAGE_ERROR, shown
        assert f"{option[-1]} norm=nosuch: block.norm.name='nosuch': unknown norm; registered: layernorm" in shown
        assert "INTERNALERROR" not in shown
