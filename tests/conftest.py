"""Test setup: one torch thread per worker (the contract matrix is many tiny ops), the slow tests run first,
``--part AXIS=NAME`` (only the tests over combinations that contain that part), and a summary of the contract suite's
combinations at the end of the run."""

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Bytecode caches written, whatever the environment says: each zoo command a test runs in a new process then loads
# zoo's compiled modules (~0.3 s of CPU less each) instead of compiling them again; a test that runs a copy of the
# sources sets PYTHONDONTWRITEBYTECODE back for it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

from collections import Counter  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from pytest_zoo import parse_parts  # noqa: E402  (the plugin's: --part takes what --zoo-part takes)

torch.set_num_threads(1)

CONTRACT = "test_contract.py::test_block_contract["
WANTED_PARTS = pytest.StashKey[list[tuple[str, str]]]()  # the --part options, parsed


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--part",
        action="append",
        default=[],
        metavar="AXIS=NAME",
        help="run only the tests over combinations of parts (the contract suite) whose combination has this "
        "part, e.g. --part norm=dyt (its variants included: NAME+VARIANT); repeat to require several parts",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SlowFirst(), "zoo-slow-first")
    # Checked here, not at collection: under xdist the controlling process reports a usage error before any worker
    # starts, where a worker failing at collection left only xdist's internal error.
    config.stash[WANTED_PARTS] = parse_parts(config.getoption("part"), "--part")


class SlowFirst:
    """The slow tests first (in their order), so that under xdist no worker is left idle at the end while the
    other finishes a long one: what is dealt last is the contract's tests of milliseconds each."""

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under ``-n``, work stealing: xdist's default ("load") hands each worker a fixed first chunk of a quarter of
    its share, so one worker got every slow test and ran minutes after the other had run dry; here a worker that
    runs dry takes half of the other's queue."""
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from zoo.testing.combos import has_part

    wanted = config.stash[WANTED_PARTS]
    if not wanted:
        return
    keep, drop = [], []
    for item in items:
        combo = getattr(item, "callspec", None) and item.callspec.params.get("combo")
        matches = isinstance(combo, dict) and all(has_part(combo, part) for part in wanted)
        (keep if matches else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def parse_part(option: str) -> tuple[str, str]:
    """``norm=dyt`` -> ("norm", "dyt"), checked against the registry as the plugin's ``--zoo-part`` is."""
    return parse_parts([option], "--part")[0]


@pytest.fixture(autouse=True)
def _seed_and_threads(request: pytest.FixtureRequest) -> Iterator[None]:
    # The CPU generator only: torch.manual_seed also queues a CUDA seeding that formats a stack trace
    # (milliseconds per test, thousands of tests).
    torch.random.default_generator.manual_seed(0)
    yield
    # A test that trained in this process at threads=null (the machine's cores) must not leave every later test
    # in this worker fighting the other worker for the cores (spinning threads: tiny ops 10x slower and more).
    if (threads := torch.get_num_threads()) != 1:
        request.node.user_properties.append(("threads left", threads))
        torch.set_num_threads(1)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    """How many combinations the contract suite ran (and in which context), skipped (and why), the
    properties that did not apply, and every exception a part declares (contract.py: failed as
    declared, the test xfailed, or held anyway), so no declared exception goes unseen."""
    stats = terminalreporter.stats
    every = [r for key in ("passed", "failed", "skipped", "xfailed") for r in stats.get(key, [])]
    write = terminalreporter.write_line
    reports = [r for r in every if CONTRACT in r.nodeid and (r.when == "call" or r.skipped)]
    if reports:
        xfailed = [r for r in reports if hasattr(r, "wasxfail")]
        skipped = Counter(
            r.longrepr[2].removeprefix("Skipped: ") for r in reports if r.skipped and not hasattr(r, "wasxfail")
        )
        ran = [r for r in reports if not r.skipped or hasattr(r, "wasxfail")]
        where = {"block": "as a lone block", "model": "behind a model's position embedding"}
        contexts = Counter(where.get(dict(r.user_properties).get("context"), "?") for r in ran)
        notes = Counter(value for r in ran for key, value in r.user_properties if key == "note")
        write(
            f"contract: {len(reports)} combinations, {len(ran)} run ("
            + ", ".join(f"{n} {context}" for context, n in sorted(contexts.items()))
            + f"), {sum(skipped.values())} skipped as invalid"
            + (f", {len(xfailed)} failing only where a part declares it cannot hold" if xfailed else "")
        )
        for reason, n in skipped.most_common():
            write(f"  skipped {n}: {reason}")
        for note, n in notes.most_common():
            write(f"  {n} x {note}")
    teardowns = [r for reports in stats.values() for r in reports if getattr(r, "when", None) == "teardown"]
    leaks = sorted({r.nodeid for r in teardowns for key, _ in r.user_properties if key == "threads left"})
    if leaks:
        write(f"{len(leaks)} tests left torch at more than one thread (reset to 1 after each): " + ", ".join(leaks))
    contract = [r for r in every if "test_contract.py::" in r.nodeid and r.when == "call"]
    declared = Counter(value for r in contract for key, value in r.user_properties if key == "declared")
    if declared:
        write("contract exceptions declared by parts (combinations):")
        for message, n in sorted(declared.items()):
            write(f"  {n} x {message}")


@pytest.fixture
def float64(monkeypatch):
    """Call with a transformers modeling module: its float32 casts compute in float64 for this test
    (helpers.lift_to_float64)."""
    from helpers import lift_to_float64

    return lambda module: lift_to_float64(monkeypatch, module)
