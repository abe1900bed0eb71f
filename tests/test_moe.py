"""mlp=moe: gradients once routed, bfloat16 where the routing agrees, the auxiliary losses computed
independently, option errors, and matching by total or active parameters. (The fast path against a
per-token loop is in test_reference.py; the contract suite covers every combination.)"""

from __future__ import annotations

import pytest
import torch

from zoo import ConfigError, build_block, check_combination, param_report
from zoo.core.auxiliary import collect_aux
from zoo.parts.moe import MoE, route
from zoo.testing.combos import TINY

D = TINY["d_model"]


def moe(**options) -> MoE:
    cfg = {
        **TINY,
        "placement": "pre",
        "norm": "rmsnorm",
        "attn": "mha",
        "pos": "none",
        "mlp": {"name": "moe", **options},
    }
    return build_block(cfg).mlp.double()


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"routing": "sigmoid", "n_shared": 1, "expert": "gelu"},
        {"n_shared": 1, "shared_gate": True, "router_bias": True, "normalize": False, "expert": "clamped_swiglu"},
        {"routing": "sigmoid", "n_groups": 2, "top_groups": 1, "routed_scaling_factor": 2.5},
    ],
)
def test_every_expert_the_router_and_the_shared_expert_get_gradients_once_routed_to(options):
    layer = moe(n_experts=4, **options)
    x = torch.randn(4, 16, D, dtype=torch.float64, requires_grad=True)
    (layer(x) * torch.randn_like(x)).sum().backward()
    assert bool((layer.last_counts > 0).all()), "the batch should reach every expert"
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_an_expert_no_token_reaches_gets_no_gradient_and_changes_nothing():
    layer = moe(n_experts=4, top_k=1)
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0] = 1.0  # a router that prefers expert 0 for inputs with a positive sum
    x = torch.rand(2, 5, D, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    assert layer.last_counts.tolist() == [10, 0, 0, 0]
    torch.testing.assert_close(y, layer.experts[0](x))  # top_k = 1: the weight renormalizes to 1
    y.sum().backward()
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in layer.experts[1].parameters())


def test_bfloat16_is_close_wherever_the_routing_is_the_same():
    layer = moe().float()
    x = torch.randn(8, 16, D)
    reference = layer(x)
    chosen32 = layer.router(x).topk(2).indices.sort(-1).values
    low = layer.bfloat16()(x.bfloat16()).float()
    chosen16 = layer.router(x.bfloat16()).float().topk(2).indices.sort(-1).values
    same = (chosen32 == chosen16).all(-1)
    assert same.float().mean() > 0.8
    error = (low - reference)[same].norm() / reference[same].norm()
    assert error < 0.02, f"bfloat16 relative error {error:.3f} where the routing agrees"


@pytest.mark.parametrize("routing", ["softmax", "sigmoid"])
def test_aux_losses_equal_the_switch_balance_and_the_z_loss(routing):
    layer = moe(n_experts=4, routing=routing).train()
    x = torch.randn(3, 7, D, dtype=torch.float64)
    layer(x)
    aux = collect_aux(layer)
    logits = x.reshape(-1, D) @ layer.router.weight.T
    scores = logits.softmax(-1) if routing == "softmax" else logits.sigmoid()
    probs = scores / scores.sum(-1, keepdim=True)
    top = scores.topk(2).indices
    fraction = torch.stack([(top == e).sum() for e in range(4)]).double() / top.numel()
    torch.testing.assert_close(aux["balance"], 4 * (fraction * probs.mean(0)).sum())
    torch.testing.assert_close(aux["router_z"], torch.logsumexp(logits, -1).square().mean())
    with torch.no_grad():  # a uniform router: perfectly balanced probabilities give balance = 1
        layer.router.weight.zero_()
    layer(x)
    torch.testing.assert_close(collect_aux(layer)["balance"], torch.tensor(1.0, dtype=torch.float64))


