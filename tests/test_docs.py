"""The Python examples in docs/ run, in order, as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.DOTALL | re.MULTILINE)


@pytest.fixture
def registries_restored():
    """What an example registers (a part, a tracker) is gone after it: other tests see zoo's own."""
    from zoo.core.registry import Registry

    before = {registry: dict(registry._parts) for registry in Registry._every}
    yield
    for registry, parts in before.items():
        registry._parts.clear()
        registry._parts.update(parts)


@pytest.mark.parametrize("page", ["inference.md", "composing.md", "runs.md"])
def test_doc_examples_run(page, registries_restored):
    blocks = python_blocks(DOCS / page)
    assert blocks, f"{page} has no python example"
    namespace: dict[str, object] = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{page} block {i}", "exec"), namespace)


def test_every_path_a_page_names_is_there_or_one_it_says_to_add():
    """A repository path in a page (`zoo/lab/tasks/base.py`, `conf/task/`) exists, or is a file the page
    tells the reader to create, in a folder that exists (`conf/task/copy.yaml`): never one of a layout
    the code has left."""
    root = DOCS.parent
    for page in [root / "README.md", *sorted(DOCS.glob("*.md"))]:
        named = re.findall(r"(?<![\w/.])((?:zoo|tests|conf|benchmarks|sweeps|examples)/[\w/.\-]*\w)", page.read_text())
        for path in sorted(set(named)):
            assert (root / path).exists() or (root / path).parent.is_dir(), f"{page.name} names {path}: no such folder"
