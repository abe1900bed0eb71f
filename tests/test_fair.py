"""Fair comparisons: parameter-matched MLP widths, and initialization shared across variants."""

from __future__ import annotations

import pytest
import torch

from zoo import ATTENTIONS, MLPS, build_block, build_model, compose, param_report
from zoo.assembly.init import parameter_seed

BASE = {"d_model": 64, "n_heads": 8, "placement": "pre", "norm": "rmsnorm", "pos": "rotary"}


def mlp_slope(mlp: str) -> int:
    """Parameters one more hidden unit adds to the MLP (so the nearest width is within half of it)."""
    a, b = (param_report({**BASE, "attn": "mha", "mlp": mlp, "d_ff": w})["block_params"] for w in (10, 11))
    return b - a


@pytest.mark.parametrize("mlp", MLPS.names())
@pytest.mark.parametrize("attn", ATTENTIONS.names())
@pytest.mark.parametrize("match_attn", [None, "mha"])
def test_match_params_reaches_the_reference_count(mlp, attn, match_attn):
    cfg = {**BASE, "attn": attn, "mlp": {"name": mlp, "match": "params", "match_attn": match_attn}}
    report = param_report(cfg)
    reference = param_report({**BASE, "attn": match_attn or attn, "mlp": "gelu"})["block_params"]
    assert report["reference_params"] == reference
    assert abs(report["block_params"] - reference) <= mlp_slope(mlp) / 2
    block = build_block(cfg)
    assert sum(p.numel() for p in block.parameters()) == report["block_params"]
    assert block.mlp.hidden == report["d_ff"]


def test_glus_get_two_thirds_of_the_width_and_gqa_savings_go_to_the_mlp():
    def width(**changes):
        return param_report({**BASE, "d_ff": 768, "attn": "mha", **changes})["d_ff"]

    assert width(mlp="gelu") == 768 and width(mlp="swiglu") == 768  # no matching: as configured
    assert width(mlp={"name": "swiglu", "match": "params"}) == pytest.approx(512, abs=1)
    assert width(mlp={"name": "gelu", "match": "params"}) == 768
    own = width(attn="gqa", mlp={"name": "gelu", "match": "params"})
    given_back = width(attn="gqa", mlp={"name": "gelu", "match": "params", "match_attn": "mha"})
    assert own == 768 and given_back > 768
    # GQA's 2 kv heads instead of 8 save 2 * 64 * 48 weights + 96 biases; the MLP gets them back.
    assert (given_back - 768) * (2 * 64 + 1) == pytest.approx(2 * 64 * 48 + 96, abs=2 * 64 + 1)


def test_unmatched_blocks_report_no_reference():
    assert param_report({**BASE, "attn": "gqa", "mlp": "swiglu"})["reference_params"] is None


def model(seed: int, *overrides: str):
    torch.manual_seed(seed)
    return build_model(compose(["block.d_model=32", "block.n_heads=4", "model.n_layers=2", *overrides]))


def common(a, b) -> list[str]:
    shapes = {name: p.shape for name, p in b.named_parameters()}
    return [name for name, p in a.named_parameters() if shapes.get(name) == p.shape]


@pytest.mark.parametrize(
    "variant",
    [
        ["mlp=swiglu"],
        ["attn=gqa"],
        ["placement=sandwich"],
        ["block.attn.qk_norm=rmsnorm"],
        ["pos=alibi", "norm=scalenorm"],
    ],
)
def test_same_seed_same_weights_for_every_shared_parameter(variant):
    base, other = model(3, "preset=llama"), model(3, "preset=llama", *variant)
    shared = common(base, other)
    assert len(shared) >= 8
    params = dict(other.named_parameters())
    for name, p in base.named_parameters():
        if name in shared:
            torch.testing.assert_close(p, params[name], rtol=0, atol=0, msg=f"{name} differs")


def test_different_seeds_and_different_shapes_draw_different_weights():
    a, b = model(3, "preset=llama"), model(4, "preset=llama")
    assert not torch.equal(a.blocks[0].attn.qkv.weight, b.blocks[0].attn.qkv.weight)
    wide = model(3, "preset=llama", "block.d_ff=96")
    assert wide.blocks[0].mlp.down.weight.shape != a.blocks[0].mlp.down.weight.shape
    assert not torch.equal(wide.blocks[0].mlp.down.weight[:, :8], a.blocks[0].mlp.down.weight[:, :8])
    assert parameter_seed(3, "x", (2, 3)) != parameter_seed(3, "x", (3, 2)) != parameter_seed(4, "x", (2, 3))


def test_layers_differ_and_reinitializing_leaves_the_global_generator_alone():
    built = model(5, "preset=llama")
    assert not torch.equal(built.blocks[0].attn.qkv.weight, built.blocks[1].attn.qkv.weight)
    before, state = built.blocks[0].attn.qkv.weight.clone(), torch.get_rng_state()
    torch.rand(10)  # move the global generator: the re-draw must not depend on it
    built.reset_parameters(seed=5)
    torch.testing.assert_close(built.blocks[0].attn.qkv.weight, before, rtol=0, atol=0)
    torch.rand(10)
    after = torch.get_rng_state()
    torch.set_rng_state(state)
    torch.rand(10)
    built.reset_parameters(seed=5)
    torch.rand(10)
    assert torch.equal(torch.get_rng_state(), after)
