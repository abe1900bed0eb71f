"""Kimi Delta Attention (attn=kda, zoo/parts/kda.py): the delta rule with a decay per key channel by hand, its
chunked form against its recurrent form (sub-chunks and chunks of every shape), both against fla-core's naive KDA
references, the layer against transformers' KimiLinearDeltaAttention and against fla's layer written out around
fla's naive recurrence (grouped key heads, negative eigenvalues), its FLOPs and state by hand, its refusals."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from helpers import assert_forms_equal, fla_naive, two_steps_by_hand

from zoo import ConfigError, LayerState, build_block
from zoo.parts.gated_deltanet import DeltaState, delta_chunked, delta_recurrent
from zoo.testing.combos import TINY

D, H = TINY["d_model"], TINY["n_heads"]
BLOCK = {**TINY, "bias": False, "placement": "pre", "norm": "rmsnorm", "pos": "none", "mlp": "gelu"}


def kda(seed: int = 0, **attn: Any) -> torch.nn.Module:
    """A tiny block's kda part, float64, every parameter drawn (gains and rates near their scale)."""
    block = build_block({**BLOCK, "attn": {"name": "kda", **attn}}).double().eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in block.attn.parameters():
            p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p.ndim == 1 else 0.0))
    return block.attn


def fla_kda_naive():
    """fla-core's pure-PyTorch KDA references (fla/ops/kda/naive.py)."""
    return fla_naive("kda")


def kda_inputs(t: int = 37, key_heads: int = 3, group: int = 1, scale: float = 3.0, dtype=torch.float64):
    """Random q, k (unit length; q over sqrt(d_key)) per key head, v, beta in (0, 1), log a <= 0 per value head and
    key channel (down to -``scale``), and a start state; (b, heads, t, ...), value heads = key_heads x group."""
    b, d_key, d_head, heads = 2, 5, 4, key_heads * group
    q = F.normalize(torch.randn(b, key_heads, t, d_key, dtype=dtype), dim=-1) / math.sqrt(d_key)
    k = F.normalize(torch.randn(b, key_heads, t, d_key, dtype=dtype), dim=-1)
    v, beta = torch.randn(b, heads, t, d_head, dtype=dtype), torch.rand(b, heads, t, dtype=dtype)
    log_decay = -scale * torch.rand(b, heads, t, d_key, dtype=dtype)
    return q, k, v, beta, log_decay, torch.randn(b, heads, d_key, d_head, dtype=dtype)


def test_the_delta_rule_with_a_decay_per_key_channel_by_hand():
    """Two steps, one head, two key channels decaying by 1/2 and 1/4: H_i = diag(a_i) H_{i-1} + k_i u_i^T,
    u_i = beta_i (v_i - (diag(a_i) H_{i-1})^T k_i), y_i = H_i^T q_i; with beta = 1 the state returns v for its key.
    A decay per head (both channels by 1/2) gives another state: the channels' decays are not averaged."""
    log_decay = torch.tensor([0.5, 0.25], dtype=torch.float64).log().expand(1, 1, 2, 2)
    forms, k, v = two_steps_by_hand(log_decay, [0.0, 1.0])
    # Step 1: H_1 = k_1 (0.5 (2, 3))^T = [[0, 0], [1, 1.5]], y_1 = H_1^T (1, 1) = (1, 1.5).
    # Step 2: diag(1/2, 1/4) H_1 = [[0, 0], [0.25, 0.375]] reads (0.2, 0.3) at k_2; u_2 = (0.8, -1.3);
    #         H_2 = [[0.48, -0.78], [0.25 + 0.64, 0.375 - 1.04]], y_2 = H_2^T (1, 0) = (0.48, -0.78).
    state = [[0.48, -0.78], [0.89, -0.665]]
    assert_forms_equal(forms, k, v, y=[[1.0, 1.5], [0.48, -0.78]], state=state)
    per_head, _, _ = two_steps_by_hand(log_decay[..., 0], [0.0, 1.0])
    assert not torch.allclose(per_head["recurrent"][1], torch.tensor(state, dtype=torch.float64))


