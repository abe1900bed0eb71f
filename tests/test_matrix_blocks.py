"""The parts' logical matrices (the ``matrix_blocks`` hook): built-in parts declare them, the blocks
tile each fused weight exactly, split then fuse is the identity, and they are the layouts the forwards read."""

from __future__ import annotations

from functools import cache

import pytest
import torch
from torch import nn

import zoo
from zoo.core.interface import defines, hook
from zoo.core.matrices import check_blocks, fuse_blocks, part_modules, split_blocks
from zoo.core.registry import AXES
from zoo.parts.attention import Attention, split_qkv
from zoo.parts.cross_attention import CrossAttention
from zoo.parts.mlps import GatedMLP, split_gate_up

SMALL = ["block.d_model=32", "block.n_heads=4", "model.n_layers=1", "block.bias=true"]
#: One small model per fusing part (and each other built-in MLP and attention).
CONFIGS = {
    "gqa+swiglu": ["attn=gqa", "mlp=swiglu"],
    "mqa+geglu": ["attn=mqa", "mlp=geglu"],
    "mha+gelu+cross": ["attn=mha", "mlp=gelu", "block.cross_attention=true"],
    "mla+moe": ["attn=mla", "mlp=moe", "block.mlp.n_shared=1"],
    "mla-qrank+reglu": ["attn=mla", "+block.attn.q_rank=8", "mlp=reglu"],
    "linear-gated": ["attn=linear", "block.attn.decay=gated", "block.attn.d_key=4", "mlp=relu2"],
    "gated_deltanet": ["attn=gated_deltanet", "block.attn.d_key=4", "mlp=gelu"],
    "gated_deltanet-grouped": ["attn=gated_deltanet", "block.attn.d_key=4", "block.attn.n_key_heads=2", "mlp=gelu"],
    "kda": ["attn=kda", "block.attn.d_key=4", "block.attn.n_key_heads=2", "mlp=gelu"],
    "mamba2": ["attn=mamba2", "block.attn.d_state=4", "block.attn.n_groups=2", "mlp=gelu"],
}


@cache
def model_for(name: str) -> nn.Module:
    torch.manual_seed(0)
    build = zoo.build_seq2seq if "cross" in name else zoo.build_model
    return build(zoo.compose([*CONFIGS[name], *SMALL]))


# -- the parts' declarations -------------------------------------------------------------------------


def test_a_module_that_declares_nothing_reads_none():
    assert hook(nn.Linear(2, 2), "matrix_blocks")() is None


def test_every_built_in_part_declares_its_matrix_blocks():
    parts = [(axis, part) for axis, registry in AXES.items() for part in registry.parts()]
    undeclared = [f"{axis} {part.name}" for axis, part in parts if not defines(part.cls, "matrix_blocks")]
    assert undeclared == []


@pytest.mark.parametrize("name", CONFIGS)
def test_declared_blocks_tile_each_parameter_and_split_then_fuse_is_the_identity(name):
    model = model_for(name)
    seen = 0
    for owner, module in part_modules(model).items():
        blocks = hook(module, "matrix_blocks")()
        assert blocks is not None, f"{owner} declares nothing"
        params = dict(module.named_parameters())
        for local, split in blocks.items():
            weight = params[local].detach()
            rows = torch.cat(list(split.values()))
            assert rows.numel() == weight.shape[-2], f"{owner}.{local}: a row twice or missing"
            assert torch.equal(rows.sort().values, torch.arange(weight.shape[-2])), f"{owner}.{local}"
            parts = split_blocks(weight, split)
            assert all(p.shape[-1] == weight.shape[-1] for p in parts.values())  # every column, in every block
            assert torch.equal(fuse_blocks(parts, split, weight.shape[-2]), weight)
            seen += 1
    assert seen > 0


def test_the_blocks_are_the_layouts_the_forwards_read():
    attn = next(m for m in part_modules(model_for("gqa+swiglu")).values() if isinstance(m, Attention))
    q, k, v = split_qkv(attn.qkv.weight, attn.n_heads, attn.n_kv_heads)
    got = split_blocks(attn.qkv.weight, attn.matrix_blocks()["qkv.weight"])
    assert torch.equal(got["q"], q) and torch.equal(got["k"], k) and torch.equal(got["v"], v)
    mlp = next(m for m in part_modules(model_for("gqa+swiglu")).values() if isinstance(m, GatedMLP))
    gate, up = split_gate_up(mlp.gate_up.weight)
    got = split_blocks(mlp.gate_up.weight, mlp.matrix_blocks()["gate_up.weight"])
    assert torch.equal(got["gate"], gate) and torch.equal(got["up"], up)
    cross = next(m for m in part_modules(model_for("mha+gelu+cross")).values() if isinstance(m, CrossAttention))
    memory = torch.randn(2, 5, 32)
    keys, values = cross.memory_kv(memory)  # (b, g, s, d) each
    rows = cross.matrix_blocks()["kv.weight"]
    blocks, d = split_blocks(cross.kv.weight, rows), cross.d_head
    second_key = memory @ blocks["k"][d : 2 * d].T + cross.kv.bias[rows["k"][d : 2 * d]]
    assert torch.allclose(keys[:, 1], second_key, atol=1e-6)
    assert torch.allclose(values[:, 0], memory @ blocks["v"][:d].T + cross.kv.bias[rows["v"][:d]], atol=1e-6)


def test_a_declaration_that_does_not_tile_is_refused_by_part_and_parameter():
    attn = next(m for m in part_modules(model_for("gqa+swiglu")).values() if isinstance(m, Attention))
    rows = attn.qkv.out_features
    with pytest.raises(ValueError, match=r"Attention blocks.0.attn: matrix_blocks\['qkv.weight'\].*exactly once"):
        check_blocks(attn, "blocks.0.attn", {"qkv.weight": {"a": torch.arange(rows), "b": torch.arange(1)}})
    with pytest.raises(ValueError, match="names no 2-D or 3-D parameter"):
        check_blocks(attn, "blocks.0.attn", {"qkv.bias": {"a": torch.arange(rows)}})
    gdn = next(m for m in part_modules(model_for("gated_deltanet")).values() if hasattr(m, "conv"))
    with pytest.raises(ValueError, match=r"matrix_blocks\['conv'\]: is a depthwise convolution's kernel"):
        check_blocks(gdn, "blocks.0.attn", {"conv": {"a": torch.arange(1)}})  # one row per channel: no matrices
