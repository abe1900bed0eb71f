"""The parts beyond the card, each against its formula, written out independently."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from zoo import ATTENTIONS, POSITIONS, build_block, check_combination
from zoo.core.dims import BlockDims
from zoo.core.options import option_types
from zoo.parts.kernels import allowed_mask
from zoo.parts.norms import RMSNorm, ScaleNorm
from zoo.parts.placements import Parallel, SandwichNorm
from zoo.parts.positions import Rotary, SinusoidalEmbedding, alibi_slopes
from zoo.testing.combos import TINY

D, H = TINY["d_model"], TINY["n_heads"]
DIMS = BlockDims(d_model=D, n_heads=H)


def block(**axes):
    cfg = {**TINY, "placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "none", "mlp": "gelu"}
    built = build_block({**cfg, **axes}).double().eval()
    with torch.no_grad():
        for p in built.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return built


def reference_attention(attn, x, bias=None, window=None, softcap=None):
    """softmax(cap(q k^T / sqrt(d)) + bias + mask) v, per head, from the attention's weights (MHA)."""
    b, t, d = x.shape
    d_head = d // H
    # MHA's fused rows, head by head: [q_0 k_0 v_0 q_1 k_1 v_1 ...], d_head rows each.
    heads = (x @ attn.qkv.weight.T + attn.qkv.bias).view(b, t, H, 3, d_head)
    q, k, v = (heads[:, :, :, i].transpose(1, 2) for i in range(3))  # (b, h, t, d_head)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d_head)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = j <= i
    if window is not None:
        allowed = allowed & (i - j < window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
    return out @ attn.out.weight.T + attn.out.bias


def test_sandwich_normalizes_branch_input_and_output():
    norms = iter([RMSNorm(DIMS) for _ in range(4)])
    placement = SandwichNorm(DIMS, lambda: next(norms), 2)
    with torch.no_grad():
        for p in placement.parameters():
            p.copy_(torch.rand_like(p) + 0.5)
    f, g = torch.nn.Linear(D, D), torch.nn.Linear(D, D)
    x = torch.randn(2, 5, D)
    h = x + placement.out_norms[0](f(placement.norms[0](x)))
    expected = h + placement.out_norms[1](g(placement.norms[1](h)))
    torch.testing.assert_close(placement(x, [f, g]), expected)
    names = {name for name, _ in placement.named_parameters()}
    assert names == {"norms.0.weight", "norms.1.weight", "out_norms.0.weight", "out_norms.1.weight"}


def test_parallel_shares_one_norm_between_the_branches():
    placement = Parallel(DIMS, lambda: RMSNorm(DIMS), 2)
    f, g = torch.nn.Linear(D, D), torch.nn.Linear(D, D)
    x = torch.randn(2, 5, D)
    h = placement.norms[0](x)
    torch.testing.assert_close(placement(x, [f, g]), x + f(h) + g(h))
    assert [name for name, _ in placement.named_parameters()] == ["norms.0.weight"]


def test_scalenorm_puts_every_vector_on_a_sphere_of_learned_radius():
    norm = ScaleNorm(DIMS)
    assert norm.scale.shape == (1,) and norm.scale.item() == pytest.approx(math.sqrt(D))
    with torch.no_grad():
        norm.scale.fill_(3.0)
    x = torch.randn(4, 7, D) * torch.rand(4, 7, 1) * 10
    y = norm(x)
    torch.testing.assert_close(y.norm(dim=-1), torch.full((4, 7), 3.0))
    torch.testing.assert_close(y, 3 * x / x.norm(dim=-1, keepdim=True))


@pytest.mark.parametrize(
    ("name", "act", "gated"),
    [("geglu", F.gelu, True), ("reglu", F.relu, True), ("swiglu", F.silu, True), ("relu2", None, False)],
)
def test_new_mlps_follow_their_formula(name, act, gated):
    mlp = block(mlp=name).mlp
    x = torch.randn(2, 5, D, dtype=torch.float64)
    if gated:
        hidden = mlp.down.in_features
        w, b = mlp.gate_up.weight, mlp.gate_up.bias  # rows interleaved: gate 0, up 0, gate 1, up 1, ...
        gate = x @ w[0::2].T + b[0::2]
        up = x @ w[1::2].T + b[1::2]
        assert gate.shape[-1] == hidden
        expected = (act(gate) * up) @ mlp.down.weight.T + mlp.down.bias
    else:
        expected = F.relu(x @ mlp.up.weight.T + mlp.up.bias) ** 2 @ mlp.down.weight.T + mlp.down.bias
    torch.testing.assert_close(mlp(x), expected)


@pytest.mark.parametrize("name", ["geglu", "reglu", "swiglu"])
def test_gated_mlps_hand_their_activation_contiguous_halves(name, monkeypatch):
    """gate(x) and up(x) reach the activation and the product contiguous (halves of one fused output are
    strided views: the activation, the product and their backward run slower on them), with gradients
    of the formula's."""
    mlp = block(mlp=name).mlp
    seen = []
    act = type(mlp).activation
    monkeypatch.setattr(type(mlp), "activation", staticmethod(lambda t: seen.append(t.is_contiguous()) or act(t)))
    x = torch.randn(2, 5, D, dtype=torch.float64, requires_grad=True)
    mlp(x).square().sum().backward()
    assert seen == [True]
    w, b = mlp.gate_up.weight, mlp.gate_up.bias
    ref = x.detach().requires_grad_()
    hidden = act(ref @ w[0::2].T + b[0::2]) * (ref @ w[1::2].T + b[1::2])
    (hidden @ mlp.down.weight.T + mlp.down.bias).square().sum().backward()
    torch.testing.assert_close(x.grad, ref.grad)


def test_alibi_slopes_follow_the_paper():
    assert alibi_slopes(8) == [2 ** -(i + 1) for i in range(8)]
    assert alibi_slopes(4) == [2 ** -(2 * (i + 1)) for i in range(4)]
    # Not a power of two: the 4-head slopes, then every other slope of the 8-head sequence.
    assert alibi_slopes(6) == alibi_slopes(4) + alibi_slopes(8)[0::2][:2]


@pytest.mark.parametrize("backend", ["sdpa", "math"])
@pytest.mark.parametrize("window", [None, 2])
def test_alibi_and_window_match_the_reference(backend, window):
    built = block(pos="alibi", attn={"name": "mha", "backend": backend, "window": window})
    x = torch.randn(2, 7, D, dtype=torch.float64)
    i, j = torch.arange(7)[:, None], torch.arange(7)[None, :]
    slopes = torch.tensor(alibi_slopes(H), dtype=torch.float64)[:, None, None]
    bias = -slopes * (i - j).abs()
    expected = reference_attention(built.attn, x, bias=bias, window=window)
    torch.testing.assert_close(built.attn(x), expected, rtol=0, atol=1e-12)


def test_window_mask_from_absolute_positions():
    q, k = torch.arange(4, 7), torch.arange(7)  # three queries after four cached keys
    mask = allowed_mask(q, k, causal=True, key_mask=None, window=3)
    expected = torch.tensor(
        [[0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1]], dtype=torch.bool
    )  # query i sees keys i-2..i
    assert torch.equal(mask[0, 0], expected)
    both_ways = allowed_mask(q, k, causal=False, key_mask=None, window=2)[0, 0]
    assert torch.equal(both_ways, (q[:, None] - k[None, :]).abs() < 2)


def test_softcap_bounds_the_scores():
    built = block(attn={"name": "mha", "backend": "math", "softcap": 1.5})
    x = torch.randn(2, 6, D, dtype=torch.float64) * 5
    torch.testing.assert_close(built.attn(x), reference_attention(built.attn, x, softcap=1.5), rtol=0, atol=1e-12)
    assert not torch.allclose(built.attn(x), reference_attention(built.attn, x))


def test_qk_norm_makes_attention_blind_to_the_scale_of_queries_and_keys():
    cfg = {**TINY, "bias": False, "placement": "pre", "norm": "rmsnorm", "pos": "rotary", "mlp": "gelu"}
    plain = build_block({**cfg, "attn": {"name": "gqa"}}).double()
    normed = build_block({**cfg, "attn": {"name": "gqa", "qk_norm": "rmsnorm"}}).double()
    assert normed.attn.q_norm.weight.shape == (D // H,) and normed.attn.k_norm.weight.shape == (D // H,)
    normed.load_state_dict(plain.state_dict(), strict=False)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    before = (plain.attn(x), normed.attn(x))
    with torch.no_grad():  # scale the query and key rows: per kv group, 2 query heads then a key head (4 rows each)
        for model in (plain, normed):
            model.attn.qkv.weight.view(2, 4, D // H, D)[:, :3] *= 7.0
    assert not torch.allclose(plain.attn(x), before[0])
    torch.testing.assert_close(normed.attn(x), before[1], rtol=0, atol=1e-4)  # up to the norm eps


def test_partial_rotary_turns_only_the_first_features():
    dims = BlockDims(d_model=32, n_heads=2)  # d_head 16
    partial, full_of_first = Rotary(dims, rotary_fraction=0.25), Rotary(BlockDims(d_model=8, n_heads=2))
    q, k = torch.randn(1, 2, 5, 16, dtype=torch.float64), torch.randn(1, 2, 5, 16, dtype=torch.float64)
    positions = torch.arange(3, 8)
    q_rot, k_rot = partial.rotate(q, k, positions)
    torch.testing.assert_close(q_rot[..., 4:], q[..., 4:], rtol=0, atol=0)  # the rest passes through
    expected_q, expected_k = full_of_first.rotate(q[..., :4], k[..., :4], positions)
    torch.testing.assert_close(q_rot[..., :4], expected_q)
    torch.testing.assert_close(k_rot[..., :4], expected_k)
    assert not torch.allclose(q_rot[..., :4], q[..., :4])


def test_sinusoidal_table_is_the_original_transformers():
    table = SinusoidalEmbedding(D, 10000.0).table(9, torch.device("cpu"), torch.float64)
    i, j = torch.arange(9.0, dtype=torch.float64)[:, None], torch.arange(0, D, 2, dtype=torch.float64)[None, :]
    torch.testing.assert_close(table[:9, 0::2], torch.sin(i / 10000 ** (j / D)))
    torch.testing.assert_close(table[:9, 1::2], torch.cos(i / 10000 ** (j / D)))


def sdpa_kernels_run(module: torch.nn.Module, *args, **kwargs) -> set[str]:
    """The names of the aten attention kernels a forward and backward of ``module`` ran."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        module(*args, **kwargs).sum().backward()
    return {e.name for e in prof.events() if "attention" in e.name}


#: SDPA's materializing fallback: scores in memory, what the float mask must keep attention off.
SDPA_MATH = "aten::_scaled_dot_product_attention_math"


@pytest.mark.slow
def test_every_position_and_window_stays_on_the_fused_sdpa_kernels():
    """A float mask or bias keeps SDPA off its materializing math backend: every position part, with
    and without a window and padding, runs forward and backward on a fused kernel (the profiler names
    the kernel), and would raise under ``sdpa_kernel(fused)`` if it needed the math one."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    key_mask = torch.ones(2, 6, dtype=torch.bool)
    key_mask[0, :2] = False
    checked = set()
    for pos in POSITIONS.names():
        for attn in ATTENTIONS.names():
            windows = (None, 3) if "window" in option_types(ATTENTIONS.get(attn).cls) else (None,)
            for window in windows:
                cfg = {**TINY, "placement": "pre", "norm": "rmsnorm", "pos": pos, "mlp": "gelu",
                       "attn": {"name": attn, **({"window": window} if window else {})}}  # fmt: skip
                if check_combination(cfg, "model") is not None:
                    continue  # refused with its reason (linear attention has no scores for alibi to bias)
                built = build_block(cfg, context="model")
                x = torch.randn(2, 6, D, requires_grad=True)
                with sdpa_kernel([SDPBackend.MATH]):
                    if SDPA_MATH not in sdpa_kernels_run(built, x):
                        continue  # never calls SDPA (linear attention: no softmax over scores)
                checked.add(attn)
                for mask in (None, key_mask):
                    with sdpa_kernel(fused):
                        kernels = sdpa_kernels_run(built, x, key_mask=mask)
                    where = f"pos={pos} window={window} attn={attn} key_mask={mask is not None}"
                    assert SDPA_MATH not in kernels, where
                    assert any("flash_attention" in k or "efficient_attention" in k for k in kernels), (where, kernels)
    assert {"mha", "mla"} <= checked, checked


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_rotary_follows_the_split_halves_formula(fraction):
    """Each pair (j, j + r/2) of the first r features turns by +theta = position * base^(-2j/r):
    (x_j, x_{j+r/2}) -> (x_j cos - x_{j+r/2} sin, x_{j+r/2} cos + x_j sin), for queries and keys alike."""
    d_head, base = 8, 100.0
    rotary = Rotary(BlockDims(d_model=2 * d_head, n_heads=2), base=base, rotary_fraction=fraction)
    r = int(d_head * fraction)
    q, k = torch.randn(2, 2, 5, d_head, dtype=torch.float64), torch.randn(2, 1, 5, d_head, dtype=torch.float64)

    def by_formula(x, positions):  # positions (b, t)
        out = x.clone()
        for j in range(r // 2):
            theta = positions.double()[:, None, :] * base ** (-2 * j / r)  # (b, 1, t)
            first, second = x[..., j], x[..., j + r // 2]
            out[..., j] = first * torch.cos(theta) - second * torch.sin(theta)
            out[..., j + r // 2] = second * torch.cos(theta) + first * torch.sin(theta)
        return out

    per_sample = torch.tensor([[0, 0, 0, 1, 2], [3, 4, 5, 6, 7]])
    for positions in (per_sample, torch.arange(2, 7)):
        rows = positions.expand(2, 5)
        q_rot, k_rot = rotary.rotate(q, k, positions)
        torch.testing.assert_close(q_rot, by_formula(q, rows), rtol=0, atol=1e-12)
        torch.testing.assert_close(k_rot, by_formula(k, rows), rtol=0, atol=1e-12)
    # In 2-d: a unit vector along feature 0 at position 1 turns counter-clockwise by theta_0 = 1 radian.
    e0 = torch.zeros(1, 1, 1, d_head, dtype=torch.float64)
    e0[..., 0] = 1
    turned, _ = rotary.rotate(e0, e0, torch.tensor([1]))
    assert turned[0, 0, 0, r // 2].item() == pytest.approx(math.sin(1.0))


@pytest.mark.parametrize(
    ("norm", "qk_norm"), [("rmsnorm", "rmsnorm"), ("layernorm", "rmsnorm"), ("layernorm", "layernorm")]
)
def test_qk_norm_takes_the_block_norms_eps(norm, qk_norm):
    built = block(norm={"name": norm, "eps": 1e-3}, attn={"name": "mha", "qk_norm": qk_norm})
    assert built.attn.q_norm.eps == built.attn.k_norm.eps == built.placement.norms[0].eps == 1e-3
    default = block(attn={"name": "mha", "qk_norm": qk_norm})  # rmsnorm's own default
    assert default.attn.q_norm.eps == 1e-6


def test_sinusoidal_positions_add_the_table_to_tokens_scaled_by_sqrt_d_model():
    embedding = SinusoidalEmbedding(D, 10000.0)
    x, positions = torch.randn(2, 5, D, dtype=torch.float64), torch.tensor([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]])
    table = embedding.table(8, torch.device("cpu"), torch.float64)
    torch.testing.assert_close(embedding(x, positions), math.sqrt(D) * x + table[positions])
    assert embedding.token_init_std == D**-0.5


# --- Softmax attention's output options: the sink, XSA, the gate (zoo.parts.head_outputs) ------------------


def sink_by_hand(q, k, v, sink, mask):
    """softmax over [q k^T / sqrt(d) + mask, the head's sink logit], the sink's column dropped, @ v (MHA)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask
    column = sink.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1] @ v


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_the_sink_is_one_more_term_of_the_softmax_denominator_on_every_backend(backend):
    """Causal, padded and biased masks: the kernel's sink equals the explicit softmax over [scores, sink], its
    gradient too, and equals torchtitan's form out * sigmoid(lse - sink) of the attention without it."""
    from zoo.parts.kernels import additive, attend

    q, k, v = (torch.randn(2, H, 5, 4, dtype=torch.float64) for _ in range(3))
    sink = torch.randn(H, dtype=torch.float64, requires_grad=True)
    causal = allowed_mask(torch.arange(5), torch.arange(5), causal=True, key_mask=None)
    padded = allowed_mask(torch.arange(5), torch.arange(5), causal=True, key_mask=torch.tensor([[0, 1, 1, 1, 1]] * 2))
    bias = -torch.rand(H, 5, 5, dtype=torch.float64)
    for allowed, extra in [(causal, None), (padded, None), (causal, bias)]:
        mask = additive(allowed, extra, torch.float64)
        got = attend(q, k, v, mask, is_causal=False, backend=backend, sink=sink)
        expected = sink_by_hand(q, k, v, sink, mask)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
        (grad,) = torch.autograd.grad((got * v).sum(), sink)
        (want,) = torch.autograd.grad((expected * v).sum(), sink)
        torch.testing.assert_close(grad, want, rtol=0, atol=1e-12)
        lse = torch.logsumexp(q @ k.transpose(-1, -2) / 2 + mask, -1, keepdim=True)  # 2 = sqrt(d)
        plain = attend(q, k, v, mask, is_causal=False, backend=backend)
        torch.testing.assert_close(got, plain * torch.sigmoid(lse - sink.view(1, -1, 1, 1)), rtol=0, atol=1e-12)
    # The fused causal path (is_causal) takes the sink as well.
    fused = attend(q, k, v, None, is_causal=True, backend=backend, sink=sink)
    expected = sink_by_hand(q, k, v, sink, additive(causal, None, torch.float64))
    torch.testing.assert_close(fused, expected, rtol=0, atol=1e-12)


def test_a_large_sink_lets_a_head_attend_to_nothing_and_a_very_negative_one_is_no_sink():
    built = block(attn={"name": "mha", "sink": "learned"})
    x = torch.randn(2, 6, D, dtype=torch.float64)
    plain = block(attn={"name": "mha"})
    plain.load_state_dict(built.state_dict(), strict=False)
    with torch.no_grad():
        built.attn.sink.fill_(-1e4)
        torch.testing.assert_close(built.attn(x), plain.attn(x), rtol=0, atol=1e-12)
        built.attn.sink.fill_(1e4)  # every head's weights go to the sink, whose value is zero: only out's bias is left
        torch.testing.assert_close(built.attn(x), built.attn.out.bias.expand(2, 6, D), rtol=0, atol=1e-12)


@pytest.mark.parametrize("attn", ["mha", "gqa", "mqa", "mla"])
def test_xsa_leaves_each_head_orthogonal_to_its_own_value(attn):
    """z . v = 0 for every head and position, v the head's own value (its key/value head's, under GQA), and the
    component removed is y's along v: y = z + (y . v̂) v̂."""
    from zoo.parts.head_outputs import exclude_own_value

    kv = {"mha": H, "gqa": 2, "mqa": 1, "mla": H}[attn]
    y = torch.randn(2, H, 5, 4, dtype=torch.float64)
    v = torch.randn(2, kv, 5, 4, dtype=torch.float64)
    z = exclude_own_value(y, v)
    own = v.repeat_interleave(H // kv, dim=1)  # query head h reads kv head h // (H / kv)
    torch.testing.assert_close((z * own).sum(-1), torch.zeros(2, H, 5, dtype=torch.float64), rtol=0, atol=1e-12)
    unit = own / own.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(z + (y * unit).sum(-1, keepdim=True) * unit, y, rtol=0, atol=1e-12)
    assert torch.equal(exclude_own_value(y, torch.zeros_like(v)), y)  # a zero value removes nothing


def test_a_closed_gate_silences_the_heads_and_an_open_one_is_no_gate():
    for gate in ("headwise", "elementwise"):
        built = block(attn={"name": "mha", "gate": gate})
        plain = block(attn={"name": "mha"})
        plain.load_state_dict(built.state_dict(), strict=False)
        x = torch.randn(2, 6, D, dtype=torch.float64)
        with torch.no_grad():
            built.attn.gate.weight.zero_()
            built.attn.gate.bias.fill_(100.0)  # sigmoid(100) = 1 in float64
            torch.testing.assert_close(built.attn(x), plain.attn(x), rtol=0, atol=1e-12)
            built.attn.gate.bias.fill_(-1e3)
            torch.testing.assert_close(built.attn(x), built.attn.out.bias.expand(2, 6, D), rtol=0, atol=1e-12)


@pytest.mark.parametrize("attn", ["mha", "gqa", "mqa", "mla"])
def test_the_output_options_default_off_with_no_new_parameter_and_the_same_function(attn):
    """The defaults are today's attention: the same parameter names, and to the last bit the same outputs
    (the new parameters are exactly the gate's and the sink)."""
    cfg = {**TINY, "placement": "pre", "norm": "rmsnorm", "pos": "rotary", "mlp": "gelu"}
    torch.manual_seed(0)
    plain = build_block({**cfg, "attn": attn}).double()
    torch.manual_seed(0)
    spelt = build_block({**cfg, "attn": {"name": attn, "gate": "none", "sink": "none", "xsa": False}}).double()
    assert list(plain.state_dict()) == list(spelt.state_dict())
    x = torch.randn(2, 6, D, dtype=torch.float64)
    assert torch.equal(plain(x), spelt(x))
    every = build_block({**cfg, "attn": {"name": attn, "gate": "headwise", "sink": "learned", "xsa": True}})
    added = set(every.state_dict()) - set(plain.state_dict())
    assert added == {"attn.gate.weight", "attn.gate.bias", "attn.sink"}, added
    assert every.attn.gate.weight.shape == (H, D) and every.attn.sink.shape == (H,)
    elementwise = build_block({**cfg, "attn": {"name": attn, "gate": "elementwise"}})
    assert elementwise.attn.gate.weight.shape == (H * (D // H), D)