def test_the_balance_loss_trains_the_router_toward_balance():
    layer = moe(n_experts=4).train()
    with torch.no_grad():
        layer.router.weight[0] += 3 * torch.ones(D)  # most tokens prefer expert 0
    x = torch.rand(4, 16, D, dtype=torch.float64)
    optimizer = torch.optim.SGD(layer.router.parameters(), lr=0.5)
    first = None
    for _ in range(20):
        layer(x)
        balance = collect_aux(layer)["balance"]
        first = balance.item() if first is None else first
        optimizer.zero_grad()
        balance.backward()
        optimizer.step()
    layer(x)
    assert collect_aux(layer)["balance"].item() < first


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"top_k": 9}, "block.mlp.top_k=9: must be in 1..n_experts=8"),
        ({"n_experts": 0}, "block.mlp.n_experts=0: must be a positive integer"),
        ({"expert": "moe"}, "block.mlp.expert='moe': a registered dense MLP: gelu"),
        ({"n_shared": -1}, "block.mlp.n_shared=-1: must be >= 0"),
        ({"routing": "relu"}, "block.mlp.routing='relu': must be one of 'softmax', 'sigmoid'"),
        ({"routed_scaling_factor": 0.0}, "block.mlp.routed_scaling_factor=0.0: must be > 0"),
        ({"n_groups": 3}, "block.mlp.n_groups=3: must divide block.mlp.n_experts=8"),
        ({"n_groups": 4, "top_groups": 5}, "block.mlp.top_groups=5: must be in 1..n_groups=4"),
        ({"n_groups": 4, "top_groups": 1, "top_k": 3}, "block.mlp.top_k=3: must be at most the 2 experts of the"),
        ({"shared_gate": True}, "block.mlp.shared_gate=True: needs a shared expert (block.mlp.n_shared >= 1)"),
        ({"normalize": "yes"}, "block.mlp.normalize='yes'"),
    ],
)
def test_bad_options_are_refused_naming_the_field(options, message):
    cfg = {
        **TINY,
        "placement": "pre",
        "norm": "rmsnorm",
        "attn": "mha",
        "pos": "none",
        "mlp": {"name": "moe", **options},
    }
    assert message in check_combination(cfg)
    with pytest.raises(ConfigError, match="block.mlp"):
        build_block(cfg)


