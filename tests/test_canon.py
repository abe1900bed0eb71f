"""Canon layers (block.canon, zoo/parts/canon.py): the convolution against explicit taps, each site against its
formula composed by hand from the block's own modules, the decoding state, the config's refusals, the FLOPs
and the initialization."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

import zoo
from zoo import ConfigError, LayerState, build_block, check_combination
from zoo.models.language import build_model
from zoo.parts.canon import KERNEL, Canon
from zoo.testing.combos import block_config, randomize

BASE = {"placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "rotary", "mlp": "swiglu"}


def block(canon: str, **parts: str) -> torch.nn.Module:
    built = build_block(block_config({**BASE, **parts}, canon=canon)).double().eval()
    randomize(built)
    with torch.no_grad():  # canon kernels far from zero, so a site that is skipped cannot pass
        for m in built.modules():
            if isinstance(m, Canon):
                m.kernel.normal_(0, 1)
    return built


def by_hand(h: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """h + conv(h) from explicit taps: y_i = h_i + sum_j kernel[:, 0, j] h_{i - 3 + j}, zeros before the first."""
    y = h.clone()
    for i in range(h.shape[1]):
        for j in range(KERNEL):
            if i - (KERNEL - 1) + j >= 0:
                y[:, i] += kernel[:, 0, j] * h[:, i - (KERNEL - 1) + j]
    return y


def test_the_canon_layer_is_the_residual_sum_of_its_taps_at_each_position():
    """On a tiny input with integer taps: position i reads itself once through the residual and tap 3, and the
    three tokens before it through taps 2, 1, 0; never a later one."""
    layer = Canon(2, "a").double()
    with torch.no_grad():
        layer.kernel.copy_(torch.tensor([[[1.0, 2.0, 3.0, 4.0]], [[-1.0, 0.5, 0.0, 2.0]]]))
    h = torch.tensor([[[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0], [5.0, 50.0]]], dtype=torch.float64)
    y = layer(h)
    # Channel 0, position 3: 4 (residual) + 1*1 + 2*2 + 3*3 + 4*4; position 0: 1 + 4*1.
    expected0 = [1 + 4 * 1, 2 + 3 * 1 + 4 * 2, 3 + 2 * 1 + 3 * 2 + 4 * 3, 4 + 1 + 4 + 9 + 16, 5 + 2 + 6 + 12 + 20]
    assert y[0, :, 0].tolist() == expected0
    assert torch.equal(y, by_hand(h, layer.kernel))


def test_the_canon_layer_continues_from_its_last_three_inputs():
    layer, h = Canon(3, "c").double(), torch.randn(2, 7, 3, dtype=torch.float64)
    state = LayerState()
    parts = [layer(h[:, :2], cache=state)]
    assert torch.equal(state.canon_tail("c"), torch.cat([torch.zeros(2, 1, 3, dtype=h.dtype), h[:, :2]], dim=1))
    parts += [layer(h[:, 2:6], cache=state), layer(h[:, 6:], cache=state)]
    assert torch.equal(state.canon_tail("c"), h[:, -3:])
    torch.testing.assert_close(torch.cat(parts, dim=1), layer(h), rtol=0, atol=1e-12)
    assert state.nbytes == 2 * 3 * 3 * 8
    state.reset()
    assert state.canon_tail("c") is None and state.nbytes == 0


def test_padding_enters_the_canon_layer_as_zeros():
    layer, h = Canon(3, "a").double(), torch.randn(1, 5, 3, dtype=torch.float64)
    real = torch.tensor([[False, False, True, True, True]])
    changed = h.clone()
    changed[:, :2] = 100.0
    assert torch.equal(layer(h, real)[:, 2:], layer(changed, real)[:, 2:])
    assert torch.equal(layer(h, real)[:, 2:], layer(h[:, 2:]))


def test_sites_a_and_c_are_the_attention_and_mlp_inputs_after_the_norm():
    built, x = block("ac"), torch.randn(2, 6, 16, dtype=torch.float64)
    norms, canon = built.placement.norms, built.canon
    h = x + built.attn(by_hand(norms[0](x), canon["a"].kernel))
    expected = h + built.mlp(by_hand(norms[1](h), canon["c"].kernel))
    torch.testing.assert_close(built(x), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("attn", ["mha", "gqa", "mqa"])
def test_site_b_is_the_canon_layer_on_the_fused_queries_keys_and_values(attn):
    """Without qk-norm, q, k and v are the canon layer on ``qkv``'s output, split as the attention splits it."""
    built, x = block("b", attn=attn, pos="none"), torch.randn(2, 6, 16, dtype=torch.float64)
    module = built.attn
    q, k, v = module.project(x, torch.arange(6))
    mixed = by_hand(module.qkv(x), module.canon.kernel)
    group = module.n_heads // module.n_kv_heads + 2
    heads = rearrange(mixed, "b t (g n d) -> b g n t d", n=group, d=module.d_head)
    torch.testing.assert_close(q, rearrange(heads[:, :, :-2], "b g r t d -> b (g r) t d"), rtol=0, atol=1e-12)
    torch.testing.assert_close(k, heads[:, :, -2], rtol=0, atol=1e-12)
    torch.testing.assert_close(v, heads[:, :, -1], rtol=0, atol=1e-12)


