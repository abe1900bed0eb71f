"""The training recipe as an axis: every registered optimizer and schedule (``optim=``, ``schedule=``)
trains, resumes to the last bit, groups its parameters as declared, follows its formula and refuses bad
options before any tensor work; the default recipe (and z-loss 0) changes nothing; the z-loss is what it says."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import interrupt, tiny, without_timings

from zoo import ConfigError, build_model, compose
from zoo.lab.commands.argv import check_overrides
from zoo.lab.commands.catalogue import LISTED, print_parts
from zoo.lab.planning.train_config import TrainConfig
from zoo.lab.recipe import OPTIMIZERS, SCHEDULES, Optimizer, Recipe, lr_at
from zoo.lab.records.checkpoint import WEIGHTS
from zoo.lab.records.config import config_hash
from zoo.lab.records.metrics import read_metrics
from zoo.lab.tasks import IGNORE, Batch
from zoo.lab.training.run import run
from zoo.lab.training.step import Stepper, loss_fn, z_loss_fn

# Checkpoints between log steps, dropout on: what a resume must restore (as tests/test_checkpoint.py).
RESUMABLE = ("train.checkpoint_every=3", "train.keep_checkpoints=10", "block.dropout=0.1")
OPTIMS = OPTIMIZERS.names()
SCHEDS = SCHEDULES.names()
#: A rate each optimizer trains the tiny model at (train.lr means another thing to each: Adafactor scales it by
#: each parameter's RMS, SGD takes the gradient as the step).
LR = {"sgd": 0.3, "adafactor": 0.3, "muon": 0.2, "normuon": 0.2, "muonh": 0.2, "adamh": 0.2}  # muon: an orthogonal
# update at d_model 32 moves each weight ~0.2 x lr; muonh, adamh: each step moves a hidden matrix by lr of its norm


def small_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = compose(["preset=gpt", "block.d_model=16", "block.n_heads=2", "model.n_layers=1", "model.vocab_size=32",
                   "model.tie_embeddings=false"])  # fmt: skip
    return build_model(cfg)


def fixed_batch(vocab: int = 32, seed: int = 1) -> Batch:
    tokens = torch.randint(0, vocab, (4, 17), generator=torch.Generator().manual_seed(seed))
    return Batch(tokens[:, :-1], tokens[:, 1:])


# --- Wiring: the config groups, the plan's checks, the hash, zoo-parts ---------------------------------------


def test_the_default_recipe_is_adamw_and_cosine_and_leaves_the_config_hash_as_it_was():
    cfg = tiny()
    assert cfg["optim"]["name"] == "adamw" and cfg["schedule"] == {"name": "cosine"} and cfg["train"]["z_loss"] == 0
    before = {k: v for k, v in cfg.items() if k not in ("optim", "schedule")}  # a config from before the recipe
    before["train"] = {k: v for k, v in cfg["train"].items() if k != "z_loss"}
    assert config_hash(cfg) == config_hash(before)
    assert config_hash(tiny("optim.eps=1e-8")) == config_hash(before)  # the default's own value, spelt out
    changed = [tiny("optim=sgd"), tiny("optim.eps=1e-6"), tiny("schedule=wsd"), tiny("train.z_loss=1e-4")]
    assert len({config_hash(c) for c in [before, *changed]}) == 5


def test_a_run_of_the_default_recipe_is_the_run_of_make_optimizer_and_lr_at(tmp_path):
    """The recipe's default optimizer and rates are make_optimizer's and TrainConfig.lr_at's."""
    train = TrainConfig(steps=30, lr=0.02, warmup_steps=5)
    schedule = Recipe().schedule_entry()
    assert [lr_at(schedule, s, train) for s in range(30)] == [train.lr_at(s) for s in range(30)]
    optimizer = Recipe().build(small_model(), train)
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["betas"] == (0.9, 0.95)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("optim=sgd", "optim.momentum=1.5"), "optim.momentum=1.5: must be in [0, 1)"),
        (("optim=sgd", "optim.momentum=0", "optim.nesterov=true"), "optim.nesterov=True: needs optim.momentum > 0"),
        (("optim=sgd", "optim.momentum=fast"), "optim.momentum='fast': must be float"),
        (("+optim.beta1=0.8",), "optim.beta1=0.8: optim=adamw reads train.beta1: set that instead"),
        (("optim=adafactor", "optim.beta2_decay=0.5"), "optim.beta2_decay=0.5: must be <= 0"),
        (("schedule=wsd", "train.warmup_steps=11"), "train.warmup_steps=11: must be at most 10 for schedule=wsd"),
        (("schedule=linear", "train.warmup_steps=13"), "train.warmup_steps=13: must be at most 12 for schedule="),
        (("schedule=wsd", "schedule.shape=sqrt"), "schedule.shape='sqrt': must be one of 'linear', 'cosine', '1-sqrt'"),
        (("schedule=wsd", "schedule.decay_fraction=0"), "schedule.decay_fraction=0.0: must be in (0, 1]"),
        (("train.z_loss=-1",), "train.z_loss=-1.0: must be >= 0"),
    ],
)
def test_bad_options_fail_before_any_tensor_work_naming_field_value_and_what_is_allowed(tmp_path, overrides, message):
    summary = run(tiny(*overrides), tmp_path)
    assert summary["status"] == "failed" and message in summary["error"], summary["error"]
    assert "parameters" not in summary  # no model was built


