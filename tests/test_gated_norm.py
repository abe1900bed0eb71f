"""GatedNorm (``norm=gated_rmsnorm``: rmsnorm with ``gate_rank`` r): RMSNorm, then a rank-r sigmoid gate of its own
output, against the formula written out by hand (Marin's grug GatedNorm), where it applies, its parameters and
FLOPs, and its refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo import build_block, build_model, check_combination
from zoo.assembly.compat import tp_refusal
from zoo.assembly.spec import resolve_block
from zoo.core.dims import BlockDims
from zoo.parts.norms import RMSNorm
from zoo.testing.combos import TINY

D, RANK = TINY["d_model"], 4


def gated(rank: int = RANK, **options) -> dict:
    return {"name": "rmsnorm", "gate_rank": rank, **options}


def test_the_gate_multiplies_the_norm_by_sigmoid_of_a_rank_r_projection_of_it():
    """y = rmsnorm(x) g; out = y sigmoid(silu(y W_down) W_up), every weight drawn anew (float64)."""
    norm = RMSNorm(BlockDims(d_model=D), eps=1e-6, gate_rank=RANK).double()
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn_like(p))
    x = torch.randn(2, 5, D, dtype=torch.float64) * 3
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    w_down, w_up = norm.gate_in.weight.T, norm.gate_out.weight.T  # (d, r), (r, d) as Marin stores them
    by_hand = y * torch.sigmoid(torch.einsum("btr,rd->btd", F.silu(torch.einsum("btd,dr->btr", y, w_down)), w_up))
    torch.testing.assert_close(norm(x), by_hand, rtol=1e-12, atol=1e-12)
    assert norm.gate_in.weight.shape == (RANK, D) and norm.gate_out.weight.shape == (D, RANK)


def test_rank_zero_is_plain_rmsnorm_with_no_gate_parameters():
    plain, ungated = RMSNorm(BlockDims(d_model=D)), RMSNorm(BlockDims(d_model=D), gate_rank=0)
    assert [name for name, _ in ungated.named_parameters()] == ["weight"]
    x = torch.randn(3, D)
    torch.testing.assert_close(plain(x), ungated(x), rtol=0, atol=0)


def test_the_block_norms_and_the_final_norm_are_gated_and_a_qk_norm_is_not():
    cfg = {**TINY, "placement": "sandwich", "norm": gated(), "attn": {"name": "mha", "qk_norm": "rmsnorm"},
           "pos": "none", "mlp": "gelu"}  # fmt: skip
    block = build_block(cfg)
    qk = {block.attn.q_norm, block.attn.k_norm}
    assert all(m.gate_in is None for m in qk)
    others = [m for m in block.modules() if isinstance(m, RMSNorm) and m not in qk]
    assert len(others) == 4 and all(m.gate_in.out_features == RANK for m in others)
    model = build_model({"block": {**cfg, "placement": "pre"}, "model": {"n_layers": 1, "vocab_size": 32,
                                                                          "embedding_norm": True}})  # fmt: skip
    assert model.final_norm.gate_in is not None and model.embedding_norm.gate_in is not None


def test_its_parameters_and_flops_are_its_two_matrices_per_norm():
    """2 d r parameters per gated norm (two per layer under pre-norm, and the final norm); FLOPs 6 x those (the
    gate's two matmuls, forward and backward), the elementwise sigmoid, SiLU and product uncounted as every norm's."""
    layers, seq = 2, 8

    def model(norm):
        block = {**TINY, "placement": "pre", "norm": norm, "attn": "mha", "pos": "none", "mlp": "gelu"}
        return build_model({"block": block, "model": {"n_layers": layers, "vocab_size": 32}})

    plain, gate = model("rmsnorm"), model(gated())
    added = (2 * layers + 1) * 2 * D * RANK
    assert gate.num_parameters() - plain.num_parameters() == added
    assert gate.flops_per_token(seq) - plain.flops_per_token(seq) == 6 * added


@pytest.mark.parametrize("rank", [-1, D + 1, 2.5, True])
def test_a_bad_rank_is_refused_by_name(rank):
    reason = check_combination({**TINY, "placement": "pre", "norm": gated(rank), "attn": "mha", "pos": "none",
                                "mlp": "gelu"})  # fmt: skip
    assert reason is not None and "block.norm.gate_rank" in reason and str(rank) in reason, reason


def test_the_gate_is_refused_under_tensor_parallelism():
    cfg = {**TINY, "placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "none", "mlp": "gelu"}
    assert tp_refusal(resolve_block(cfg), 2) is None
    refusal = tp_refusal(resolve_block({**cfg, "norm": gated()}), 2)
    assert refusal is not None and "block.norm.gate_rank=4" in str(refusal), refusal


def test_norm_gated_rmsnorm_selects_rmsnorm_with_its_gate():
    cfg = zoo.compose(["norm=gated_rmsnorm"])
    assert cfg.block.norm.name == "rmsnorm" and cfg.block.norm.gate_rank == 16
