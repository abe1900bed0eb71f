"""Mamba-2 (attn=mamba2, zoo/parts/mamba2.py): its scan by hand, zoo's chunked and recurrent SSD against transformers'
torch chunk scan (the minimal SSD of state-spaces/mamba, with a start and a final state), the mixer against
transformers' Mamba2Mixer (groups of heads, expand 2), its FLOPs and state by hand, its refusals."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from einops import rearrange, repeat

from zoo import ConfigError, LayerState, build_block
from zoo.parts.gated_deltanet import DeltaState
from zoo.parts.linear_attention import chunked, recurrent
from zoo.testing.combos import TINY

D, H = TINY["d_model"], TINY["n_heads"]
BLOCK = {**TINY, "bias": False, "placement": "pre", "norm": "rmsnorm", "pos": "none", "mlp": "gelu"}

pytest.importorskip("transformers")


def mamba2(**attn: Any) -> torch.nn.Module:
    return build_block({**BLOCK, "attn": {"name": "mamba2", **attn}}).double().eval().attn


def test_the_scan_by_hand():
    """One head, d_state 2, head_dim 1, two tokens, A = -1: h_1 = dt_1 B_1 x_1 = 0.5 (1, 0) 2 = (1, 0), y_1 = C_1 . h_1
    + D x_1 = 1 + 2 D; h_2 = e^{-0.5} h_1 + 0.5 (0, 1) 4 = (e^{-1/2}, 2), y_2 = (1, 1) . h_2 + 4 D."""
    attn = mamba2(d_state=2, head_dim=1, backend="math")
    dt, x, b, c = torch.tensor([0.5, 0.5]), torch.tensor([2.0, 4.0]), torch.eye(2), torch.tensor([[1.0, 0], [1, 1]])
    log_decay = -dt  # A = -1
    for form in (lambda *a: recurrent(*a), lambda *a: chunked(*a, 2)):
        y, h = form(c[None, None].double(), (b * dt[:, None])[None, None].double(), x[None, None, :, None].double(),
                    log_decay[None, None].double(), None)  # fmt: skip
        torch.testing.assert_close(h[0, 0, :, 0], torch.tensor([math.exp(-0.5), 2.0], dtype=torch.float64))
        torch.testing.assert_close(y[0, 0, :, 0], torch.tensor([1.0, math.exp(-0.5) + 2], dtype=torch.float64))
    assert attn.skip.tolist() == [1.0] * H  # D starts at 1


@pytest.mark.parametrize("chunk", [1, 3, 4, 16])
def test_zoos_ssd_forms_equal_transformers_chunk_scan(chunk, float64):
    """transformers' mamba2_chunk_scan (torch: the minimal SSD, chunks of 4, groups repeated to heads), float64, from
    a start state: zoo's chunked form at chunks of 1 to 16 and its recurrent form give its outputs and final state,
    with q = C, k = dt B, v = x, log decay dt A, and D x added."""
    from transformers.models.mamba2 import modeling_mamba2 as hf

    float64(hf)
    torch.manual_seed(0)
    b, t, h, p, n, g = 2, 11, 4, 3, 5, 2
    x, dt = torch.randn(b, t, h, p, dtype=torch.float64), torch.rand(b, t, h, dtype=torch.float64)
    big_a, skip = -torch.rand(h, dtype=torch.float64) * 2, torch.randn(h, dtype=torch.float64)
    bb, cc = torch.randn(b, t, g, n, dtype=torch.float64), torch.randn(b, t, g, n, dtype=torch.float64)
    start = torch.randn(b, h, p, n, dtype=torch.float64)
    theirs, final = hf.mamba2_chunk_scan(x, dt, big_a, bb, cc, 4, D=skip, initial_states=start,
                                         return_final_states=True)  # fmt: skip
    q, k = (repeat(z, "b t g n -> b (g r) t n", r=h // g) for z in (cc, bb))
    k = k * rearrange(dt, "b t h -> b h t 1")
    v, log_decay = rearrange(x, "b t h p -> b h t p"), rearrange(dt * big_a, "b t h -> b h t")
    ours = {"chunked": chunked(q, k, v, log_decay, start.transpose(-1, -2), chunk),
            "recurrent": recurrent(q, k, v, log_decay, start.transpose(-1, -2))}  # fmt: skip
    for name, (y, state) in ours.items():
        y = rearrange(y + skip[:, None, None] * v, "b h t p -> b t h p")
        torch.testing.assert_close(y, theirs, rtol=0, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")
        torch.testing.assert_close(state.transpose(-1, -2), final, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("groups", "head_dim"), [(1, None), (2, 8)])
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_the_mixer_equals_transformers_mamba2_mixer(backend, groups, head_dim, float64):
    """Mamba2Mixer (its torch path), float64, 1e-12: in_proj's rows as zoo's gate (z), x, bc (every group's B, then
    C) and step (dt); the convolution with its bias over x, B, C; dt_bias, A_log, D; the gated RMSNorm over each
    group (norm_before_gate=False); out_proj. One group of heads of d_model / n_heads, and two groups at expand 2."""
    from transformers import Mamba2Config
    from transformers.models.mamba2 import modeling_mamba2 as hf

    float64(hf)
    p, n = head_dim or D // H, 6
    config = Mamba2Config(hidden_size=D, num_heads=H, head_dim=p, expand=H * p // D, state_size=n, n_groups=groups,
                          conv_kernel=4, chunk_size=4, num_hidden_layers=1)  # fmt: skip
    torch.manual_seed(0)
    theirs = hf.Mamba2Mixer(config, 0).double().eval()
    with torch.no_grad():
        for param in theirs.parameters():
            param.normal_(0, 0.5)
    ours = mamba2(d_state=n, n_groups=groups, head_dim=head_dim, chunk=4, backend=backend)
    w, inner = dict(theirs.named_parameters()), H * p
    with torch.no_grad():
        z, xs, bc, dt = w["in_proj.weight"].split([inner, inner, 2 * groups * n, H])
        for module, rows in ((ours.gate, z), (ours.x, xs), (ours.bc, bc), (ours.step, dt)):
            module.weight.copy_(rows)
        ours.conv.copy_(w["conv1d.weight"] - ours.present)
        ours.conv_bias.copy_(w["conv1d.bias"])
        for mine, name in ((ours.dt, "dt_bias"), (ours.a_log, "A_log"), (ours.skip, "D"), (ours.norm, "norm.weight")):
            mine.copy_(w[name])
        ours.out.weight.copy_(w["out_proj.weight"])
        x = torch.randn(2, 11, D, dtype=torch.float64)
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-12)


def test_flops_state_and_parameters_by_hand():
    """Chunk 8, d_state 6, head_dim 4: per head and token 8 (6 + 4) + 2 x 6 x 4 = 128 multiply-adds, x 6 x 4 heads;
    the state: a (6, 4) matrix per head and the last 3 convolution inputs over 16 + 2 x 6 channels."""
    attn = mamba2(d_state=6, chunk=8)
    assert attn.mixing_flops(64) == 6 * 4 * 128
    assert attn.mixing_flops(5) == 6 * 4 * (5 * 10 + 48)
    cache = LayerState()
    attn(torch.randn(2, 5, D, dtype=torch.float64), cache=cache)
    assert isinstance(cache.mixer, DeltaState) and cache.mixer.matrix.shape == (2, H, 6, 4)
    assert cache.nbytes == 2 * attn.state_size(5) * 8 == 2 * (H * 6 * 4 + 3 * 28) * 8
    sizes = {name: tuple(p.shape) for name, p in attn.named_parameters()}
    assert sizes["bc.weight"] == (12, D) and sizes["step.weight"] == (H, D) and sizes["norm"] == (16,)


@pytest.mark.parametrize(
    ("attn", "field"),
    [
        ({"name": "mamba2", "d_state": 0}, "block.attn.d_state=0"),
        ({"name": "mamba2", "n_groups": 3}, "block.attn.n_groups=3: must divide block.n_heads=4"),
        ({"name": "mamba2", "chunk": 0}, "block.attn.chunk=0"),
        ({"name": "mamba2", "norm_eps": 0.0}, "block.attn.norm_eps=0.0"),
    ],
)
def test_bad_options_name_the_field(attn, field):
    with pytest.raises(ConfigError) as error:
        build_block({**BLOCK, "attn": attn})
    assert field in str(error.value), str(error.value)


def test_mamba2_refuses_encoders_score_biases_and_tensor_parallelism():
    from zoo import check_combination
    from zoo.assembly.compat import tp_refusal
    from zoo.assembly.spec import resolve_block

    base = {**BLOCK, "attn": "mamba2"}
    assert check_combination(base) is None
    reason = check_combination({**base, "causal": False})
    assert reason is not None and "block.attn.name='mamba2': is causal only" in reason, reason
    reason = check_combination({**base, "pos": "alibi"})
    assert reason is not None and "Mamba-2 never forms the score matrix" in reason, reason
    refusal = tp_refusal(resolve_block(base), 2)
    assert refusal is not None and "block.attn.name='mamba2': has no tensor-parallel plan" in str(refusal), refusal
