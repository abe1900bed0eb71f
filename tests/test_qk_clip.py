"""``optim.qk_clip=tau``: each head whose largest logit passed tau has its query and key rows rescaled by the
split rule (MHA and GQA: docs/muon.md, "QK-clip"; MLA: the rotary query takes the whole gamma, the shared rotary
key none), checked against a computation by hand; bad values and runs it cannot serve are refused by name before
any model is built; a run with it resumes bit for bit."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import tiny
from test_recipe import resumes_bit_identically

from zoo import build_model, compose
from zoo.lab.recipe.qk_clip import QKClip, clip_factors
from zoo.lab.training.run import run


def one_block(*overrides: str) -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    sizes = ["block.d_model=16", "block.n_heads=4", "model.n_layers=1", "model.vocab_size=32", "block.bias=true"]
    model = build_model(compose([*sizes, *overrides]))
    return model, model.blocks[0].attn, 3 * torch.randn(2, 7, 16)


def clipped(model: torch.nn.Module, attn: torch.nn.Module, x: torch.Tensor, tau: float) -> torch.Tensor:
    """One clip of ``attn`` as a training step makes it, its input ``x`` kept as the training forward would."""
    clip = QKClip(model, tau)
    clip.inputs[0] = x
    clip.measure()
    clip.rescale()
    return clip.tau


def head_max(attn: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return attn.attention_logits(x).amax(dim=(0, 2, 3))


def test_clip_factors_are_min_of_one_and_tau_over_the_largest_logit():
    got = clip_factors(torch.tensor([10.0, 2.0, -3.0, 4.0]), 4.0)
    assert got.tolist() == pytest.approx([0.4, 1.0, 1.0, 1.0])


@pytest.mark.parametrize("attn", ["mha", "gqa"])
def test_gqa_scales_each_query_by_gamma_over_root_gamma_min_and_the_shared_key_by_root_gamma_min(attn):
    model, mixer, x = one_block(f"attn={attn}")
    with torch.no_grad():
        before = head_max(mixer, x)
        tau = float(before.median())  # some heads clipped, some not
        weight, bias = mixer.qkv.weight.clone(), mixer.qkv.bias.clone()
        clipped(model, mixer, x, tau)
        after = head_max(mixer, x)
    heads, groups, d = mixer.n_heads, mixer.n_kv_heads, mixer.d_head
    per_group = heads // groups
    gamma = [min(1.0, tau / m) if m > tau else 1.0 for m in before.tolist()]
    factors = []  # by hand, in qkv's row order: per group its query heads, its key, its value
    for g in range(groups):
        low = min(gamma[g * per_group : (g + 1) * per_group])
        factors += [gamma[g * per_group + i] / math.sqrt(low) for i in range(per_group)] + [math.sqrt(low), 1.0]
    rows = torch.tensor(factors).repeat_interleave(d)
    torch.testing.assert_close(mixer.qkv.weight, weight * rows[:, None])
    torch.testing.assert_close(mixer.qkv.bias, bias * rows)
    torch.testing.assert_close(after, torch.minimum(before, torch.tensor(tau)))
    assert (before > tau).any() and (before <= tau).any()


def test_mla_scales_content_by_root_gamma_the_rotary_query_by_gamma_and_not_the_shared_rotary_key():
    model, mixer, x = one_block("attn=mla", "block.attn.rope_dim=2")
    with torch.no_grad():
        before = head_max(mixer, x)
        tau = float(before.median())
        q, up, down = mixer.q.weight.clone(), mixer.kv_up.weight.clone(), mixer.kv_down.weight.clone()
        clipped(model, mixer, x, tau)
        after = head_max(mixer, x)
    d, r = mixer.d_head, mixer.rope_dim
    q_rows, kv_rows = [], []
    for m in before.tolist():
        g = tau / m if m > tau else 1.0
        q_rows += [math.sqrt(g)] * d + [g] * r  # content, then rotary features
        kv_rows += [math.sqrt(g)] * d + [1.0] * d  # key, then value
    torch.testing.assert_close(mixer.q.weight, q * torch.tensor(q_rows)[:, None])
    torch.testing.assert_close(mixer.kv_up.weight, up * torch.tensor(kv_rows)[:, None])
    assert torch.equal(mixer.kv_down.weight, down)  # the latent and the shared rotary key
    torch.testing.assert_close(after, torch.minimum(before, torch.tensor(tau)))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optim.qk_clip=0"], "optim.qk_clip=0: null (off) or a number > 0"),
        (["optim.qk_clip=-2.5"], "optim.qk_clip=-2.5: null (off) or a number > 0"),
        (["optim.qk_clip=big"], "optim.qk_clip='big': null (off) or a number > 0"),
        (["optim.qk_clip=5", "attn=linear"], "optim.qk_clip=5.0: needs softmax attention in every block"),
        (["optim.qk_clip=5", "block.attn.qk_norm=rmsnorm"], "optim.qk_clip=5.0: null with block.attn.qk_norm"),
        (["optim.qk_clip=5", "compile=true"], "optim.qk_clip=5.0: null with compile=true"),
    ],
)
def test_bad_values_and_runs_it_cannot_serve_are_refused_by_name_before_any_model(tmp_path, overrides, message):
    summary = run(tiny("optim=adamw", *overrides), tmp_path)
    assert summary["status"] == "failed" and message in summary["error"], summary["error"]
    assert "parameters" not in summary


def test_a_clipped_run_trains_otherwise_and_resumes_to_the_last_bit(tmp_path):
    plain = run(tiny("optim=muon", "train.lr=0.05"), tmp_path / "plain")  # its largest logits pass 0.1 by step 4
    clip = run(tiny("optim=muon", "train.lr=0.05", "optim.qk_clip=0.1"), tmp_path / "clip")
    assert plain["status"] == clip["status"] == "ok"
    assert plain["final"]["val_loss"] != clip["final"]["val_loss"]
    resumes_bit_identically(tmp_path / "resume", "optim=muon", "train.lr=0.05", "optim.qk_clip=0.1")