@pytest.mark.parametrize("chunk", [1, 3, 16, 24, 37, 64])
def test_the_chunked_form_equals_the_recurrent_form(chunk):
    """37 tokens from a start state, chunks of 1 to 64 (sub-chunks of 16, 8 and 1 tokens; a partial last chunk;
    one chunk longer than the sequence): the same outputs and final state as one token at a time."""
    q, k, v, beta, log_decay, start = kda_inputs()
    y, state = delta_recurrent(q, k, v, beta, log_decay, start)
    y_chunked, state_chunked = delta_chunked(q, k, v, beta, log_decay, start, chunk)
    torch.testing.assert_close(y_chunked, y, rtol=0, atol=1e-12)
    torch.testing.assert_close(state_chunked, state, rtol=0, atol=1e-12)


def test_the_chunked_form_stays_finite_where_the_decays_underflow():
    """log a down to -200 per token: products of decays across a chunk underflow to 0, and no exponent in the
    chunked form is positive, so it still equals the recurrent form (a factorization through the chunk's first
    token would overflow)."""
    q, k, v, beta, log_decay, start = kda_inputs(scale=200.0)
    y, state = delta_recurrent(q, k, v, beta, log_decay, start)
    y_chunked, state_chunked = delta_chunked(q, k, v, beta, log_decay, start, 32)
    assert y_chunked.isfinite().all()
    torch.testing.assert_close(y_chunked, y, rtol=0, atol=1e-12)
    torch.testing.assert_close(state_chunked, state, rtol=0, atol=1e-12)