BASE = {"d_model": 64, "n_heads": 8, "placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "rotary"}


@pytest.mark.parametrize("match", ["params", "active_params"])
def test_match_by_total_or_active_parameters(match):
    cfg = {**BASE, "mlp": {"name": "moe", "n_shared": 1, "match": match, "match_mlp": "swiglu"}}
    report = param_report(cfg)
    dense = param_report({**BASE, "mlp": "swiglu"})
    assert dense["active_params"] == dense["block_params"]  # a dense block: every parameter is active
    assert report["reference_params"] == dense["block_params"]
    block = build_block(cfg)
    layer = block.mlp
    per_expert = sum(p.numel() for p in layer.experts[0].parameters())
    shared = sum(p.numel() for p in layer.shared.parameters())
    active = (
        report["block_params"]
        - sum(p.numel() for p in layer.parameters())
        + layer.router.weight.numel()
        + 2 * per_expert
    )
    assert report["active_params"] == active + shared
    matched = report["block_params"] if match == "params" else report["active_params"]
    slope = (8 if match == "params" else 2) * 3 * 64 + 3 * 64  # one more unit per expert (and shared unit)
    assert abs(matched - dense["block_params"]) <= slope / 2
    assert report["active_params"] < report["block_params"]


def test_active_parameters_count_the_router_bias_and_the_shared_gate():
    """A token uses the router (with its bias), top_k experts, the shared expert and its gate."""
    layer = moe(n_shared=1, shared_gate=True, router_bias=True)
    per_expert = sum(p.numel() for p in layer.experts[0].parameters())
    shared = sum(p.numel() for p in layer.shared.parameters())
    assert layer.active_parameters() == 8 * D + 8 + 2 * per_expert + shared + D


def test_group_limited_routing_chooses_only_in_the_groups_whose_two_best_scores_sum_highest():
    """By hand: groups (0, 1), (2, 3), (4, 5); the second group's best pair sums highest though expert 4 alone
    scores highest; one group kept, so both choices lie in it."""
    scores = torch.tensor([[0.50, 0.52, 0.90, 0.88, 0.95, 0.01]])
    logits = scores.logit()
    _, chosen, _ = route(logits, 2, "sigmoid", groups=(3, 1))
    assert sorted(chosen[0].tolist()) == [2, 3]
    _, chosen, _ = route(logits, 2, "sigmoid")  # no groups: the top two anywhere
    assert sorted(chosen[0].tolist()) == [2, 4]
    weights, _, _ = route(logits, 2, "sigmoid", groups=(3, 1), normalize=False)  # the sigmoids themselves
    torch.testing.assert_close(weights.sort().values, torch.tensor([[0.88, 0.90]]))


def test_the_routing_options_at_their_defaults_leave_config_hashes_as_they_were():
    """normalize, routed_scaling_factor, n_groups, top_groups, router_bias and shared_gate are out of the hash at
    their defaults (hashes recorded before they existed); set, each is a new run."""
    from helpers import tiny

    from zoo.lab.records.config import config_hash

    digest = "df3c064098a29560"
    assert config_hash(tiny("mlp=moe")) == digest
    changed = ["normalize=false", "routed_scaling_factor=2.5", "n_groups=2", "router_bias=true"]
    hashes = {config_hash(tiny("mlp=moe", f"block.mlp.{key}")) for key in changed}
    hashes.add(config_hash(tiny("mlp=moe", "block.mlp.n_shared=1", "block.mlp.shared_gate=true")))
    assert len(hashes | {digest}) == 6


def test_a_moe_run_logs_its_aux_losses_and_routing_and_the_report_plots_it(tmp_path):
    from helpers import tiny

    from zoo.lab.records.metrics import read_metrics
    from zoo.lab.reports.report import write_report
    from zoo.lab.training.run import run

    options = ["mlp=moe", "block.mlp.n_experts=4", "train.steps=4", "train.log_every=2"]
    summary = run(tiny(*options), tmp_path / "mlp=moe")
    assert summary["status"] == "ok", summary["error"]
    assert set(summary["routing"]) == {"blocks.0.mlp", "blocks.1.mlp"}
    for fractions in summary["routing"].values():
        assert len(fractions) == 4 and sum(fractions) == pytest.approx(1.0) and min(fractions) >= 0
    assert summary["active_parameters"] < summary["parameters"]["total"]
    logged = [r for r in read_metrics(tmp_path / "mlp=moe") if r["kind"] == "train"]
    assert all(r["aux_balance"] > 0 and r["aux_router_z"] > 0 for r in logged)
    write_report(tmp_path)
    assert (tmp_path / "routing.png").stat().st_size > 0


def test_sigmoid_routing_stays_finite_when_every_logit_is_far_below_zero():
    logits = torch.tensor([[-200.0, -300.0, -250.0, -400.0]], requires_grad=True)  # every sigmoid underflows to 0
    weights, chosen, probs = route(logits, 2, "sigmoid")
    assert torch.isfinite(weights).all() and torch.isfinite(probs).all(), (weights, probs)
    assert chosen.tolist() == [[0, 2]]
    torch.testing.assert_close(weights.sum(-1), torch.ones(1))
    torch.testing.assert_close(probs.sum(-1), torch.ones(1))
    (weights[0, 0] + probs[0, 1]).backward()
    assert torch.isfinite(logits.grad).all(), logits.grad
    ordinary = torch.randn(5, 4)  # where nothing underflows: the top-k sigmoid scores over their sum, as before
    weights, chosen, probs = route(ordinary, 2, "sigmoid")
    scores = ordinary.sigmoid()
    top = scores.gather(-1, chosen)
    torch.testing.assert_close(weights, top / top.sum(-1, keepdim=True))
    torch.testing.assert_close(probs, scores / scores.sum(-1, keepdim=True))


# block.mlp.balance=bias: DeepSeek-V3's auxiliary-loss-free balancing (arXiv:2412.19437 §2.1.2).


@pytest.mark.parametrize("routing", ["softmax", "sigmoid"])
def test_the_bias_changes_the_choice_but_not_the_gate_values(routing):
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=torch.float64)
    scores = logits.softmax(-1) if routing == "softmax" else logits.sigmoid()
    bias = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)  # lifts expert 3 above expert 1
    weights, chosen, probs = route(logits, 2, routing)
    assert chosen.tolist() == [[0, 1]]
    biased_weights, biased_chosen, biased_probs = route(logits, 2, routing, bias)
    assert biased_chosen.tolist() == [[3, 0]]  # 3's biased score first, then 0's
    by_hand = torch.stack([scores[0, 3], scores[0, 0]]) / (scores[0, 3] + scores[0, 0])
    torch.testing.assert_close(biased_weights[0], by_hand)  # the unbiased scores of the chosen, normalized
    torch.testing.assert_close(biased_probs, probs)  # what the balance measure reads: unbiased


