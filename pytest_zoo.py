"""zoo's pytest plugin (entry point ``pytest11``: ``zoo``): the block contract as tests in any project.

``pytest --zoo-part norm=dyt`` adds one test per combination with that part (ids like
``zoo-contract::pre-dyt-gqa-rotary-swiglu``); ``--zoo-contract`` one per combination of every installed
part; ``--zoo-coverage pairwise`` a covering set instead of every combination; ``--zoo-shard I/N`` runs
shard I of N of whatever was collected. Without these options it adds nothing and imports nothing:
this module loads in every pytest session of an environment where zoo is installed, so zoo (and
torch) are imported only when asked for. Disable it with ``-p no:zoo``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

NAME = "zoo-contract"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("zoo", "zoo's block contract (the zoo-contract command as tests)")
    group.addoption("--zoo-part", action="append", default=[], metavar="AXIS=NAME",
                    help="add a contract test for every combination with this part (norm=dyt; its variants "
                    "included, or NAME+VARIANT alone); repeat for several parts (their union)")  # fmt: skip
    group.addoption("--zoo-contract", action="store_true", help="add a contract test for every installed part")
    group.addoption("--zoo-coverage", choices=("full", "pairwise"), default="full",
                    help="the combinations: full (every one) or pairwise (a covering set); default full")  # fmt: skip
    group.addoption("--zoo-shard", metavar="I/N", default=None,
                    help="run shard I of N: the tests of one combination together, every other test alone, "
                    "dealt in collection order")  # fmt: skip


def wanted(config: pytest.Config) -> bool:
    return bool(config.getoption("zoo_part") or config.getoption("zoo_contract"))


#: The --zoo-part options, parsed when pytest starts: under xdist a bad one is a usage error before any worker starts
#: (at collection, each worker failed alone and xdist reported only "no tests ran").
PARTS = pytest.StashKey[list[tuple[str, str]]]()


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("zoo_shard") is not None:
        config.pluginmanager.register(Sharder(parse(config.getoption("zoo_shard"))), "zoo-shard")
    if config.getoption("zoo_part"):
        config.stash[PARTS] = parse_parts(config.getoption("zoo_part"))


def parse(text: str) -> tuple[int, int]:
    from zoo.core.errors import ConfigError
    from zoo.testing.combos import parse_shard

    try:
        return parse_shard(text)
    except ConfigError as error:
        raise pytest.UsageError(f"--zoo-shard {text}: {error}") from None


def parse_parts(options: list[str], flag: str = "--zoo-part") -> list[tuple[str, str]]:
    """``["norm=dyt"]`` -> [("norm", "dyt")], each checked against the registry; a bad one is pytest's usage error
    naming ``flag`` (zoo's own tests take the same values as ``--part``)."""
    from zoo.core.errors import ConfigError
    from zoo.testing.combos import parse_part

    parts = []
    for option in options:
        try:
            parts.append(parse_part(option))
        except ConfigError as error:
            raise pytest.UsageError(f"{flag} {option}: {error}") from None
    return parts


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add the contract's tests (before -k, -m and sharding select among them)."""
    if not wanted(config):
        return
    from zoo.testing.combos import combo_id, select

    parts = config.stash.get(PARTS, [])
    parent = Contract.from_parent(session, name=NAME, path=session.path, nodeid=NAME)
    added = [
        ContractItem.from_parent(parent, name=combo_id(c), combo=c)
        for c in select(config.getoption("zoo_coverage"), parts)
    ]
    session.ihook.pytest_collectreport(report=pytest.CollectReport(NAME, "passed", None, added))  # counted as collected
    items.extend(added)


class Contract(pytest.Collector):
    """The parent of the contract's tests (they are made at collection's end, not collected)."""

    def collect(self) -> list[pytest.Item]:
        return []


class ContractFailure(Exception):
    """Raised by a contract test: one line per failing property."""


class ContractItem(pytest.Item):
    """One combination: every contract property on it (zoo.testing.run.check)."""

    def __init__(self, *, combo: dict[str, str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.combo = combo

    def runtest(self) -> None:
        from zoo.testing.run import check

        outcome = check(self.combo)
        self.user_properties.append((NAME, json.dumps(outcome.__dict__)))
        if outcome.status == "skipped":
            pytest.skip(outcome.reason)
        if outcome.status == "failed":
            raise ContractFailure("\n".join(outcome.lines()))
        if outcome.status == "declared":
            pytest.xfail("; ".join(outcome.excused))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, ContractFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{NAME} {self.name}"


class Sharder:
    """``--zoo-shard I/N``: after every other selection, keep the I-th of every N groups of tests, a
    group being the tests over one combination (a ``combo`` parameter, or a contract test), or else one test."""

    def __init__(self, shard: tuple[int, int]) -> None:
        self.index, self.count = shard

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        groups: dict[str, int] = {}
        for item in items:
            groups.setdefault(group_of(item), len(groups))
        keep = [item for item in items if groups[group_of(item)] % self.count == self.index - 1]
        drop = [item for item in items if groups[group_of(item)] % self.count != self.index - 1]
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep


def group_of(item: pytest.Item) -> str:
    """The combination ``item`` runs on (``combo:<id>``), or its own node id."""
    combo = getattr(item, "combo", None)
    if combo is None:
        callspec = getattr(item, "callspec", None)
        combo = callspec.params.get("combo") if callspec is not None else None
    if isinstance(combo, dict):
        return "combo:" + "-".join(map(str, combo.values()))
    return item.nodeid


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The contract's summary (zoo.testing.run.summary) when its tests ran."""
    reports = [r for key in ("passed", "failed", "skipped", "xfailed") for r in terminalreporter.stats.get(key, [])]
    records = [json.loads(v) for r in reports if r.when == "call" for key, v in r.user_properties if key == NAME]
    if not records:
        return
    from zoo.testing.run import Outcome, summary

    for line in summary([Outcome(**record) for record in records], f" ({NAME})"):
        terminalreporter.write_line(line)
