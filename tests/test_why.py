"""Claims made in docs/why.md, checked."""

from __future__ import annotations

import torch

from zoo import build_block
from zoo.core.dims import BlockDims
from zoo.parts.positions import Rotary
from zoo.testing.combos import TINY


def silenced_block(placement: str) -> torch.nn.Module:
    """A block whose branches output zero (output projections zeroed)."""
    block = build_block(
        {**TINY, "placement": placement, "norm": "layernorm", "attn": "mha", "pos": "none", "mlp": "gelu"}
    ).double()
    with torch.no_grad():
        for linear in (block.attn.out, block.mlp.down):
            linear.weight.zero_()
            linear.bias.zero_()
    return block


def test_pre_norm_keeps_an_exact_identity_path():
    x = torch.randn(1, 3, TINY["d_model"], dtype=torch.float64)
    jacobian = torch.autograd.functional.jacobian(silenced_block("pre"), x).reshape(x.numel(), x.numel())
    torch.testing.assert_close(jacobian, torch.eye(x.numel(), dtype=x.dtype), rtol=0, atol=0)
    # Post-norm normalizes the stream itself: even with silent branches the Jacobian is not I.
    post = torch.autograd.functional.jacobian(silenced_block("post"), x).reshape(x.numel(), x.numel())
    assert (post - torch.eye(x.numel(), dtype=x.dtype)).abs().max() > 0.1


def test_rotary_scores_depend_only_on_relative_position():
    dims = BlockDims(d_model=16, n_heads=2)
    rotary = Rotary(dims)
    q = torch.randn(1, 2, 1, dims.d_head, dtype=torch.float64)
    k = torch.randn(1, 2, 1, dims.d_head, dtype=torch.float64)

    def score(m: int, n: int) -> torch.Tensor:
        q_m, _ = rotary.rotate(q, q, torch.tensor([m]))
        _, k_n = rotary.rotate(k, k, torch.tensor([n]))
        return (q_m * k_n).sum(-1)

    torch.testing.assert_close(score(7, 3), score(104, 100), rtol=0, atol=1e-12)
    assert not torch.allclose(score(7, 3), score(7, 5))


def test_the_lab_map_names_every_lab_module_and_only_those():
    """Each module of zoo/lab has its row in docs/why.md's map (``files.py``, ``training/trainer.py``), and
    the map names no module that is gone."""
    import re

    from helpers import ROOT

    page = (ROOT / "docs" / "why.md").read_text()
    section = page.split("## A map of the lab", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| `")]
    named = {name for line in table for name in re.findall(r"`([\w/]+\.py)`", line.split("|")[1])}
    lab = ROOT / "zoo" / "lab"
    modules = {str(p.relative_to(lab)) for p in lab.rglob("*.py") if p.name != "__init__.py"}
    assert named == modules, (
        f"docs/why.md's lab map: missing {sorted(modules - named)}, stale {sorted(named - modules)}"
    )