def test_a_schedule_is_checked_against_the_steps_a_budget_sets(tmp_path):
    """train.budget.tokens=256 at 4 x 32 tokens a step sets 2 steps: wsd's decay starts at step 1, before
    the 3 warmup steps end; refused before training."""
    summary = run(tiny("schedule=wsd", "train.budget.tokens=256"), tmp_path)
    assert summary["status"] == "failed" and "steps" not in summary
    assert "train.warmup_steps=3: must be at most 1 for schedule=wsd" in summary["error"], summary["error"]


@pytest.mark.parametrize(("kind", "name", "close"), [("optim", "adamx", "adamw"), ("schedule", "cosin", "cosine")])
def test_an_unknown_optimizer_or_schedule_is_named_with_the_closest(tmp_path, kind, name, close):
    summary = run({**tiny(), kind: {"name": name}}, tmp_path)
    assert summary["status"] == "failed" and "parameters" not in summary
    assert f"{kind}.name={name!r}: unknown {kind}; did you mean {close!r}?" in summary["error"]
    with pytest.raises(ConfigError, match=f"did you mean {close!r}"):
        check_overrides([f"{kind}={name}"])  # the command line's check, before Hydra


def test_adafactor_is_refused_where_it_would_factor_a_shard():
    recipe = Recipe(optim={"name": "adafactor"})
    with pytest.raises(ConfigError, match=r"parallel\.tp=2: optim=adafactor factors each whole matrix"):
        recipe.check(TrainConfig(), sharded=True, tp=2)
    with pytest.raises(ConfigError, match=r"parallel\.dp_shard="):
        recipe.check(TrainConfig(), sharded=True, tp=1)
    recipe.check(TrainConfig(), sharded=False, tp=1)


def test_zoo_parts_lists_the_optimizers_and_schedules_with_their_options(capsys):
    assert LISTED["optim"] is OPTIMIZERS and LISTED["schedule"] is SCHEDULES
    print_parts()
    out = capsys.readouterr().out
    optim = out.split("\noptim:\n")[1].split("\nschedule:\n")[0]
    assert all(f"  {name} " in optim for name in OPTIMS)
    assert "beta1=train.beta1" in optim and "momentum=0.9" in optim and "eps2=0.001" in optim
    assert "decay_fraction=0.2, shape=1-sqrt" in out.split("\nschedule:\n")[1]