@pytest.mark.parametrize("routing", ["softmax", "sigmoid"])
def test_a_biased_layer_outputs_the_unbiased_gates_times_the_chosen_experts(routing):
    layer = moe(n_experts=4, top_k=2, routing=routing, balance="bias")
    with torch.no_grad():
        layer.expert_bias.copy_(torch.tensor([0.0, -5.0, 0.0, 5.0]))  # expert 3 always in, expert 1 never
    x = torch.randn(2, 3, D, dtype=torch.float64)
    y = layer(x)
    logits = x.reshape(-1, D) @ layer.router.weight.T
    scores = logits.softmax(-1) if routing == "softmax" else logits.sigmoid()
    other = torch.where(scores[:, 0] > scores[:, 2], 0, 2)  # the better of 0 and 2 joins expert 3
    flat = x.reshape(-1, D)
    for i in range(flat.shape[0]):
        pair = [3, int(other[i])]
        gates = scores[i, pair] / scores[i, pair].sum()
        expected = sum(g * layer.experts[e](flat[i]) for g, e in zip(gates, pair, strict=True))
        torch.testing.assert_close(y.reshape(-1, D)[i], expected)
    assert layer.last_counts.tolist()[1] == 0 and layer.last_counts.tolist()[3] == 6


def test_the_bias_is_a_buffer_saved_with_the_weights_never_a_parameter():
    biased, plain = moe(n_experts=4, balance="bias"), moe(n_experts=4)
    assert dict(biased.named_buffers())["expert_bias"].tolist() == [0.0] * 4  # starts at zero
    assert "expert_bias" in biased.state_dict() and "expert_bias" not in plain.state_dict()  # old weights load
    assert [n for n, _ in biased.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert param_report({**BASE, "mlp": {"name": "moe", "balance": "bias"}}) == param_report(
        {**BASE, "mlp": {"name": "moe"}}
    )
    from helpers import tiny

    from zoo.lab.recipe.param import infer_for

    biased_mup = infer_for(tiny("mlp=moe", "block.mlp.balance=bias"), 16)
    assert biased_mup == infer_for(tiny("mlp=moe"), 16)  # μP: the same parameters, the same roles


def test_the_nudge_is_the_rate_times_the_sign_of_mean_load_less_load_after_each_step():
    layer = moe(n_experts=4, top_k=1, balance="bias", bias_rate=0.25).train()
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0] = 1.0  # positive inputs all prefer expert 0
    x = torch.rand(2, 5, D, dtype=torch.float64)
    layer.after_step()  # no training forward yet: nothing to nudge by
    assert layer.expert_bias.tolist() == [0.0] * 4
    with torch.no_grad():
        layer(x)  # no gradients: not a training step's forward
    layer.eval()
    layer(x)  # nor an evaluation's
    layer.after_step()
    assert layer.expert_bias.tolist() == [0.0] * 4
    layer.train()
    layer(x)
    assert layer.last_counts.tolist() == [10, 0, 0, 0]  # mean load 2.5
    layer.after_step()
    assert layer.expert_bias.tolist() == [-0.25, 0.25, 0.25, 0.25]
    layer.after_step()  # the load is consumed: a second call without a forward changes nothing
    assert layer.expert_bias.tolist() == [-0.25, 0.25, 0.25, 0.25]


@pytest.mark.parametrize("routing", ["softmax", "sigmoid"])
def test_the_nudge_moves_a_skewed_routers_load_toward_balance_without_touching_its_weights(routing):
    torch.manual_seed(0)
    layer = moe(n_experts=4, top_k=2, routing=routing, balance="bias", bias_rate=0.01).train()
    with torch.no_grad():
        layer.router.weight[0] += 0.1 * torch.ones(D)  # tokens (mean 0.5 per feature) prefer expert 0
    router = layer.router.weight.detach().clone()
    batches = torch.Generator().manual_seed(0)
    imbalance = []  # per step: the busiest expert's load over the mean (1: balanced; 2: expert 0 takes every token)
    for _ in range(100):
        layer(torch.randn(4, 16, D, dtype=torch.float64, generator=batches) + 0.5)  # a fresh batch each step
        imbalance.append((layer.last_counts.max() / layer.last_counts.double().mean()).item())
        layer.after_step()
    first, last = sum(imbalance[:5]) / 5, sum(imbalance[-20:]) / 20
    assert first > 1.6 and last < 1.3, (first, last)
    assert layer.expert_bias[0] < 0 < layer.expert_bias[1:].min()  # the busy expert down, the others up
    assert torch.equal(layer.router.weight, router)


