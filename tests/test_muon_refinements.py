"""Muon's refinements and the hyperball optimizers, each against a hand computation of a step or two on a tiny
matrix: Polar Express's coefficients, NorMuon, cautious weight decay, MuonH and AdamH; their bad options refused
by name; the hashes of runs recorded before the options existed unchanged."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny
from test_recipe import resumes_bit_identically
from torch import nn

from zoo.core.errors import ConfigError
from zoo.lab.planning.train_config import TrainConfig
from zoo.lab.recipe import Recipe
from zoo.lab.recipe.muon import MuonAdamW, lr_factor, orthogonalize
from zoo.lab.recipe.refinements import POLAR_EXPRESS_RAW, ns_schedule
from zoo.lab.records.config import config_hash

LR, WD, MOMENTUM = 0.1, 0.5, 0.95  # MOMENTUM: optim=muon's default


def entry(name: str, **options: object) -> object:
    return Recipe(optim={"name": name, **options}).optimizer_entry(TrainConfig())


def one_matrix(name: str, weight: torch.Tensor, grads: list[torch.Tensor], **options: object) -> MuonAdamW:
    """``name``'s optimizer over a model of one hidden matrix (a part's ``out``), stepped once per gradient."""
    model = nn.Sequential(Part(weight))
    optimizer = entry(name, **options).build(model, lr=LR, weight_decay=WD)
    for grad in grads:
        model[0].out.grad = grad.clone()
        optimizer.step()
    return model[0].out.detach()


class Part(nn.Module):
    """A part that declares its matrices (so ``out`` is a hidden matrix)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.out = nn.Parameter(weight.clone())

    def matrix_blocks(self) -> dict:
        return {}