# --- Every optimizer x schedule -------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", SCHEDS)
@pytest.mark.parametrize("optim", OPTIMS)
def test_the_loss_falls_on_a_fixed_batch(optim, schedule):
    model, batch = small_model(), fixed_batch()
    train = TrainConfig(steps=25, lr=LR.get(optim, 1e-2), warmup_steps=2, weight_decay=0.01)
    recipe = Recipe(optim={"name": optim}, schedule={"name": schedule})
    recipe.check(train)
    rate = recipe.schedule_entry()
    optimizer = recipe.build(model, train)
    step = Stepper(model, model, optimizer, torch.device("cpu"), grad_clip=1.0)
    losses = []
    for s in range(train.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(rate, s, train) * group.get("lr_ratio", 1.0)
        losses.append(step(batch)[0].item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0] - 0.5, losses


@pytest.mark.parametrize("optim", OPTIMS)
def test_every_parameter_is_in_exactly_one_group_and_no_bias_or_gain_decays(optim):
    """The groups cover the parameters once each; with every gradient zero, a step leaves every bias
    and norm gain where it was (only decay could move a parameter) and shrinks the decayed matrices."""
    model = small_model()
    optimizer = Recipe(optim={"name": optim}).build(model, TrainConfig(lr=0.05, weight_decay=0.1))
    grouped = [id(p) for g in optimizer.param_groups for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters()) and len(grouped) == len(set(grouped))
    norms = {name for name, module in model.named_modules() if "norm" in type(module).__name__.lower()}
    gains = {n for n, _ in model.named_parameters() if n.endswith(".bias") or n.rsplit(".", 1)[0] in norms}
    assert any(".norm" in n for n in gains) and any(n.endswith(".bias") for n in gains)
    by_id = {id(p): n for n, p in model.named_parameters()}
    decayed = {by_id[id(p)] for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed and not decayed & gains
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert not moved & gains and moved == decayed


def resumes_bit_identically(tmp_path, *overrides: str) -> None:
    whole = run(tiny(*RESUMABLE, *overrides), tmp_path / "whole")
    assert whole["status"] == "ok", whole["error"]
    interrupt(tmp_path / "whole", tmp_path / "resumed", 6)
    resumed = run(tiny(*RESUMABLE, *overrides), tmp_path / "resumed")
    assert resumed["status"] == "ok" and resumed["resumed_from"] == [6]
    assert resumed["final"] == whole["final"]
    assert without_timings(read_metrics(tmp_path / "resumed")) == without_timings(read_metrics(tmp_path / "whole"))
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "whole" / WEIGHTS), load_file(tmp_path / "resumed" / WEIGHTS)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("optim", OPTIMS)
def test_each_optimizer_resumes_from_a_checkpoint_to_the_last_bit(tmp_path, optim):
    resumes_bit_identically(tmp_path, f"optim={optim}", f"train.lr={LR.get(optim, 3e-3)}")


@pytest.mark.parametrize("schedule", [s for s in SCHEDS if s != "cosine"])  # cosine: tests/test_checkpoint.py
def test_each_schedule_resumes_from_a_checkpoint_to_the_last_bit(tmp_path, schedule):
    resumes_bit_identically(tmp_path, f"schedule={schedule}")


class Probe(torch.optim.SGD):
    """SGD that records each step's group rates."""

    seen: list[list[float]] = []

    def step(self, closure: None = None) -> None:
        Probe.seen.append([g["lr"] for g in self.param_groups])
        return super().step(closure)


class RatioProbe(Optimizer):
    """Two groups at 0.5 and 2 times the main rate (and one without a ratio: 1)."""

    def build(self, model: torch.nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        params = list(model.parameters())
        groups = [{"params": params[:1], "lr_ratio": 0.5}, {"params": params[1:2], "lr_ratio": 2.0},
                  {"params": params[2:]}]  # fmt: skip
        return Probe(groups, lr=lr)


def test_each_group_trains_at_the_scheduled_rate_times_its_lr_ratio(tmp_path):
    OPTIMIZERS.register("ratio_probe")(RatioProbe)
    Probe.seen.clear()
    try:
        cfg = {**tiny("train.steps=5", "train.log_every=1", "train.eval_every=0"), "optim": {"name": "ratio_probe"}}
        assert run(cfg, tmp_path)["status"] == "ok"
    finally:
        OPTIMIZERS.unregister("ratio_probe")
    logged = [r["lr"] for r in read_metrics(tmp_path) if r["kind"] == "train"]
    assert Probe.seen == [[lr * 0.5, lr * 2.0, lr] for lr in logged] and len(logged) == 5


# --- Schedules against their formulas -------------------------------------------------------------------------


def expected_rate(name: str, s: int, steps: int, lr: float, w: int, ratio: float, **options) -> float:
    """Each schedule's rate at 0-based step ``s``, written out from its definition."""
    low = lr * ratio
    if s < w:
        return lr * (s + 1) / w
    if name == "cosine":
        return low + (lr - low) * (1 + math.cos(math.pi * min(1.0, (s - w) / max(1, steps - w)))) / 2
    if name == "linear":
        return low + (lr - low) * (1 - (s - w) / (steps - w))
    if name == "constant":
        return lr
    if name == "inverse_sqrt":
        return max(low, lr * math.sqrt(max(w, 1) / (s - w + max(w, 1))))
    assert name == "wsd"
    start = steps - max(1, round(options["decay_fraction"] * steps))
    if s < start:
        return lr
    p = (s - start) / (steps - start)
    shape = {"linear": 1 - p, "cosine": (1 + math.cos(math.pi * p)) / 2, "1-sqrt": 1 - math.sqrt(p)}
    return low + (lr - low) * shape[options["shape"]]


FORMULAS = [("cosine", {}), ("linear", {}), ("constant", {}), ("inverse_sqrt", {})] + [
    ("wsd", {"decay_fraction": f, "shape": shape}) for f in (0.2, 1.0) for shape in ("linear", "cosine", "1-sqrt")
]


@pytest.mark.parametrize(("steps", "warmup"), [(100, 10), (9, 3), (5, 0), (40, 1)])
@pytest.mark.parametrize(
    ("name", "options"), FORMULAS, ids=[f"{n}-{'-'.join(map(str, o.values()))}" for n, o in FORMULAS]
)
def test_each_schedule_follows_its_formula_at_every_step(name, options, steps, warmup):
    train = TrainConfig(steps=steps, lr=2.0, warmup_steps=warmup, min_lr_ratio=0.25)
    recipe = Recipe(schedule={"name": name, **options})
    if name == "wsd" and warmup > steps - max(1, round(options["decay_fraction"] * steps)):
        with pytest.raises(ConfigError, match="train.warmup_steps"):
            recipe.check(train)
        return
    recipe.check(train)
    schedule = recipe.schedule_entry()
    for s in range(steps):
        want = expected_rate(name, s, steps, 2.0, warmup, 0.25, **options)
        assert lr_at(schedule, s, train) == pytest.approx(want, rel=1e-12, abs=1e-15), (s, want)


@pytest.mark.parametrize("name", SCHEDS)
def test_every_schedule_warms_up_linearly_then_stays_between_the_floor_and_the_peak(name):
    """What every registered schedule promises, a plugin's included: the warmup, the band, a pure function."""
    train = TrainConfig(steps=60, lr=1.5, warmup_steps=6, min_lr_ratio=0.1)
    schedule = Recipe(schedule={"name": name}).schedule_entry()
    rates = [lr_at(schedule, s, train) for s in range(60)]
    assert rates == [lr_at(schedule, s, train) for s in range(60)]
    assert rates[:6] == pytest.approx([1.5 * (s + 1) / 6 for s in range(6)], rel=1e-12)
    assert all(0.15 - 1e-12 <= r <= 1.5 + 1e-12 for r in rates[6:])
    assert rates[6] == pytest.approx(1.5)


@pytest.mark.parametrize("schedule", ["wsd", "inverse_sqrt"])
def test_the_logged_rate_is_the_scheduled_one_at_every_step(tmp_path, schedule):
    cfg = tiny(f"schedule={schedule}", "train.steps=10", "train.warmup_steps=2", "train.log_every=1",
               "train.eval_every=0")  # fmt: skip
    assert run(cfg, tmp_path)["status"] == "ok"
    logged = {r["step"]: r["lr"] for r in read_metrics(tmp_path) if r["kind"] == "train"}
    train = TrainConfig.from_config(cfg["train"])
    rate = Recipe(schedule=cfg["schedule"]).schedule_entry()
    assert logged == {n: lr_at(rate, n - 1, train) for n in range(1, 11)}


# --- z-loss ---------------------------------------------------------------------------------------------------


def test_the_z_loss_is_the_mean_squared_log_partition_over_scored_tokens():
    logits = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0)) * 3
    targets = torch.tensor([[1, 2, IGNORE, 3, 4], [IGNORE, IGNORE, 0, 6, 5]])
    direct = [
        math.log(sum(math.exp(v) for v in logits[b, t].tolist())) ** 2
        for b in range(2)
        for t in range(5)
        if targets[b, t] != IGNORE
    ]
    assert z_loss_fn(logits, targets).item() == pytest.approx(sum(direct) / len(direct), rel=1e-5)


