"""``optim.lr_ratios``: each named group and glob trains at its ratio times the rate its optimizer gives it, the
decay kept; keys that match nothing, overlap or are not positive numbers are refused by name before any model
is built; a run with them resumes bit for bit."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny
from test_recipe import resumes_bit_identically

from zoo import build_model, compose
from zoo.core.errors import ConfigError
from zoo.lab.planning.train_config import TrainConfig
from zoo.lab.recipe import Recipe
from zoo.lab.recipe.muon import treatments
from zoo.lab.training.run import run

RATIOS = {"embeddings": 0.5, "head": 0.25, "value_embeddings": 2.0, "residual_scalars": 10.0, "matrices": 0.1}


def nanochat_like() -> torch.nn.Module:
    torch.manual_seed(0)
    sizes = ["block.d_model=16", "block.n_heads=2", "model.n_layers=2", "model.vocab_size=32"]
    nanochat = ["model.value_embeddings=true", "model.tie_embeddings=false", "residual=scaled"]
    return build_model(compose([*sizes, *nanochat]))


def group_of(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> dict[str, dict]:
    by_id = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    return {name: by_id[id(p)] for name, p in model.named_parameters()}


def expected_ratio(name: str, matrices: set[str]) -> float:
    if name.startswith("embed."):
        return 0.5
    if name.startswith("head."):
        return 0.25
    if name.startswith("value_embeds."):
        return 2.0
    if ".residual." in name:
        return 10.0
    return 0.1 if name in matrices else 1.0


@pytest.mark.parametrize("optim", ["adamw", "muon"])
def test_each_named_group_trains_at_its_ratio_times_its_optimizers_rate_with_its_decay_kept(optim):
    model = nanochat_like()
    train = TrainConfig(lr=0.01, weight_decay=0.1)
    plain = group_of(Recipe(optim={"name": optim}).build(model, train), model)
    optimizer = Recipe(optim={"name": optim, "lr_ratios": RATIOS}).build(model, train)
    grouped = group_of(optimizer, model)
    matrices = {n for n, how in treatments(model).items() if how.kind != "adamw"}  # Muon's hidden matrices
    assert any(".residual." in n for n in grouped) and any(n.startswith("value_embeds.") for n in grouped)
    for name, group in grouped.items():
        ratio = expected_ratio(name, matrices)
        assert group.get("lr_ratio", 1.0) == pytest.approx(plain[name].get("lr_ratio", 1.0) * ratio), name
        assert group["lr"] == pytest.approx(plain[name]["lr"] * ratio), name
        assert group["weight_decay"] == plain[name]["weight_decay"], name


def test_a_zero_rate_on_muons_matrices_after_the_split_leaves_them_where_they_were():
    """The split groups reach Muon's inner optimizers: matrices at lr 0 do not move, the rest does."""
    model = nanochat_like()
    optimizer = Recipe(optim={"name": "muon", "lr_ratios": {"matrices": 0.5}}).build(model, TrainConfig(lr=0.02))
    for group in optimizer.param_groups:
        group["lr"] = 0.0 if group["lr_ratio"] == 0.5 else 0.02
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert "embed.weight" in moved and not any(n.endswith(("qkv.weight", "out.weight", "down.weight")) for n in moved)


def test_a_glob_over_parameter_names_sets_the_rate_of_what_it_matches():
    model = nanochat_like()
    optimizer = Recipe(optim={"name": "adamw", "lr_ratios": {"blocks.*.attn.*": 3}}).build(model, TrainConfig(lr=0.01))
    for name, group in group_of(optimizer, model).items():
        assert group.get("lr_ratio", 1.0) == (3.0 if ".attn." in name else 1.0), name


@pytest.mark.parametrize(
    ("ratios", "message"),
    [
        ({"mlp.*": 2}, "optim.lr_ratios.mlp.*=2.0: matches no parameter of this model; a named group"),
        ({"head": 2}, "optim.lr_ratios.head=2.0: matches no parameter of this model (the head is the embedding"),
        ({"matrices": 2, "blocks.0.*": 3}, "matches blocks.0."),
        ({"embeddings": 0}, "optim.lr_ratios.embeddings=0: must be a number > 0"),
        ({"embeddings": "fast"}, "optim.lr_ratios.embeddings='fast': must be a number > 0"),
    ],
)
def test_bad_ratios_are_refused_by_key_before_any_model_is_built(tmp_path, ratios, message):
    summary = run({**tiny("optim=adamw"), "optim": {"name": "adamw", "lr_ratios": ratios}}, tmp_path)
    assert summary["status"] == "failed" and message in summary["error"], summary["error"]
    assert "parameters" not in summary


def test_a_mapping_is_required():
    with pytest.raises(ConfigError, match=r"optim.lr_ratios=0.5: a mapping"):
        Recipe(optim={"name": "adamw", "lr_ratios": 0.5}).optimizer_entry(TrainConfig())


def test_a_run_with_group_rates_resumes_to_the_last_bit(tmp_path):
    resumes_bit_identically(tmp_path, "optim=muon", "train.lr=0.2", "optim.lr_ratios={embeddings: 0.5, matrices: 2}")