def test_site_b_follows_qk_norm_and_precedes_the_rotation():
    """Query head 0 (``qkv``'s first d_head rows) is the canon layer on the qk-normed query, before the rotation."""
    built, x, slots = block("b", attn="mha+qknorm"), torch.randn(1, 5, 16, dtype=torch.float64), torch.arange(5)
    plain = build_block(block_config({**BASE, "attn": "mha+qknorm"})).double()
    plain.load_state_dict(built.state_dict(), strict=False)
    plain.attn.position = torch.nn.Identity()  # no rotation: the query as qk-norm leaves it
    plain.attn.position.rotate = lambda q, k, positions: (q, k)
    d_head, module = built.attn.d_head, built.attn
    normed = plain.attn.project(x, slots)[0][:, 0]  # (b, t, d_head)
    expected = by_hand(normed, module.canon.kernel[:d_head])
    q = module.project(x, slots)[0][:, 0]
    torch.testing.assert_close(q, module.position.rotate(expected[:, None], expected[:, None], slots)[0][:, 0],
                               rtol=0, atol=1e-12)  # fmt: skip


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_site_d_is_the_canon_layer_on_the_hidden_units_before_the_activation(mlp):
    built, x = block("d", mlp=mlp), torch.randn(2, 6, 16, dtype=torch.float64)
    module = built.mlp
    if mlp == "gelu":
        expected = module.down(F.gelu(by_hand(module.up(x), module.canon.kernel)))
    else:
        gate, up = by_hand(torch.cat(module.gate_and_up(x), dim=-1), module.canon.kernel).chunk(2, dim=-1)
        expected = module.down(F.silu(gate) * up)
    torch.testing.assert_close(module(x), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("attn", ["linear", "gated_deltanet"])
def test_linear_mixers_take_site_b_and_decode_from_its_tail(attn):
    built, x = block("abcd", attn=attn), torch.randn(2, 6, 16, dtype=torch.float64)
    state, steps = LayerState(), []
    for start, stop in ((0, 3), (3, 5), (5, 6)):
        steps.append(built(x[:, start:stop], cache=state))
    torch.testing.assert_close(torch.cat(steps, dim=1), built(x), rtol=0, atol=1e-10)
    assert set(state.canon) == set("abcd")
    assert all(tail.shape[1] == KERNEL - 1 for tail in state.canon.values())


def test_a_layer_with_canon_layers_cannot_rewind():
    """Softmax attention alone can truncate its cache; its canon layers keep only their last 3 inputs."""
    built, x, state = block("a"), torch.randn(1, 5, 16, dtype=torch.float64), LayerState()
    built(x, cache=state)
    state.truncate(5)  # the present is fine
    with pytest.raises(ConfigError, match="cannot rewind"):
        state.truncate(3)


@pytest.mark.parametrize(
    ("value", "says"),
    [("", "none or sites"), ("e", "'e' is no site"), ("aa", "'a' repeats"), ("ca", "write it 'ac'"),
     ("ABCD", "'A', 'B', 'C', 'D' is no site"), (3, "must be str")],
)  # fmt: skip
def test_a_bad_canon_value_is_refused_by_name_before_anything_is_built(value, says):
    reason = check_combination(block_config(BASE, canon=value))
    assert reason is not None and reason.startswith(f"block.canon={value!r}") and says in reason, reason


def test_a_site_inside_a_part_that_does_not_apply_it_is_refused_with_what_would_do():
    reason = check_combination(block_config({**BASE, "attn": "mla"}, canon="abcd"))
    assert reason is not None and "site b" in reason and "attn=mla" in reason and "block.canon=acd" in reason
    reason = check_combination(block_config({**BASE, "mlp": "moe"}, canon="cd"))
    assert reason is not None and "site d" in reason and "mlp=moe" in reason and "block.canon=c" in reason
    assert check_combination(block_config({**BASE, "attn": "mla", "mlp": "moe"}, canon="ac")) is None
    spec = zoo.resolve_block(block_config(BASE, canon="ac"))
    from zoo.assembly.compat import tp_refusal

    refusal = tp_refusal(spec, 2)
    assert refusal is not None and str(refusal).startswith("block.canon='ac'")


def test_none_builds_the_block_it_built_before():
    """No canon parameter, and the block's numbers as without the key."""
    torch.manual_seed(0)
    plain = build_block(block_config(BASE))
    torch.manual_seed(0)
    spelt = build_block(block_config(BASE, canon="none"))
    assert not any("canon" in name for name, _ in spelt.named_parameters())
    x = torch.randn(2, 5, 16)
    assert torch.equal(plain(x), spelt(x))


def test_flops_per_token_counts_each_site_from_its_channels():
    """Per layer and site: 6 x 4 taps x channels (its parameters) + 3 x channels (the residual sum); channels
    d_model at a and c, q + k + v at b, the gate and up units at d."""
    d, heads, kv, d_ff, layers, seq = 16, 4, 2, 24, 2, 64

    def flops(canon: str) -> int:
        attn = {"name": "gqa", "n_kv_heads": kv}
        block = {"d_model": d, "n_heads": heads, "d_ff": d_ff, "canon": canon, "placement": "pre",
                 "norm": "rmsnorm", "attn": attn, "pos": "none", "mlp": "swiglu"}  # fmt: skip
        return build_model({"block": block, "model": {"n_layers": layers, "vocab_size": 32}}).flops_per_token(seq)

    per_channel = 6 * 4 + 3
    channels = {"a": d, "b": (heads + 2 * kv) * (d // heads), "c": d, "d": 2 * d_ff}
    base = flops("none")
    for site, width in channels.items():
        assert flops(site) - base == layers * per_channel * width, site
    assert flops("abcd") - base == layers * per_channel * sum(channels.values())


def test_a_model_draws_canon_kernels_as_the_reference_does_and_by_name():
    """Uniform within ±1/2 (torch's Conv1d default at 4 taps), redrawn by the model's seeded init: the same seed
    gives the same kernel, whatever else the model holds."""
    def model(mlp: str):
        block = {"d_model": 64, "n_heads": 4, "canon": "a", "placement": "pre", "norm": "rmsnorm", "attn": "mha",
                 "pos": "none", "mlp": mlp}  # fmt: skip
        built = build_model({"block": block, "model": {"n_layers": 1, "vocab_size": 32}})
        built.reset_parameters(seed=3)
        return built.blocks[0].canon["a"].kernel.detach()

    kernel = model("gelu")
    assert kernel.abs().max() <= 0.5 and kernel.std() > 0.2  # U(-1/2, 1/2): std 0.29; the 0.02 draw would be far less
    assert torch.equal(kernel, model("swiglu"))


def test_a_model_with_canon_layers_has_no_transformers_counterpart():
    from zoo.models.hf import family_for

    block = {"d_model": 16, "n_heads": 4, "canon": "ac", "placement": "pre", "norm": "rmsnorm", "attn": "mha",
             "pos": "rotary", "mlp": "swiglu"}  # fmt: skip
    with pytest.raises(ConfigError, match=r"block.canon='ac'.*needs block.canon='none'"):
        family_for(build_model({"block": block, "model": {"n_layers": 1, "vocab_size": 32}}))


def test_the_contract_variant_puts_canon_on_every_site_a_combination_takes():
    """pre+canon is the pre placement's alone (a block setting, not a placement option), and every other axis's
    parts meet it with the sites they apply: abcd, less b beside mla and d beside moe."""
    from zoo.assembly.combinations import block_settings, choices, combinations
    from zoo.lab.studies.coordcheck import combination_overrides

    assert [label for label in choices("placement") if "+" in label] == ["pre+canon", "pre+out_conv"]
    assert block_settings(BASE) == {}
    assert block_settings({**BASE, "placement": "pre+canon"}) == {"canon": "abcd"}
    assert block_settings({**BASE, "placement": "pre+canon", "attn": "mla", "mlp": "moe"}) == {"canon": "ac"}
    with_canon = [c for c in combinations() if c["placement"] == "pre+canon"]
    for axis in ("norm", "attn", "pos", "mlp"):
        assert {c[axis] for c in with_canon} == set(choices(axis)), axis
    row = {**BASE, "placement": "pre+canon", "mlp": "moe"}
    assert combination_overrides(row)[-1] == 'block.canon="abc"'