def test_the_z_loss_adds_its_weight_times_its_value_to_the_loss_and_zero_changes_nothing():
    batch, weight = fixed_batch(), 0.05
    stepped, by_hand, default, zero = small_model(), small_model(), small_model(), small_model()
    sgd = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (stepped, by_hand, default, zero)]
    loss, aux = Stepper(stepped, stepped, sgd[0], torch.device("cpu"), z_loss=weight)(batch)
    logits = by_hand(batch.inputs)
    z = z_loss_fn(logits, batch.targets)
    (loss_fn(logits, batch.targets) + weight * z).backward()
    sgd[1].step()
    assert aux["z_loss"].item() == pytest.approx(z.item(), rel=1e-6) and loss.item() == pytest.approx(
        F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten()).item(), rel=1e-6
    )
    for a, b in zip(stepped.parameters(), by_hand.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    out_default = Stepper(default, default, sgd[2], torch.device("cpu"))(batch)
    out_zero = Stepper(zero, zero, sgd[3], torch.device("cpu"), z_loss=0.0)(batch)
    assert out_zero[1] == {} and torch.equal(out_default[0], out_zero[0])
    assert all(torch.equal(a, b) for a, b in zip(default.parameters(), zero.parameters(), strict=True))


def test_a_run_with_z_loss_logs_it_beside_the_auxiliary_losses(tmp_path):
    summary = run(tiny("train.z_loss=1e-3", "mlp=moe"), tmp_path)
    assert summary["status"] == "ok", summary["error"]
    train = [r for r in read_metrics(tmp_path) if r["kind"] == "train"]
    assert all({"aux_z_loss", "aux_balance", "aux_router_z"} <= set(r) for r in train)
    assert summary["final"]["aux_z_loss"] > 0