def nesterov(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each step's nesterov momentum update (buffer lerped towards the gradient by 1 - momentum)."""
    buf, out = torch.zeros_like(grads[0]), []
    for g in grads:
        buf = buf + (1 - MOMENTUM) * (g - buf)
        out.append(g + MOMENTUM * (buf - g))
    return out


def ortho(update: torch.Tensor, ns: str = "quintic") -> torch.Tensor:
    coefficients, safety = ns_schedule(ns, 5)
    return orthogonalize(update[None], coefficients, 1e-7, safety)[0].float()


@pytest.fixture
def tiny_matrix() -> tuple[torch.Tensor, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 6, generator=g), [torch.randn(4, 6, generator=g) for _ in range(2)]


# -- Polar Express ----------------------------------------------------------------------------------------------


def test_polar_express_applies_each_iterations_polynomial_to_the_singular_values():
    """Each singular value s of G goes to p_5(...p_1(s / (1.01 |G|_F))), p_i = a_i x + b_i x^3 + c_i x^5 with
    the paper's i-th coefficients over 1.01, 1.01^3, 1.01^5; the singular vectors stay (bfloat16: 3e-2)."""
    g = torch.randn(6, 10, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    u, s, vh = torch.linalg.svd(g, full_matrices=False)
    x = s / (1.01 * s.square().sum().sqrt())
    for a, b, c in POLAR_EXPRESS_RAW[:5]:
        x = a / 1.01 * x + b / 1.01**3 * x**3 + c / 1.01**5 * x**5
    expected = u @ torch.diag(x) @ vh
    got = ortho(g.float(), "polar_express").double()
    assert (got - expected).abs().max() < 3e-2
    assert (ortho(g.float(), "quintic").double() - expected).abs().max() > 0.1  # the reference's differs


def test_polar_express_repeats_its_last_polynomial_past_the_table():
    coefficients, safety = ns_schedule("polar_express", 10)
    assert safety == 1.01 and len(coefficients) == 10
    assert coefficients[7:] == (POLAR_EXPRESS_RAW[-1],) * 3 and coefficients[0][0] == POLAR_EXPRESS_RAW[0][0] / 1.01


def test_optim_ns_polar_express_steps_with_its_coefficients(tiny_matrix):
    weight, grads = tiny_matrix
    got = one_matrix("muon", weight, grads[:1], ns="polar_express", weight_decay=0.0)
    expected = weight - LR * lr_factor(None, 4, 6) * ortho(nesterov(grads)[0], "polar_express")
    assert torch.allclose(got, expected, atol=1e-6)


# -- NorMuon ----------------------------------------------------------------------------------------------------


def test_normuon_divides_each_row_by_its_running_rms_and_keeps_the_updates_norm(tiny_matrix):
    """Two steps: v <- 0.95 v + 0.05 mean_cols(O^2) per row, O / sqrt(v) rescaled to |O|_F, then Muon's step
    (decay first, then the update times the shape factor)."""
    weight, grads = tiny_matrix
    got = one_matrix("normuon", weight, grads)
    w, v = weight.clone(), torch.zeros(4)
    for update in nesterov(grads):
        o = ortho(update)
        v = 0.95 * v + 0.05 * o.square().mean(1)
        normalized = o / v.sqrt()[:, None]
        normalized = normalized * o.norm() / normalized.norm()
        w = w * (1 - LR * WD) - LR * lr_factor(None, 4, 6) * normalized
    assert torch.allclose(got, w, atol=1e-6)
    plain = one_matrix("muon", weight, grads)
    assert (got - plain).abs().max() > 1e-3  # the rows' scales differ from Muon's


# -- cautious weight decay --------------------------------------------------------------------------------------


def test_cautious_weight_decay_decays_only_where_the_update_and_the_weight_agree_in_sign(tiny_matrix):
    weight, grads = tiny_matrix
    got = one_matrix("muon", weight, grads[:1], cautious_wd=True)
    o = ortho(nesterov(grads)[0])
    mask = (o * weight >= 0).float()
    assert 0 < mask.mean() < 1  # some entries masked, some not
    expected = weight - LR * (lr_factor(None, 4, 6) * o + WD * mask * weight)
    assert torch.allclose(got, expected, atol=1e-6)


# -- the hyperball ----------------------------------------------------------------------------------------------


def on_sphere(w: torch.Tensor, u: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    moved = w - LR * radius * u / u.norm()
    return radius * moved / moved.norm()


def test_muonh_steps_on_the_sphere_of_the_initial_norm(tiny_matrix):
    weight, grads = tiny_matrix
    got = one_matrix("muonh", weight, grads)
    w, radius = weight.clone(), weight.norm()
    for update in nesterov(grads):
        w = on_sphere(w, ortho(update), radius)
    assert torch.allclose(got, w, atol=1e-6) and torch.allclose(got.norm(), radius)


def test_adamh_steps_adams_direction_on_the_sphere(tiny_matrix):
    weight, grads = tiny_matrix
    got = one_matrix("adamh", weight, grads)
    w, radius, m, v = weight.clone(), weight.norm(), torch.zeros(4, 6), torch.zeros(4, 6)
    for t, g in enumerate(grads, start=1):
        m, v = 0.9 * m + 0.1 * g, 0.95 * v + 0.05 * g.square()
        w = on_sphere(w, (m / (1 - 0.9**t)) / ((v / (1 - 0.95**t)).sqrt() + 1e-8), radius)
    assert torch.allclose(got, w, atol=1e-6)


@pytest.mark.parametrize("name", ["muonh", "adamh"])
def test_each_logical_matrix_of_a_fused_bank_keeps_its_own_norm(name):
    """A (2, 12, 4) bank of fused weights, three 4-row blocks each: each of the six matrices keeps its norm."""
    g = torch.Generator().manual_seed(1)
    scales = torch.tensor([1.0, 3.0, 0.2]).repeat_interleave(4)[:, None]  # each block its own norm
    bank = nn.Parameter(torch.randn(2, 12, 4, generator=g) * scales)
    blocks = {b: torch.arange(4 * i, 4 * i + 4) for i, b in enumerate("qkv")}
    group = {"kind": "blocks", "params": [bank], "lr": 0.3, "weight_decay": 0.0, "hyperball": True,
             **({"direction": "adam", "betas": (0.9, 0.95), "eps": 1e-8} if name == "adamh" else
                {"momentum": 0.9, "nesterov": True, "ns_coefficients": (3.4445, -4.7750, 2.0315), "eps": 1e-7,
                 "ns_steps": 5})}  # fmt: skip
    optimizer = MuonAdamW([group], {bank: blocks})
    norms = lambda: torch.stack([bank.detach()[:, rows].norm(dim=(-2, -1)) for rows in blocks.values()])  # noqa: E731
    before = norms()
    for _ in range(3):
        bank.grad = torch.randn(2, 12, 4, generator=g)
        optimizer.step()
    assert torch.allclose(norms(), before, rtol=1e-5)
    assert (bank.detach().norm() - before.square().sum().sqrt()).abs() < 1e-4


# -- options, and the runs recorded before them -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("muon", {"ns": "cubic"}, "optim.ns='cubic': must be one of 'quintic', 'polar_express'"),
        ("normuon", {"normuon_beta2": 1.0}, "optim.normuon_beta2=1.0: must be in [0, 1)"),
        ("muonh", {"weight_decay": 0.1}, "optim.weight_decay=0.1: must be null or 0 with optim.hyperball"),
        ("muonh", {"cautious_wd": True}, "optim.cautious_wd=True: must be false with optim.hyperball"),
        ("adamh", {"betas": (0.9, 1.0)}, "optim.betas=(0.9, 1.0): must be two numbers in [0, 1)"),
        ("adamh", {"eps": 0.0}, "optim.eps=0.0: must be > 0"),
    ],
)
def test_bad_refinement_options_are_refused_by_name(name, options, message):
    with pytest.raises(ConfigError) as error:
        entry(name, **options)
    assert str(error.value).startswith(message)


def test_the_new_options_at_their_defaults_leave_muon_runs_hashes_as_they_were():
    """The hashes below were computed before optim.ns, cautious_wd, normuon_beta2 and hyperball existed."""
    assert config_hash(tiny("optim=muon")) == "6316be9fcbd97a83"
    assert config_hash(tiny("optim=muon", "optim.momentum=0.9")) == "8ce738dab858ef25"
    assert config_hash(tiny("optim=muon", "optim.ns=polar_express")) != "6316be9fcbd97a83"


def test_polar_express_with_cautious_decay_resumes_to_the_last_bit(tmp_path):
    resumes_bit_identically(tmp_path, "optim=muon", "optim.ns=polar_express", "optim.cautious_wd=true", "train.lr=0.2")
