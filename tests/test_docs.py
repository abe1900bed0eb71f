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
