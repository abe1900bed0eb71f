"""optim=muon: the parameter groups, the update against torch.optim.Muon on separate matrices, its
orthogonality, training, checkpoint resume, bad options and the refused combinations."""

from __future__ import annotations

import copy

import pytest
import torch
from test_matrix_blocks import CONFIGS, SMALL, model_for
from torch import nn

import zoo
from zoo.assembly import mup
from zoo.core.errors import ConfigError
from zoo.lab.recipe import OPTIMIZERS
from zoo.lab.recipe.muon import MuonAdamW, lr_factor, treatments
from zoo.lab.records.state_tree import from_tree, parse_tensors, tensor_bytes, to_tree


def make(**options: object) -> object:
    return OPTIMIZERS.get("muon").cls(**options)


# -- the parameter groups ------------------------------------------------------------------------------


def vectors(name: str) -> set[str]:
    """The parameters of ``model_for(name)`` that μP calls vectors (zoo.assembly.mup, from the shapes at
    two widths): one dimension grows, as a bias, a gain or a depthwise convolution's kernel (channels, 1,
    taps) does: a bank of set-size filters, one per channel, which no matrix is."""
    widths = [w for w in SMALL if not w.startswith("block.d_model=")]
    build = zoo.build_seq2seq if "cross" in name else zoo.build_model
    found = mup.infer(lambda width: build(zoo.compose([*CONFIGS[name], *widths, f"block.d_model={width}"])), 64, 32)
    return {pname for pname, scaling in found.scalings.items() if scaling.role == "vector"}


@pytest.mark.parametrize("name", CONFIGS)
def test_every_parameter_is_in_exactly_one_group_and_only_hidden_matrices_get_muon(name):
    model = model_for(name)
    optimizer = make().build(model, lr=0.02, weight_decay=0.1)
    ids = [id(p) for g in optimizer.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) and set(ids) == {id(p) for p in model.parameters()}
    kind = {id(p): g["kind"] for g in optimizer.param_groups for p in g["params"]}
    vector = vectors(name)
    for pname, param in model.named_parameters():
        outside = "blocks." not in pname or "norm" in pname  # (encoder./decoder.)blocks.i.* is inside a block
        # biases, gains, depthwise convolution kernels, the embedding (tied head), position tables, norms
        if param.ndim < 2 or pname in vector or outside:
            assert kind[id(param)] == "adamw", pname
        else:
            assert kind[id(param)] in ("muon", "blocks"), pname
    decayed = [p for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]]
    assert all(p.ndim >= 2 for p in decayed)  # no bias or gain decayed
    assert {g["lr_ratio"] for g in optimizer.param_groups} == {1.0, 0.015}


def test_a_depthwise_convolution_kernel_gets_adamw_whatever_its_name():
    found = treatments(model_for("gated_deltanet"))
    assert found["blocks.0.attn.conv"].kind == "adamw"
    assert "depthwise convolution's kernel" in found["blocks.0.attn.conv"].why

    class Canon(nn.Module):  # a declaring part with a depthwise kernel under another name
        def __init__(self) -> None:
            super().__init__()
            self.mix, self.taps = nn.Linear(4, 4), nn.Parameter(torch.randn(4, 1, 3))

        def matrix_blocks(self) -> dict:
            return {}

    found = treatments(nn.Sequential(Canon()))
    assert found["0.mix.weight"].kind == "muon" and found["0.taps"].kind == "adamw"
    assert "depthwise convolution's kernel" in found["0.taps"].why


def test_a_part_that_declares_nothing_gets_adamw():
    class Opaque(nn.Module):  # a registered-looking part with a fused weight and no declaration
        def __init__(self) -> None:
            super().__init__()
            self.fused = nn.Linear(4, 12)

    model = nn.Sequential(Opaque())
    found = treatments(model)  # not a registered class, no hook: outside every part
    assert {how.kind for how in found.values()} == {"adamw"}
    from zoo.core.registry import MLPS

    MLPS.register("opaque_test")(Opaque)
    try:
        found = treatments(model)
        assert found["0.fused.weight"].kind == "adamw" and "declares no matrix_blocks" in found["0.fused.weight"].why
    finally:
        MLPS.unregister("opaque_test")