def test_both_forms_equal_fla_cores_naive_kda_references_with_more_value_heads_than_key_heads():
    """zoo's recurrent form against fla's naive_recurrent_kda and its chunked form against naive_chunk_kda
    (fla's layout (b, t, h, d); 2 key heads each read by 2 value heads, fla's GVA; it computes in float32), 1e-5."""
    fla = fla_kda_naive()
    q, k, v, beta, log_decay, start = kda_inputs(t=16, key_heads=2, group=2, dtype=torch.float32)
    d_key = q.shape[-1]
    fq, fk, fv, fg, fbeta = (rearrange(t, "b h t ... -> b t h ...") for t in (q * math.sqrt(d_key), k, v, log_decay,
                                                                                  beta))  # fmt: skip
    q, k = (repeat(t, "b g t d -> b (g r) t d", r=2) for t in (q, k))  # value head h reads key head h // 2
    for name, theirs, ours in (
        ("recurrent", fla.naive_recurrent_kda(fq, fk, fv, fg, fbeta, initial_state=start, output_final_state=True),
         delta_recurrent(q, k, v, beta, log_decay, start)),
        ("chunked", fla.naive_chunk_kda(fq, fk, fv, fg, fbeta, initial_state=start, output_final_state=True,
                                        chunk_size=8), delta_chunked(q, k, v, beta, log_decay, start, 8)),
    ):  # fmt: skip
        torch.testing.assert_close(rearrange(ours[0], "b h t d -> b t h d"), theirs[0], rtol=0, atol=1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")  # fmt: skip
        torch.testing.assert_close(ours[1], theirs[1], rtol=0, atol=1e-5)


def fla_layer(attn: torch.nn.Module, x: torch.Tensor, fla) -> torch.Tensor:
    """fla's KimiDeltaAttention layer written out from zoo's weights around fla's naive recurrence: the short
    convolution as a sum over shifted inputs, SiLU, q and k L2-normalized per key head, beta = sigmoid(W_b x) (x 2
    under allow_neg_eigval), g = -exp(A_log) softplus(W_f2 W_f1 x + dt_bias) per value head and key channel, then
    rmsnorm(o) * w * sigmoid(W_g2 W_g1 x) and the output projection."""
    w = dict(attn.named_parameters())
    batch, t, _ = x.shape
    d_key, d_head, taps, groups = attn.d_key, attn.d_head, attn.conv.shape[-1], attn.n_key_heads
    kernel = w["conv"][:, 0] + F.one_hot(torch.tensor(taps - 1), taps).to(x.dtype)  # stored less the identity
    padded = F.pad(x @ w["qkv.weight"].T, (0, 0, taps - 1, 0))
    mixed = F.silu(sum(kernel[:, j] * padded[:, j : j + t] for j in range(taps))).view(batch, t, groups, -1)
    q, k, v = mixed.split([d_key, d_key, attn.group * d_head], -1)
    q, k = (z / torch.sqrt(z.pow(2).sum(-1, keepdim=True) + 1e-6) for z in (q, k))
    v = v.reshape(batch, t, H, d_head)
    beta = attn.beta_max * torch.sigmoid(x @ w["beta.weight"].T)
    low = x @ w["decay.0.weight"].T @ w["decay.1.weight"].T + w["dt"]
    g = -torch.exp(w["a_log"])[:, None] * F.softplus(low.view(batch, t, H, d_key))
    o, _ = fla.naive_recurrent_kda(q, k, v, g, beta)  # (b, t, h, d_head), scale d_key^-1/2
    o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * w["norm.weight"]
    o = o * torch.sigmoid((x @ w["gate.0.weight"].T @ w["gate.1.weight"].T).view(batch, t, H, d_head))
    return o.reshape(batch, t, H * d_head) @ w["out.weight"].T


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_the_layer_equals_fla_layer_around_its_naive_recurrence_with_grouped_keys_and_negative_eigenvalues(backend):
    fla = fla_kda_naive()
    attn = kda(d_key=3, n_key_heads=2, allow_neg_eigval=True, chunk=4, backend=backend)
    x = torch.randn(2, 11, D, dtype=torch.float64)
    torch.testing.assert_close(attn(x), fla_layer(attn, x, fla), rtol=0, atol=1e-5)


@pytest.mark.parametrize("width", [None, 6])
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_the_layer_equals_transformers_kimi_linear(backend, width, float64):
    """KimiLinearDeltaAttention (its torch fallback), float64, 1e-12: q, k, v projections (zoo's qkv by head), one
    convolution over them, the low-rank forget gate (f_a, f_b, dt_bias, A_log), b_proj, the low-rank output gate
    (g_a, g_b), the sigmoid-gated RMSNorm at rms_norm_eps, o_proj; heads of d_model / n_heads, or wider."""
    pytest.importorskip("transformers")
    from transformers import KimiLinearConfig
    from transformers.models.kimi_linear import modeling_kimi_linear as kimi

    float64(kimi)
    d = width or D // H
    config = KimiLinearConfig(hidden_size=D, num_attention_heads=H, num_key_value_heads=H, num_hidden_layers=2,
                              linear_head_dim=d, linear_num_heads=H, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
                              layer_types=["linear_attention", "full_attention"])  # fmt: skip
    torch.manual_seed(0)
    theirs = kimi.KimiLinearDeltaAttention(config, 0).double().eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.5)
    ours = kda(chunk=4, backend=backend, norm_eps=1e-6, head_dim=width)
    w = dict(theirs.named_parameters())
    with torch.no_grad():
        q, k, v = (rearrange(w[f"{n}_proj.weight"], "(h n) d -> h n d", h=H) for n in "qkv")
        ours.qkv.weight.copy_(rearrange(torch.cat([q, k, v], 1), "h n d -> (h n) d"))
        cq, ck, cv = (rearrange(c, "(h n) 1 w -> h n w", h=H) for c in w["conv1d.weight"].chunk(3))
        ours.conv.copy_(rearrange(torch.cat([cq, ck, cv], 1), "h n w -> (h n) 1 w") - ours.present)
        ours.decay[0].weight.copy_(w["forget_gate.f_a_proj.weight"])
        ours.decay[1].weight.copy_(w["forget_gate.f_b_proj.weight"])
        ours.dt.copy_(w["forget_gate.dt_bias"])
        ours.a_log.copy_(w["forget_gate.A_log"].flatten())
        ours.beta.weight.copy_(w["b_proj.weight"])
        ours.gate[0].weight.copy_(w["g_a_proj.weight"])
        ours.gate[1].weight.copy_(w["g_b_proj.weight"])
        ours.norm.weight.copy_(w["o_norm.weight"])
        ours.out.weight.copy_(w["o_proj.weight"])
        x = torch.randn(2, 11, D, dtype=torch.float64)
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-12)


