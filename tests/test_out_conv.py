"""block.out_conv: canon's causal 4-tap convolution on the attention and MLP branches' outputs, before the
residual add; checked against explicit taps, continued across decoding calls, refused by name."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny

from zoo import ConfigError, LayerState, build_block
from zoo.assembly.compat import tp_refusal
from zoo.assembly.spec import resolve_block
from zoo.lab.commands.argv import quoted_lists
from zoo.models.language import build_model
from zoo.parts.canon import Canon
from zoo.testing.combos import block_config, randomize

BASE = {"placement": "pre", "norm": "rmsnorm", "attn": "gqa", "pos": "rotary", "mlp": "swiglu"}


def by_hand(h: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """h + conv(h) from explicit taps: y_i = h_i + sum_j kernel[:, 0, j] h_{i - 3 + j}, zeros before the first."""
    y = h.clone()
    for i in range(h.shape[1]):
        for j in range(4):
            if i - 3 + j >= 0:
                y[:, i] += kernel[:, 0, j] * h[:, i - 3 + j]
    return y


def block(out_conv: str, **parts: str) -> torch.nn.Module:
    built = build_block(block_config({**BASE, **parts}, out_conv=out_conv)).double().eval()
    randomize(built)
    with torch.no_grad():  # kernels far from zero, so a branch left without one cannot pass
        for m in built.modules():
            if isinstance(m, Canon):
                m.kernel.normal_(0, 1)
    return built


@pytest.mark.parametrize("out_conv", ["attn", "mlp", "attn,mlp"])
def test_each_named_branch_output_takes_the_convolution_before_the_residual_add(out_conv):
    built, x = block(out_conv), torch.randn(2, 7, 16, dtype=torch.float64)
    norms, convs = built.placement.norms, built.out_conv
    attn = built.attn(norms[0](x))
    h = x + (by_hand(attn, convs["attn"].kernel) if "attn" in convs else attn)
    mlp = built.mlp(norms[1](h))
    expected = h + (by_hand(mlp, convs["mlp"].kernel) if "mlp" in convs else mlp)
    torch.testing.assert_close(built(x), expected, rtol=0, atol=1e-12)
    assert sorted(convs) == sorted(out_conv.split(","))


def test_sandwich_convolves_the_branch_output_before_its_output_norm():
    built, x = block("attn,mlp", placement="sandwich"), torch.randn(2, 5, 16, dtype=torch.float64)
    (norms, outs), convs = (built.placement.norms, built.placement.out_norms), built.out_conv
    h = x + outs[0](by_hand(built.attn(norms[0](x)), convs["attn"].kernel))
    expected = h + outs[1](by_hand(built.mlp(norms[1](h)), convs["mlp"].kernel))
    torch.testing.assert_close(built(x), expected, rtol=0, atol=1e-12)


def test_cached_decoding_continues_each_convolution_from_its_last_three_outputs():
    """Token by token with a state equals the full forward; the state holds 3 outputs per branch."""
    built, x = block("attn,mlp"), torch.randn(2, 6, 16, dtype=torch.float64)
    state = LayerState()
    steps = [built(x[:, :2], cache=state)] + [built(x[:, i : i + 1], cache=state) for i in range(2, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), built(x), rtol=0, atol=1e-10)
    assert set(state.canon) == {"attn", "mlp"} and all(t.shape == (2, 3, 16) for t in state.canon.values())
    assert built.state_size(6) == built.attn.state_size(6) + 2 * 3 * 16


def test_none_builds_the_block_it_built_before():
    torch.manual_seed(0)
    plain = build_block(block_config(BASE))
    torch.manual_seed(0)
    spelt = build_block(block_config(BASE, out_conv="none"))
    assert not any("out_conv" in name for name, _ in spelt.named_parameters())
    x = torch.randn(2, 5, 16)
    assert torch.equal(plain(x), spelt(x))


@pytest.mark.parametrize("value", ["foo", "mlp,attn", "attn,attn", "attn,", "", "attn mlp"])
def test_a_bad_value_is_refused_by_name_before_anything_is_built(value):
    with pytest.raises(ConfigError, match=r"block.out_conv=.*none, attn, mlp or attn,mlp"):
        resolve_block(block_config(BASE, out_conv=value))


def test_tensor_parallelism_refuses_it_by_name():
    error = tp_refusal(resolve_block(block_config(BASE, out_conv="mlp")), 2)
    assert error is not None and error.field == "block.out_conv"


def test_flops_and_parameters_count_each_branch():
    """Per layer and branch: d_model x 4 kernel parameters (the attention's and the MLP's component), and
    6 x 4 x d_model + 3 x d_model training FLOPs."""
    d, layers, seq = 16, 2, 32

    def model(out_conv: str):
        block = {"d_model": d, "n_heads": 4, "out_conv": out_conv, **BASE}
        return build_model({"block": block, "model": {"n_layers": layers, "vocab_size": 32}})

    base, both = model("none"), model("attn,mlp")
    plain, counts = base.parameter_counts(), both.parameter_counts()
    assert counts["attention"] - plain["attention"] == counts["mlp"] - plain["mlp"] == layers * 4 * d
    assert both.flops_per_token(seq) - base.flops_per_token(seq) == 2 * layers * (6 * 4 + 3) * d


def test_a_model_with_it_has_no_transformers_counterpart():
    from zoo.models.hf import family_for

    block = {"d_model": 16, "n_heads": 4, "out_conv": "attn", **BASE}
    with pytest.raises(ConfigError, match=r"block.out_conv='attn'.*needs block.out_conv='none'"):
        family_for(build_model({"block": block, "model": {"n_layers": 1, "vocab_size": 32}}))


def test_the_contract_variant_meets_every_part_of_the_other_axes():
    from zoo.assembly.combinations import block_settings, choices, combinations

    assert "pre+out_conv" in choices("placement")
    assert block_settings({**BASE, "placement": "pre+out_conv", "mlp": "moe"}) == {"out_conv": "attn,mlp"}
    with_it = [c for c in combinations() if c["placement"] == "pre+out_conv"]
    for axis in ("norm", "attn", "pos", "mlp"):
        assert {c[axis] for c in with_it} == set(choices(axis)), axis


def test_the_command_line_reads_attn_comma_mlp_as_one_value_outside_a_multirun():
    assert quoted_lists(["block.out_conv=attn,mlp", "attn=mha,gqa"]) == ["block.out_conv='attn,mlp'", "attn=mha,gqa"]
    assert quoted_lists(["-m", "block.out_conv=attn,mlp"]) == ["-m", "block.out_conv=attn,mlp"]
    assert tiny(*quoted_lists(["block.out_conv=attn,mlp"]))["block"]["out_conv"] == "attn,mlp"