# -- the update ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("adjust", [None, "match_rms_adamw"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_a_fused_weight_moves_as_torch_muon_moves_its_separate_matrices(adjust, nesterov):
    torch.manual_seed(1)
    blocks = {"q": torch.arange(0, 24), "k": torch.arange(24, 32), "v": torch.arange(32, 40)}
    fused = nn.Parameter(torch.randn(3, 40, 16))  # a bank of three fused weights: each leading index alike
    separate = [nn.Parameter(fused.detach()[e, rows].clone()) for e in range(3) for rows in blocks.values()]
    options = dict(momentum=0.9, nesterov=nesterov, ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, ns_steps=5)
    group = {"kind": "blocks", "params": [fused], "lr": 0.02, "lr_ratio": 1.0, "weight_decay": 0.1, **options}
    ours = MuonAdamW([{**group, "adjust_lr_fn": adjust}], {fused: blocks})
    reference = torch.optim.Muon(separate, lr=0.02, weight_decay=0.1, adjust_lr_fn=adjust, **options)
    for _ in range(3):
        grad = torch.randn_like(fused)
        fused.grad = grad
        for i, p in enumerate(separate):
            p.grad = grad[i // 3, list(blocks.values())[i % 3]].clone()
        ours.step()
        reference.step()
    got = [fused.detach()[e, rows] for e in range(3) for rows in blocks.values()]
    assert max((a - b.detach()).abs().max().item() for a, b in zip(got, separate, strict=True)) < 1e-6


def hidden_updates(optimizer_name: str, model: nn.Module, batch: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """One step from a fresh optimizer: each hidden logical matrix's update over the rate it was taken
    with, and how many singular values of its gradient are at least 3e-3 of the gradient's Frobenius norm."""
    model = copy.deepcopy(model)
    if optimizer_name == "muon":
        optimizer = make(weight_decay=0.0).build(model, lr=0.02, weight_decay=0.0)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    logits = model(batch[:, :-1])
    nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    optimizer.step()
    params = dict(model.named_parameters())
    out = []
    for name, how in treatments(model).items():
        if how.kind == "adamw":
            continue
        for rows in (how.blocks or {"all": torch.arange(params[name].shape[-2])}).values():
            delta, grad = (before[name] - params[name].detach())[rows], grads[name][rows]
            factor = lr_factor(None, *delta.shape) if optimizer_name == "muon" else 1.0
            kept = int((torch.linalg.svdvals(grad) >= 3e-3 * grad.norm()).sum())
            out.append((delta / (0.02 * factor), kept))
    return out


def test_muons_update_of_each_logical_matrix_is_near_orthogonal_where_adamws_is_not():
    torch.manual_seed(0)
    overrides = ["attn=gqa", "mlp=swiglu", "norm=rmsnorm", "block.d_model=16", "block.n_heads=4"]
    model = zoo.build_model(zoo.compose(overrides))
    batch = torch.randint(0, 256, (16, 33))  # 512 tokens
    # The quintic with the reference coefficients, 5 steps, maps sigma / |G|_F in [3e-3, 1] into
    # [0.68, 1.21] (exact arithmetic; smaller sigmas stay below); bfloat16 widens it a little: [0.6, 1.3].
    muon = hidden_updates("muon", model, batch)
    assert sum(kept for _, kept in muon) > 0.8 * sum(min(u.shape) for u, _ in muon)  # mostly full-rank gradients
    for update, kept in muon:
        sigma = torch.linalg.svdvals(update)  # descending
        assert sigma.max() <= 1.3 and sigma[kept - 1] >= 0.6, sigma
    adamw = hidden_updates("adamw", model, batch)
    assert all(torch.linalg.svdvals(u)[0] > 1.3 for u, _ in adamw)


def test_a_tiny_model_trained_with_muon_lowers_its_loss():
    torch.manual_seed(0)
    model = zoo.build_model(zoo.compose(["attn=gqa", "mlp=swiglu", *SMALL]))
    optimizer = make().build(model, lr=0.02, weight_decay=0.0)
    batch = torch.randint(0, 256, (8, 17))
    losses = []
    for _ in range(8):
        loss = nn.functional.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses


def test_the_state_round_trips_through_a_checkpoints_files_and_the_next_step_is_bit_identical(tmp_path):
    torch.manual_seed(0)
    model = zoo.build_model(zoo.compose(["attn=gqa", "mlp=swiglu", *SMALL]))
    batch = torch.randint(0, 256, (4, 9))

    def step(m: nn.Module, opt: torch.optim.Optimizer) -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(m(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten()).backward()
        opt.step()

    optimizer = make().build(model, lr=0.02, weight_decay=0.1)
    for _ in range(2):
        step(model, optimizer)
    tensors: dict[str, torch.Tensor] = {}
    tree = to_tree(optimizer.state_dict(), tensors)
    assert any("momentum_buffer" in name for name in tensors) and any("exp_avg" in name for name in tensors)
    restored_tensors, _ = parse_tensors(tensor_bytes(tensors), tmp_path / "optimizer.safetensors")
    fresh_model = copy.deepcopy(model)
    fresh = make().build(fresh_model, lr=0.02, weight_decay=0.1)
    fresh.load_state_dict(from_tree(tree, restored_tensors, tmp_path / "state.json"))
    step(model, optimizer)
    step(fresh_model, fresh)
    for (name, a), b in zip(model.named_parameters(), fresh_model.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_the_trainers_rate_reaches_every_inner_optimizer():
    model = model_for("gqa+swiglu")
    optimizer = make().build(copy.deepcopy(model), lr=0.02, weight_decay=0.0)
    for group in optimizer.param_groups:
        group["lr"] = 0.0  # as the trainer sets lr = schedule x lr_ratio
    params = [p for g in optimizer.param_groups for p in g["params"]]
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    assert all(torch.equal(a, p) for a, p in zip(before, params, strict=True))


# -- options and combinations --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"momentum": 1.5}, "optim.momentum=1.5: must be in [0, 1)"),
        ({"momentum": -0.1}, "optim.momentum=-0.1"),
        ({"ns_steps": 0}, "optim.ns_steps=0"),
        ({"adjust_lr_fn": "spectral"}, "optim.adjust_lr_fn='spectral'"),
        ({"adam_betas": (0.9,)}, "optim.adam_betas=(0.9,): must be two numbers"),
        ({"lr_ratio": 0.0}, "optim.lr_ratio=0.0"),
        ({"weight_decay": -1.0}, "optim.weight_decay=-1.0"),
    ],
)
def test_bad_options_are_refused_by_field_value_and_what_is_allowed(options, field):
    with pytest.raises(ConfigError) as error:
        make(**options)
    assert str(error.value).startswith(field)


def test_fsdp_and_tensor_parallelism_are_refused_and_compile_is_fine():
    muon = make()
    with pytest.raises(ConfigError, match=r"optim='muon': cannot run under FSDP2.*whole logical matrix"):
        muon.check(sharded=True, tp=1, compile=False)
    with pytest.raises(ConfigError, match=r"optim='muon': cannot run under tensor parallelism \(parallel.tp=2\)"):
        muon.check(sharded=False, tp=2, compile=False)
    assert muon.check(sharded=False, tp=1, compile=True) is None
