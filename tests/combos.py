"""The contract suite's grid: every combination of registered parts, at tiny sizes.

Generated from the registry at collection time, so a newly registered part is covered at once.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

from zoo import AXES, Block, build_block

#: Tiny sizes: 4 query heads so GQA's 2 kv heads sit strictly between MQA and MHA.
TINY = {"d_model": 16, "n_heads": 4, "d_ff": 24, "bias": True, "dropout": 0.0}


def combinations() -> list[dict[str, str]]:
    names = [registry.names() for registry in AXES.values()]
    return [dict(zip(AXES, combo, strict=False)) for combo in itertools.product(*names)]


def combo_id(combo: dict[str, str]) -> str:
    return "-".join(combo.values())


def every_combination(test: Any) -> Any:
    """Parametrize ``test`` over every combination, with ids like ``pre-rmsnorm-gqa-rotary-swiglu``."""
    combos = combinations()
    return pytest.mark.parametrize("combo", combos, ids=[combo_id(c) for c in combos])(test)


def block_config(combo: dict[str, str], **overrides: Any) -> dict[str, Any]:
    """A plain-dict block config; ``attn`` overrides go in as ``attn={"backend": "math"}``."""
    cfg: dict[str, Any] = {**TINY, **{axis: {"name": name} for axis, name in combo.items()}}
    for key, value in overrides.items():
        if key in AXES:
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


def make_block(combo: dict[str, str], dtype: torch.dtype = torch.float64, **overrides: Any) -> Block:
    block = build_block(block_config(combo, **overrides)).to(dtype)
    randomize(block)
    return block.eval()


def randomize(module: torch.nn.Module) -> None:
    """Give norms non-trivial gains and biases so tests cannot pass on ones and zeros."""
    with torch.no_grad():
        for _name, p in module.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))


#: Model-level contract tests: a 2-layer model over a 32-token vocabulary.
VOCAB = 32


def make_model(combo: dict[str, str], dtype: torch.dtype = torch.float64, n_layers: int = 2, **overrides: Any):
    """A tiny LanguageModel of ``combo`` with weights large enough that greedy tokens vary."""
    from zoo import LanguageModel, resolve_block

    model = LanguageModel(resolve_block(block_config(combo, **overrides)), VOCAB, n_layers).to(dtype)
    scramble(model)
    return model.eval()


def scramble(module: torch.nn.Module, std: float = 0.3) -> None:
    """Redraw matrices with a large std (init's 0.02 makes every logit near-equal) and randomize norms."""
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim >= 2:
                p.normal_(0, std)
    randomize(module)
