"""param=mup (zoo.assembly.mup, zoo.lab.recipe.param): every parameter's role found from shapes at two widths
matches the parts' documented scaling; at the base width μP is the standard model to the bit; away
from it the init, the first update, the logit and score multipliers follow the rules; what it cannot run
is refused before any tensor work; a μP run resumes to the last bit."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers import interrupt, registered, tiny, without_timings
from torch import nn

from zoo import MLPS, ConfigError, LanguageModel, resolve_block
from zoo.assembly import mup
from zoo.lab.planning.plan import plan_run
from zoo.lab.planning.train_config import TrainConfig
from zoo.lab.recipe import Recipe
from zoo.lab.recipe.param import parametrize
from zoo.lab.records.config import config_hash
from zoo.lab.records.metrics import read_metrics
from zoo.lab.training.run import run
from zoo.parts.mlps import MLP
from zoo.testing.combos import block_config, covering_combinations

#: What the parts' docs say grows with block.d_model (docs/mup.md), first match wins: (part label or
#: None for any, parameter suffix, role). d_ff is left at null (grows); set sizes stay fixed.
DOCUMENTED = [
    (None, "embed.weight", "input"),  # the token table: (vocab, d_model)
    (None, "pos_embed.weight", "input"),  # learned positions: (max_len, d_model)
    (None, "head.weight", "readout"),  # the untied LM head: (vocab, d_model)
    (None, ".scale", "fixed"),  # scalenorm's scalar gain
    (None, "mlp.router.weight", "output"),  # MoE router: (n_experts, d_model)
    (None, "mlp.router.bias", "fixed"),  # moe+gated's router bias: (n_experts,)
    (None, "mlp.shared_gate.weight", "output"),  # moe+gated's shared expert gate: (1, d_model)
    ("linear+gated", "attn.gate.weight", "output"),  # one decay gate per head: (n_heads, d_model)
    ("linear+gated", "attn.gate.bias", "fixed"),
    (None, "attn.sink", "fixed"),  # one learned sink logit per head: (n_heads,)
    (None, "attn.value_mix.lambdas", "fixed"),  # value residual's two scalars, on layers after the first
    *((f"{attn}+headgate", suffix, role) for attn in ("mha", "gqa", "mqa", "mla")
      for suffix, role in (("attn.gate.weight", "output"), ("attn.gate.bias", "fixed"))),  # one gate per head
    *((f"{attn}+{variant}", suffix, role) for attn in ("mha", "gqa", "mqa")  # block.attn.head_dim: heads of set width
      for variant in ("headdim", "wide")  # (wide: gated_deltanet's variant, which softmax attention takes too)
      for suffix, role in (("attn.qkv.weight", "output"), ("attn.qkv.bias", "fixed"), ("attn.out.weight", "input"))),
    *((attn, suffix, role) for attn in ("gated_deltanet", "kda") for suffix, role in (
        ("attn.beta.weight", "output"),  # one rate per head: (n_heads, d_model)
        ("attn.beta.bias", "fixed"),
        ("attn.a_log", "fixed"),  # per head
        ("attn.conv", "vector"),  # one 4-tap filter per channel: (channels, 1, 4)
    )),
    ("gated_deltanet", "attn.decay.weight", "output"),  # one decay per head: (n_heads, d_model)
    ("gated_deltanet", "attn.dt", "fixed"),
    *(("mamba2", f"attn.{name}", role) for name, role in (("bc.weight", "output"), ("bc.bias", "fixed"),
      ("step.weight", "output"), ("a_log", "fixed"), ("dt", "fixed"), ("skip", "fixed"), ("conv", "vector"))),
    ("kda", "attn.dt", "vector"),  # one per key channel: (n_heads d_key,); decay.0, decay.1, gate.0, gate.1 through
    # the rank head_dim: hidden
    ("pre+out_conv", ".kernel", "vector"),  # branch-output convolutions: canon layers on d_model channels
    ("pre+canon", ".kernel", "vector"),  # canon layers: one 4-tap filter per channel, (channels, 1, 4), each site
    ("mla+qrank", "attn.q_down.weight", "output"),  # to the set q_rank
    ("mla+qrank", "attn.q_down.bias", "fixed"),
    ("mla+qrank", "attn.q_norm.weight", "fixed"),
    ("mla+qrank", "attn.q_up.weight", "input"),  # from the set q_rank to the heads
    ("rmsnorm+gated", ".gate_in.weight", "output"),  # GatedNorm: to the set gate_rank, (r, d_model)
    ("rmsnorm+gated", ".gate_out.weight", "input"),  # from it, (d_model, r)
    ("bottleneck", "mlp.squeeze.weight", "output"),  # the plugin below: a set rank of 8
    ("bottleneck", "mlp.squeeze.bias", "fixed"),
    ("bottleneck", "mlp.expand.weight", "input"),
    ("bottleneck", "mlp.gain", "fixed"),
    (None, "residual.resid_lambda", "fixed"),  # residual=scaled: one scalar each
    (None, "residual.x0_lambda", "fixed"),
    *((None, f"residual.{name}", "fixed") for name in ("read", "mix", "write", "alpha_scale", "beta_scale")),
    (None, "residual.dynamic_weight", "output"),  # hyper+dynamic: (terms, n + 2, d_model)
    (None, "residual.projection", "output"),  # mhc: (terms, 2 n + n^2, n d_model)
    (None, "residual.base", "fixed"),  # mhc: terms x (2 n + n^2), flat
    (None, ".bias", "vector"),
]


def documented_role(combo: dict[str, str], name: str, ndim: int) -> str:
    """A label names a part with its variants (gated_deltanet: gated_deltanet+grouped too) or one variant."""
    labels = {*combo.values(), *(value.partition("+")[0] for value in combo.values())}
    for label, suffix, role in DOCUMENTED:
        if (label is None or label in labels) and name.endswith(suffix):
            return role
    return "vector" if ndim == 1 else "hidden"  # norm gains and q/k norms; every other matrix


class Bottleneck(MLP):
    """A plugin MLP through a set rank of 8: expand(squeeze(x)) * gain, beside a hidden matrix."""

    def __init__(self, dims) -> None:
        super().__init__(dims)
        self.squeeze, self.expand = nn.Linear(dims.d_model, 8), nn.Linear(8, dims.d_model)
        self.mix = nn.Linear(dims.d_model, dims.d_model, bias=False)
        self.gain = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.expand(self.squeeze(x)) * self.gain + self.mix(x)


def builder(combo: dict[str, str], tie: bool = True):
    return lambda width: LanguageModel(
        resolve_block(block_config(combo, d_ff=None, d_model=width)), 32, 2, tie_embeddings=tie
    )


def covering() -> list[dict[str, str]]:
    rows = [*covering_combinations(), {**covering_combinations()[0], "mlp": "bottleneck"}]
    valid = []
    for combo in rows:
        try:
            with torch.device("meta"):
                builder(combo)(16)
        except ConfigError:  # a pair the compatibility map refuses (linear attention with alibi)
            continue
        valid.append(combo)
    return valid


def test_every_parameter_of_every_covering_combination_scales_as_documented():
    with registered((MLPS, "bottleneck", Bottleneck)):
        combos = covering()
        assert len(combos) > 40 and any(c["mlp"] == "bottleneck" for c in combos)
        for combo in combos:
            for tie in (True, False):
                found = mup.infer(builder(combo, tie), 32, 16)
                model = builder(combo, tie)(32)
                for name, p in model.named_parameters():
                    expected = documented_role(combo, name, p.ndim)
                    assert found.scalings[name].role == expected, (combo, name)
                    fans = found.scalings[name].fan_in, found.scalings[name].fan_out
                    if expected == "hidden" and "mla+ropedim" in combo.values() and "attn.q" in name:
                        assert fans[0] == 2 and 1 < fans[1] < 2  # rows n_heads (d_head + rope_dim): rope_dim stays set
                    elif expected == "hidden":  # both dimensions doubled (GLU widths round: within 10%)
                        assert 1.8 <= fans[0] <= 2 and 1.8 <= fans[1] <= 2


def test_the_base_width_is_the_standard_model_bit_for_bit():
    standard, mu = run(tiny(), None), run(tiny("param=mup", "param.base_width=32"), None)
    assert standard["status"] == mu["status"] == "ok"
    assert mu["final"] == standard["final"]  # every logged number, to the last bit
    assert mu["config_hash"] != standard["config_hash"]


def model_at(width: int, base: int, seed: int = 0, **block) -> tuple[LanguageModel, mup.MuP]:
    combo = {"placement": "pre", "norm": "layernorm", "attn": "mha", "pos": "none", "mlp": "moe", **block}
    build = builder(combo)
    torch.manual_seed(seed)
    found = mup.infer(build, width, base)
    return parametrize(build(width), found), found


def first_update(model: nn.Module, lr: float = 1e-3) -> dict[str, float]:
    """Each parameter's largest first-step AdamW change over the rate (Adam's first step is lr x sign(g))."""
    train = TrainConfig(lr=lr, weight_decay=0.0)
    optimizer = Recipe().build(model, train)
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_ratio", 1.0)  # as the trainer sets it
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.randint(0, 32, (4, 12), generator=torch.Generator().manual_seed(1))
    nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
    optimizer.step()
    return {n: (p.detach() - before[n]).abs().max().item() / lr for n, p in model.named_parameters()}


def expected_first_update(name: str, wide: nn.Module, base: nn.Module) -> float:
    """1 / (growth of the fan-in) for matrices whose fan-in grows (hidden, router), 1 for the rest."""
    now, then = dict(wide.named_parameters())[name].shape, dict(base.named_parameters())[name].shape
    if len(now) < 2 or name == "embed.weight":
        return 1.0
    return then[1] / now[1]


def check_first_update(width: int = 64, base: int = 32) -> None:
    model, _ = model_at(width, base)
    measured = first_update(model)
    base_model, _ = model_at(base, base)
    for name, value in measured.items():
        if value > 0:  # a parameter with a gradient
            assert value == pytest.approx(expected_first_update(name, model, base_model), rel=1e-3), name


def test_the_first_update_follows_the_adamw_rule_and_a_wrong_multiplier_fails(monkeypatch):
    check_first_update()
    monkeypatch.setitem(mup.LR_RULES["adamw"], "hidden", "1")  # planted: hidden matrices at the full rate
    with pytest.raises(AssertionError):
        check_first_update()


def test_init_logit_and_score_multipliers_at_four_times_the_base_width():
    model, found = model_at(64, 16)
    torch.manual_seed(0)
    build = builder({"placement": "pre", "norm": "layernorm", "attn": "mha", "pos": "none", "mlp": "moe"})
    standard, base = dict(build(64).named_parameters()), dict(build(16).named_parameters())
    for name, p in model.named_parameters():
        growth = standard[name].shape[-1] / base[name].shape[-1] if p.ndim == 2 else 1.0  # the fan-in's
        ratio = {"hidden": 1 / math.sqrt(growth), "output": 1 / growth}.get(found.scalings[name].role, 1.0)
        assert torch.equal(p, standard[name] * ratio) if ratio != 1 else torch.equal(p, standard[name]), name
    assert {found.scalings[n].role for n in standard} == {"hidden", "output", "input", "vector"}
    assert model.logit_scale == 0.25
    d_head, d_base = 64 // 4, 16 // 4
    assert model.blocks[0].attn.score_scale == pytest.approx(math.sqrt(d_base) / d_head)


@pytest.mark.parametrize("attn", ["mha", "mla"])
def test_the_score_scale_reaches_the_kernel(attn):
    """Scaling the queries by scale x sqrt(D) under the standard 1 / sqrt(D) gives the μP scores."""
    model, found = model_at(32, 16, attn=attn, mlp="gelu")
    ids = torch.randint(0, 32, (2, 10), generator=torch.Generator().manual_seed(3))
    expected = model(ids)
    unscaled = copy.deepcopy(model)
    for block in unscaled.blocks:
        block.attn.score_scale = None
    assert not torch.allclose(unscaled(ids), expected, atol=1e-6)  # the scale matters here
    for block in model.blocks:
        module = block.attn
        factor = module.score_scale * math.sqrt(mup.score_features(module))
        module.score_scale = None
        with torch.no_grad():
            if attn == "mla":
                module.q.weight.mul_(factor), module.q.bias.mul_(factor)
            else:  # mha's qkv rows: per head, its query, key and value rows in turn
                rows = torch.arange(module.qkv.out_features).reshape(module.n_heads, 3, module.d_head)[:, 0]
                module.qkv.weight[rows.flatten()] *= factor
                module.qkv.bias[rows.flatten()] *= factor
    assert torch.allclose(model(ids), expected, atol=1e-6)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["optim=muon"], "optim.name"),
        (["optim=adafactor"], "optim.name"),
        (["pos=sinusoidal"], "block.pos"),
        (["param.base_width=30"], "param.base_width"),  # 4 heads do not divide 30
        (["task=transduce"], "param.name"),
    ],
)
def test_what_mup_cannot_run_is_refused_by_name_before_tensor_work(overrides, field):
    task = "transduce" if "task=transduce" in overrides else "bytes"
    raw = tiny("param=mup", *[o for o in overrides if not o.startswith("task=")], task=task)
    with pytest.raises(ConfigError) as error:
        plan_run(raw, {})
    assert error.value.field == field


def test_sharded_meshes_and_bad_sections_are_refused():
    with pytest.raises(ConfigError, match="parallel.dp_shard"):
        plan_run(tiny("param=mup", "parallel.dp_shard=2"), {}, world=2)
    with pytest.raises(ConfigError, match="param.base_width"):
        plan_run(tiny("param.base_width=64"), {})  # standard reads no base width
    with pytest.raises(ConfigError, match="param.name"):
        plan_run({**tiny(), "param": {"name": "ntk"}}, {})


def test_standard_leaves_the_config_hash_and_mup_works_with_matching_budgets_and_sgd():
    raw = tiny()
    assert config_hash(raw) == config_hash({k: v for k, v in raw.items() if k != "param"})
    plan = plan_run(tiny("param=mup", "block.d_model=64", "block.mlp.match=params", "optim=sgd"), {})
    roles = {n: s.role for n, s in plan.mup.scalings.items()}
    assert roles["blocks.0.mlp.up.weight"] == roles["blocks.0.mlp.down.weight"] == "hidden"
    assert plan_run(tiny("param=mup", "train.budget.tokens=2000"), {}).mup is not None


def test_a_resumed_mup_run_ends_with_the_uninterrupted_runs_numbers(tmp_path):
    overrides = ("param=mup", "param.base_width=16", "train.checkpoint_every=3", "train.keep_checkpoints=10")
    whole = run(tiny(*overrides), tmp_path / "whole")
    assert whole["status"] == "ok"
    interrupt(tmp_path / "whole", tmp_path / "resumed", 6)
    resumed = run(tiny(*overrides), tmp_path / "resumed")
    assert resumed["resumed_from"] == [6] and resumed["final"] == whole["final"]
    assert without_timings(read_metrics(tmp_path / "resumed")) == without_timings(read_metrics(tmp_path / "whole"))