def test_under_bias_the_balance_measure_is_logged_but_trains_nothing():
    layer = moe(n_experts=4, balance="bias").train()
    layer(torch.randn(3, 7, D, dtype=torch.float64))
    aux = collect_aux(layer)
    assert aux["balance"] > 0 and not aux["balance"].requires_grad
    assert aux["router_z"].requires_grad  # the z-loss still trains the router


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"balance": "aux"}, "block.mlp.balance='aux': must be one of 'loss', 'bias'"),
        ({"balance": "bias", "bias_rate": 0.0}, "block.mlp.bias_rate=0.0: must be > 0"),
        ({"balance": "bias", "bias_rate": -0.001}, "block.mlp.bias_rate=-0.001: must be > 0"),
        ({"bias_rate": 0.01}, "block.mlp.bias_rate=0.01: moves the bias of balance=bias only (balance=loss here, "
                              "where it would do nothing): set block.mlp.balance=bias, or leave it at 0.001"),
    ],
)
def test_bad_balance_options_are_refused_naming_the_field(options, message):
    cfg = {**BASE, "mlp": {"name": "moe", **options}}
    assert message in check_combination(cfg)
    default = {"name": "moe", "balance": "loss", "bias_rate": 0.001}
    assert check_combination({**BASE, "mlp": default}) is None


def test_balance_loss_leaves_existing_config_hashes_as_they_were():
    """block.mlp.balance and bias_rate at their defaults are out of the hash: the hashes below were
    computed before the option file had these keys; balance=bias is a new run."""
    from helpers import tiny

    from zoo.lab.records.config import config_hash

    recorded = {("mlp=moe",): "df3c064098a29560",
                ("mlp=moe", "block.mlp.routing=sigmoid", "block.mlp.n_shared=1"): "eeef1c7b47d82667"}  # fmt: skip
    for overrides, digest in recorded.items():
        config = tiny(*overrides)
        assert {"balance": "loss", "bias_rate": 0.001}.items() <= config["block"]["mlp"].items()
        assert config_hash(config) == digest, overrides
        assert config_hash(tiny(*overrides, "block.mlp.balance=loss")) == digest, overrides
    assert config_hash(tiny("mlp=moe", "block.mlp.balance=bias")) != recorded[("mlp=moe",)]


def test_a_moe_run_balanced_by_bias_moves_the_bias_and_records_it_in_its_weights(tmp_path):
    from helpers import tiny
    from safetensors.torch import load_file

    from zoo.lab.records import checkpoint as ckpt
    from zoo.lab.records.metrics import read_metrics
    from zoo.lab.training.run import run

    options = ["mlp=moe", "block.mlp.n_experts=4", "block.mlp.balance=bias", "train.steps=4", "train.log_every=2"]
    summary = run(tiny(*options), tmp_path)
    assert summary["status"] == "ok", summary["error"]
    weights = load_file(tmp_path / ckpt.WEIGHTS)
    for layer in ("blocks.0.mlp", "blocks.1.mlp"):
        bias = weights[f"{layer}.expert_bias"]
        assert bias.abs().sum() > 0  # nudged by each of the 4 steps
        steps = bias / 0.001  # each step moves each expert by exactly +-bias_rate
        torch.testing.assert_close(steps, steps.round(), atol=1e-3, rtol=0)
        assert steps.abs().max() <= 4
    logged = [r for r in read_metrics(tmp_path) if r["kind"] == "train"]
    assert all(r["aux_balance"] > 0 for r in logged)


def test_a_bias_balanced_run_resumed_from_its_checkpoint_equals_the_uninterrupted_one(tmp_path):
    """The bias is state: killed after step 3 and run again, the run ends with the uninterrupted run's metrics
    and weights (a bias left out of the checkpoint would route steps 4 to 8 otherwise). Step 3: this tiny
    router's bias flips between 0 and +-bias_rate, so an even step's checkpoint could hold zeros."""
    from helpers import tiny
    from safetensors.torch import load_file
    from test_run_contract import check_resume

    from zoo.lab.training.run import run

    options = ["mlp=moe", "block.mlp.n_experts=4", "block.mlp.balance=bias", "block.mlp.bias_rate=0.05"]
    config = tiny(*options, "train.steps=8", "train.checkpoint_every=3", "train.keep_checkpoints=10")
    whole = run(config, tmp_path / "whole")
    assert whole["status"] == "ok", whole["error"]
    saved = load_file(tmp_path / "whole" / "checkpoints" / "step_000003" / "model.safetensors")
    assert all(saved[f"blocks.{i}.mlp.expert_bias"].abs().sum() > 0 for i in (0, 1))  # a bias to lose
    check_resume(tmp_path / "whole", config, 3, tmp_path / "scratch")