def test_flops_state_and_parameters_by_hand():
    """Per token and head at chunk 8 (sub-chunks of 8), d_key 6, d_head 4: Gated DeltaNet's 8 (3 x 6 + 2 x 4) +
    3 x 6 x 4 = 280 multiply-adds and 2 x 6 x (8 + 1) = 108 for the channels' weights, x 6 x 4 heads; the state: a
    (6, 4) matrix per head and the convolution's last 3 inputs over 4 x (2 x 6 + 4) channels; the low-rank gates'
    parameters: 16 x 4 + 4 x 24 (decay), 16 x 4 + 4 x 16 (output gate), dt one per key channel."""
    attn = kda(d_key=6, chunk=8)
    assert attn.mixing_flops(64) == 6 * 4 * (280 + 108)
    assert attn.mixing_flops(5) == 6 * 4 * (5 * (18 + 8) + 72 + 2 * 6 * (1 + 5))  # one chunk of 5: sub-chunks of 1
    shapes = {n: tuple(p.shape) for n, p in attn.named_parameters() if n.startswith(("decay", "gate", "dt"))}
    assert shapes == {"decay.0.weight": (4, 16), "decay.1.weight": (24, 4), "gate.0.weight": (4, 16),
                      "gate.1.weight": (16, 4), "dt": (24,)}  # fmt: skip
    cache = LayerState()
    attn(torch.randn(2, 5, D, dtype=torch.float64), cache=cache)
    assert isinstance(cache.mixer, DeltaState) and cache.mixer.matrix.shape == (2, H, 6, 4)
    assert cache.nbytes == 2 * attn.state_size(5) * 8 == 2 * (H * 6 * 4 + 3 * H * 16) * 8


def test_each_heads_rates_start_as_gated_deltanets_on_every_channel():
    gdn = build_block({**BLOCK, "attn": {"name": "gated_deltanet", "d_key": 3}}).attn
    ours = build_block({**BLOCK, "attn": {"name": "kda", "d_key": 3}}).attn
    torch.testing.assert_close(ours.a_log, gdn.a_log, rtol=0, atol=0)
    torch.testing.assert_close(ours.dt, repeat(gdn.dt, "h -> (h k)", k=3), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("attn", "field"),
    [
        ({"name": "kda", "chunk": 0}, "block.attn.chunk=0"),
        ({"name": "kda", "n_key_heads": 3}, "block.attn.n_key_heads=3: must divide block.n_heads=4"),
        ({"name": "kda", "conv": 0}, "block.attn.conv=0"),
    ],
)
def test_bad_options_name_the_field(attn, field):
    with pytest.raises(ConfigError) as error:
        build_block({**BLOCK, "attn": attn})
    assert field in str(error.value), str(error.value)


def test_kda_refuses_encoders_score_biases_and_a_tp_that_splits_a_key_head_by_its_own_name():
    from zoo import check_combination
    from zoo.assembly.compat import tp_refusal
    from zoo.assembly.spec import resolve_block

    base = {**BLOCK, "attn": "kda"}
    assert check_combination(base) is None
    reason = check_combination({**base, "causal": False})
    assert reason is not None and "block.attn.name='kda': is causal only" in reason, reason
    reason = check_combination({**base, "pos": "alibi"})
    assert reason is not None and "KDA never forms the score matrix" in reason, reason
    assert tp_refusal(resolve_block(base), 2) is None
    grouped = {**base, "attn": {"name": "kda", "n_key_heads": 1}}
    refusal = tp_refusal(resolve_block(grouped), 2)
    assert refusal is not None and "must divide block.attn.n_key_heads=1" in str(refusal), refusal
