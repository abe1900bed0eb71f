"""``init=<scheme>``: each matrix and embedding is the same seeded draw as GPT-2's, at its scheme's std (checked by
dividing both by the std written out by hand); the default leaves the build's weights to the bit; bad options
and the combinations it cannot run are refused by key before any model is built."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import tiny

from zoo.lab.planning.run_model import build_run_model
from zoo.lab.training.run import run

D, LAYERS = 32, 3
SIZES = (f"block.d_model={D}", "block.n_heads=4", f"model.n_layers={LAYERS}", "mlp=swiglu",
         "model.tie_embeddings=false")


def weights(*overrides: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {n: p.detach() for n, p in build_run_model(tiny(*SIZES, *overrides)).named_parameters()}


def is_output(name: str) -> bool:
    return name.endswith(("attn.out.weight", "mlp.down.weight"))


def gpt2_std(name: str) -> float:
    return 0.02 / math.sqrt(2 * LAYERS) if is_output(name) else 0.02


def by_hand(scheme: str, name: str, shape: torch.Size) -> float:
    """Each scheme's std, written out from docs/recipe.md."""
    embedding = name in ("embed.weight",)
    if scheme == "olmo":
        return 1.0 if embedding else 1 / math.sqrt(D)
    if scheme == "mitchell":
        if embedding:
            return 0.02
        layer = int(name.split(".")[1]) if is_output(name) else None
        return 1 / math.sqrt(shape[-1] * (2 * (layer + 1) if layer is not None else 1))
    if scheme == "gpt2_wide":
        return 0.05 / math.sqrt(2 * LAYERS) if is_output(name) else 0.05
    return 0.0 if is_output(name) else gpt2_std(name)  # zero_out


@pytest.mark.parametrize(
    ("scheme", "overrides"),
    [("olmo", ("init=olmo",)), ("mitchell", ("init=mitchell",)), ("zero_out", ("init=zero_out",)),
     ("gpt2_wide", ("init=gpt2", "init.std=0.05"))],
)  # fmt: skip
def test_each_matrix_is_gpt2s_draw_at_its_schemes_std(scheme, overrides):
    base, got = weights(), weights(*overrides)
    drawn = [n for n, p in base.items() if p.ndim >= 2]
    assert "head.weight" in drawn and any(is_output(n) for n in drawn)
    for name in drawn:
        std = by_hand(scheme, name, base[name].shape)
        if std == 0:
            assert torch.equal(got[name], torch.zeros_like(got[name])), name
        else:
            assert torch.allclose(got[name] / std, base[name] / gpt2_std(name), rtol=1e-5, atol=1e-6), name
    for name in set(base) - set(drawn):  # biases and gains as the build left them
        assert torch.equal(got[name], base[name]), name


def test_the_default_leaves_the_builds_weights_to_the_bit():
    torch.manual_seed(0)
    from zoo import build_model, compose

    built = dict(build_model(compose(["task=bytes", *SIZES, "model.vocab_size=256"])).named_parameters())
    default = weights()
    assert all(torch.equal(default[n], built[n].detach()) for n in built)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("init=gpt2", "init.std=0"), "init.std=0: must be a number > 0"),
        (("init=olmo", "+init.std=0.1"), "init.std=0.1: init=olmo reads embedding_std"),
        (("init=mitchell", "+init.std=0.1"), "init.std=0.1: init=mitchell reads no option"),
        (("init=olmo", "param=mup", "param.base_width=16"), "init.name='olmo': param=mup scales GPT-2's stds"),
        (("+init.name=xavier",), "init.name='xavier': one of gpt2, olmo, zero_out, mitchell"),
    ],
)
def test_bad_init_options_are_refused_by_key_before_any_model_is_built(tmp_path, overrides, message):
    overrides = tuple(o.replace("+init.name", "init.name") for o in overrides)
    summary = run(tiny(*overrides), tmp_path)
    assert summary["status"] == "failed" and message in summary["error"], summary["error"]
    assert "parameters" not in summary
