"""The compatibility map: which combinations are valid, and why not, from rules kept in the parts."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

import zoo
from zoo import POSITIONS, ConfigError, build_block, build_model, check_combination, compose
from zoo.lab.commands.parts import parts_main
from zoo.parts.positions import Position
from zoo.testing.combos import TINY, block_config, context_of
from zoo.testing.contract import Subject


def cfg(**axes):
    return {**TINY, "placement": "pre", "norm": "rmsnorm", "attn": "gqa", "pos": "rotary", "mlp": "swiglu", **axes}


@pytest.mark.parametrize(
    ("changes", "context", "reason"),
    [
        ({"pos": "learned"}, "block", "block.pos.name='learned': needs embedding"),
        ({"pos": "sinusoidal"}, "block", "block.pos.name='sinusoidal': needs embedding"),
        ({"pos": "learned", "max_len": None}, "model", "block.max_len=None: learned positions need a table size"),
        ({"attn": {"name": "mha", "window": 8}}, "model", "block.attn.window=8: must be smaller than block.max_len=8"),
        ({"attn": {"name": "mha", "softcap": 30.0}}, "block", "block.attn.softcap=30.0: needs block.attn.backend=math"),
        ({"attn": {"name": "mha", "qk_norm": "batchnorm"}}, "block", "block.attn.qk_norm='batchnorm': none or a"),
        ({"pos": {"name": "rotary", "rotary_fraction": 0.3}}, "block", "rotates int(d_head * fraction) = 1"),
        ({"mlp": {"name": "gelu", "match_attn": "moe"}}, "block", "block.mlp.match_attn='moe'"),
        ({"mlp": {"name": "gelu", "match": "flops"}}, "block", "block.mlp.match='flops': must be one of"),
    ],
)
def test_invalid_combinations_say_why(changes, context, reason):
    message = check_combination(cfg(**changes), context)
    assert message is not None and reason in message, message


def test_valid_combinations_give_none():
    assert check_combination(cfg()) is None
    assert check_combination(cfg(pos="learned"), "model") is None
    assert check_combination({"block": cfg(pos="learned"), "model": {}}) is None  # a full config: a model
    assert check_combination(cfg(attn={"name": "mha", "softcap": 30.0, "backend": "math", "window": 4})) is None


def test_a_lone_block_refuses_what_only_a_model_provides():
    with pytest.raises(ConfigError, match="needs embedding"):
        build_block(cfg(pos="learned"))
    assert len(build_block(cfg(pos="learned"), context="model").state_dict()) > 0


def test_sweep_facing_check_takes_full_configs():
    """What a sweep calls per grid point: a full config in, None or the reason out, never an exception."""
    assert check_combination(compose(["pos=learned", "block.max_len=64"])) is None
    block = {**cfg(), "attn": {"name": "gqa", "window": 64}, "max_len": 32}
    grid_point = OmegaConf.create({"block": block, "model": {}})
    assert check_combination(grid_point) == (
        "block.attn.window=64: must be smaller than block.max_len=32 (a window over the whole context is no window)"
    )
    assert check_combination({"block": cfg(norm="rmsnrom")}).startswith("block.norm.name='rmsnrom'")


def test_zoo_parts_check_says_valid_or_why_not(capsys):
    with pytest.raises(SystemExit) as exit_code:
        parts_main(["--check", "pos=learned", "block.max_len=64", "mlp=swiglu", "block.mlp.match=params"])
    out = capsys.readouterr().out
    assert exit_code.value.code == 0 and out.startswith("valid: ") and "matched to" in out
    with pytest.raises(SystemExit) as exit_code:
        parts_main(["--check", "--block", "pos=learned", "block.max_len=64"])
    out = capsys.readouterr().out
    assert exit_code.value.code == 1 and "invalid: block.pos.name='learned': needs embedding" in out
    with pytest.raises(SystemExit) as exit_code:
        parts_main(["--check", "attn=gqa", "block.attn.softcap=30"])
    assert exit_code.value.code == 1 and "needs block.attn.backend=math" in capsys.readouterr().out


class NeedsTea(Position):
    """A throwaway part that needs what no context provides."""

    needs = {"tea": "brews it first"}

    def __init__(self, dims) -> None:
        super().__init__()


def test_the_contract_suite_skips_an_unmet_need_with_its_reason():
    POSITIONS.register("tea", formula="-", reference="-")(NeedsTea)
    try:
        combo = {"placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "tea", "mlp": "gelu"}
        assert context_of(block_config(combo)) == (None, "block.pos.name='tea': needs tea: brews it first")
        assert Subject.of(combo) == "block.pos.name='tea': needs tea: brews it first"
    finally:
        POSITIONS.unregister("tea")


class MakesTea(nn.Module):
    provides = frozenset({"tea"})


def test_a_need_can_be_met_by_another_part():
    POSITIONS.register("tea", formula="-", reference="-")(NeedsTea)
    zoo.NORMS.register("teanorm", formula="-", reference="-")(type("TeaNorm", (MakesTea,), {"__init__": _init}))
    try:
        assert check_combination(cfg(pos="tea")) is not None
        assert check_combination(cfg(pos="tea", norm="teanorm")) is None
    finally:
        POSITIONS.unregister("tea")
        zoo.NORMS.unregister("teanorm")


def _init(self, dims) -> None:
    nn.Module.__init__(self)


def test_learned_positions_live_in_the_model():
    model = build_model(compose(["pos=learned", "block.max_len=16", "block.d_model=32", "block.n_heads=4"]))
    assert model.pos_embed.weight.shape == (16, 32)
    assert model.parameter_counts()["embedding"] == 256 * 32 + 16 * 32
    assert not any("pos" in name for name, _ in model.blocks.named_parameters())
    with pytest.raises(ValueError, match="position 16 is past the learned table"):
        model(torch.zeros(1, 17, dtype=torch.long))
