"""Probes (``train.probe_every``), every run's step-0 validation and its spike score: the probe values
against an independent computation from the saved weights and the probe batch (a planted bug in the
logit scale fails it), probes and the step-0 validation changing nothing a run computes, a run with
probes resuming bit for bit (also from a checkpoint written before these values were recorded), and
the spike detector on planted spikes."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import interrupt, tiny, without_timings
from safetensors.torch import load_file

import zoo.parts.attention
from zoo.core.errors import ConfigError
from zoo.lab.planning.plan import plan_run
from zoo.lab.records import checkpoint as ckpt
from zoo.lab.records.config import config_hash
from zoo.lab.records.metrics import read_metrics
from zoo.lab.tasks import build_task
from zoo.lab.training import probes, spikes
from zoo.lab.training import trainer as trainer_module
from zoo.lab.training.loop_state import LoopState
from zoo.lab.training.probes import PROBE_KEYS, Probes, forward_probe
from zoo.lab.training.run import run
from zoo.lab.training.step import Stepper
from zoo.lab.training.trainer import Trainer
from zoo.models.language import build_model

#: Grouped heads (2 query heads per key/value head), no positions: the scores are q k^T / sqrt(d) alone.
PROBED = ("pos=none", "attn=gqa", "train.probe_every=6")


def probe_batch(cfg: dict):
    """The probe batch: the first validation batch at the training length."""
    return build_task(cfg["task"]).val_batches(cfg["train"]["batch_size"], cfg["train"]["eval_batches"], 1)[0]


def from_weights(cfg: dict, state: dict[str, torch.Tensor], batch) -> dict[str, list[float] | float]:
    """The probe's values from the weights alone: each layer's attention scores from its qkv weight and the
    normalized input (the model carries the residual stream there), the output logits' statistics."""
    model = build_model(cfg)
    model.load_state_dict(state)
    model.eval()
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}
    for i, block in enumerate(model.blocks):
        block.attn.register_forward_pre_hook(lambda m, a, i=i: inputs.__setitem__(i, a[0]))
        block.register_forward_hook(lambda m, a, out, i=i: outputs.__setitem__(i, out))
    with torch.no_grad():
        logits = model(batch.inputs)
    n_heads, n_kv, width = cfg["block"]["n_heads"], 2, cfg["block"]["d_model"]
    d, r = width // n_heads, n_heads // n_kv
    tops, entropies, firsts = [], [], []
    for i in range(len(model.blocks)):
        weight, bias = state[f"blocks.{i}.attn.qkv.weight"], state[f"blocks.{i}.attn.qkv.bias"]
        qkv = (inputs[i] @ weight.T + bias).view(*inputs[i].shape[:2], n_kv, r + 2, d)  # per kv group: r q, k, v
        q = qkv[:, :, :, :r].reshape(*inputs[i].shape[:2], n_heads, d).transpose(1, 2)  # head g * r + j
        k = qkv[:, :, :, r].repeat_interleave(r, dim=2).transpose(1, 2)  # head h reads group h // r
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        t = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -math.inf)
        p = scores.softmax(-1)
        tops.append(scores.max().item())
        entropies.append(-(p * p.clamp_min(1e-30).log()).sum(-1).mean().item())  # over the keys alone
        if (sink := state.get(f"blocks.{i}.attn.sink")) is not None:  # one more term in each head's denominator
            p = torch.cat([scores, sink.view(1, -1, 1, 1).expand(*scores.shape[:3], 1)], -1).softmax(-1)[..., :-1]
        firsts.append(p[:, :, 1:, 0].mean().item())  # every query after the first, on key 0
    flat = logits.reshape(-1, logits.shape[-1])
    loss = F.cross_entropy(flat, batch.targets.flatten()).item()
    peaks = [outputs[i].abs().max().item() for i in range(len(model.blocks))]
    return {"attn_logit_max": tops, "attn_entropy": entropies, "attn_first": firsts, "resid_max": peaks,
            "logit_max": flat.max().item(), "log_z": flat.logsumexp(-1).mean().item(), "loss": loss}  # fmt: skip


def assert_matches(probe: dict, expected: dict) -> None:
    for key, value in expected.items():
        assert probe[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("probed")
    summary = run(tiny(*PROBED), folder)
    assert summary["status"] == "ok", summary["error"]
    return folder


def test_probe_values_are_what_the_saved_weights_give_on_the_probe_batch(probed):
    cfg = tiny(*PROBED)
    probes = [r for r in read_metrics(probed) if r["kind"] == "probe"]
    assert [r["step"] for r in probes] == [6, 12] and all(set(PROBE_KEYS) <= set(r) for r in probes)
    last = probes[-1]
    assert len(last["attn_logit_max"]) == len(last["resid_rms"]) == 2 and last["no_logits"] == {}
    state, batch = load_file(probed / ckpt.WEIGHTS), probe_batch(cfg)  # the final weights: after step 12
    assert_matches(last, from_weights(cfg, state, batch))
    assert last["attn_entropy"][0] < math.log(32)  # below uniform over the longest row
    model = build_model(cfg)
    model.load_state_dict(state)
    again = forward_probe(model, build_task(cfg["task"]).logits, batch)  # recomputed from the file
    assert again == {k: last[k] for k in again}


def test_a_planted_bug_in_the_logit_scale_fails_the_check(probed, monkeypatch):
    cfg = tiny(*PROBED)
    state, batch = load_file(probed / ckpt.WEIGHTS), probe_batch(cfg)
    real = zoo.parts.attention.masked_logits
    planted = lambda q, k, **kw: real(q, k, **{**kw, "scale": 1 / q.shape[-1]})  # noqa: E731  1/d for 1/sqrt(d)
    monkeypatch.setattr(zoo.parts.attention, "masked_logits", planted)
    model = build_model(cfg)
    model.load_state_dict(state)
    wrong = forward_probe(model, build_task(cfg["task"]).logits, batch)
    with pytest.raises(AssertionError, match="attn_logit_max"):
        assert_matches(wrong, from_weights(cfg, state, batch))


def test_attention_on_the_first_position_counts_a_learned_sink_and_the_residual_peak_is_the_largest_value():
    """With a learned sink the share on position 0 is exp(s_0) / (exp(sink) + sum_j exp(s_j)), from the weights
    by hand; a large sink takes most of the attention, so the share falls."""
    cfg = tiny(*PROBED, "block.attn.sink=learned")
    torch.manual_seed(0)
    model, batch, logits_of = build_model(cfg), probe_batch(cfg), build_task(cfg["task"]).logits
    with torch.no_grad():
        for block in model.blocks:
            block.attn.sink.copy_(torch.tensor([3.0, -2.0, 0.5, 0.0]))
    probe = forward_probe(model, logits_of, batch)
    assert_matches(probe, from_weights(cfg, model.state_dict(), batch))
    with torch.no_grad():
        for block in model.blocks:
            block.attn.sink.fill_(-30.0)  # no weight left for the sink: the softmax over the keys alone
    without = forward_probe(model, logits_of, batch)
    assert all(a < 0.8 * b for a, b in zip(probe["attn_first"], without["attn_first"], strict=True))
    assert min(without["attn_first"]) > 1 / 32  # above the least a query can give key 0 under uniform attention


@pytest.mark.parametrize("attn", ["gqa", "mla"])
def test_the_probe_forward_projects_each_layer_once_and_gives_what_projecting_twice_gives(attn, monkeypatch):
    """attention_logits reuses the forward's queries and keys: one projection per layer, not two, and the
    same record as with every step computed again (probes.SHARED_STEPS emptied)."""
    cfg = tiny(f"attn={attn}", "pos=rotary")
    torch.manual_seed(0)
    model, batch, logits_of = build_model(cfg), probe_batch(cfg), build_task(cfg["task"]).logits
    cls = type(model.blocks[0].attn)
    calls, real = [], cls.project
    monkeypatch.setattr(cls, "project", lambda self, *a: calls.append(self) or real(self, *a))
    shared = forward_probe(model, logits_of, batch)
    assert len(calls) == len(model.blocks) and "project" not in vars(model.blocks[0].attn)  # restored after
    calls.clear()
    monkeypatch.setattr(probes, "SHARED_STEPS", ())
    assert forward_probe(model, logits_of, batch) == shared
    assert len(calls) == 2 * len(model.blocks)  # the forward's and attention_logits's


def test_a_shared_step_computes_again_for_other_numbers_only():
    calls = []
    step = probes.computed_once(lambda x, positions: calls.append(1) or x * 2 + positions)
    x, slots = torch.randn(2, 3), torch.arange(3)
    first = step(x, slots)
    assert step(x, torch.arange(3)) is first and len(calls) == 1  # the same numbers: the result before
    for other in ((x + 1, slots), (x, slots.flip(0)), (x[:, :2], slots[:2]), (x.double(), slots)):
        assert torch.equal(step(*other), other[0] * 2 + other[1])  # another input: computed for it
    assert len(calls) == 5
    calls.clear()
    optional = probes.computed_once(lambda x, positions, mask=None: calls.append(mask) or x * 2 + positions)
    first = optional(x, slots, None)  # the forward's call, its mask left out
    assert optional(x, slots) is first and calls == [None]  # attention_logits's call: the same step
    optional(x, slots, torch.ones(3))
    assert len(calls) == 2  # a mask given: computed for it


def test_update_ratio_and_gradient_norms_against_sgd_by_hand():
    """Under plain SGD the update is -lr x gradient: its RMS over the weight's is lr |g| / |w| per key."""
    torch.manual_seed(0)
    model = build_model(tiny("pos=none"))
    lr = 0.1
    blocks = {id(p) for p in model.blocks.parameters()}
    rest = [p for p in model.parameters() if id(p) not in blocks]
    optimizer = torch.optim.SGD([{"params": list(model.blocks.parameters())}, {"params": rest}], lr=lr)
    probes = Probes(model, optimizer, every=1, steps=1)
    step = Stepper(model, model, optimizer, torch.device("cpu"), grad_clip=0.5, before_step=probes.snapshot)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        p.register_hook(lambda g, name=name: grads.__setitem__(name, g.clone()))
    cfg = tiny("pos=none")
    batch = build_task(cfg["task"]).train_batch(4, torch.Generator().manual_seed(0))
    step(batch)
    record = probes.record(build_task(cfg["task"]).logits, probe_batch(cfg))
    name = "blocks.1.attn.qkv.weight"
    raw = grads[name].norm().item()
    assert record["grad_norm"][name] == pytest.approx(raw, rel=1e-5)  # before clipping
    total = math.sqrt(sum(g.square().sum().item() for g in grads.values()))
    assert record["grad_norm"]["total"] == pytest.approx(total, rel=1e-5) == step.grad_norm.item()
    coef = min(1.0, 0.5 / (total + 1e-6))  # what clipping applied
    assert record["update_ratio"][name] == pytest.approx(lr * coef * raw / before[name].norm().item(), rel=1e-4)
    embed = lr * coef * grads["embed.weight"].norm().item() / before["embed.weight"].norm().item()
    assert record["update_ratio"]["embed.weight"] == pytest.approx(embed, rel=1e-4)
    names = [n for n, p in model.named_parameters() if id(p) not in blocks]
    moved = math.sqrt(sum(grads[n].square().sum().item() for n in names)) * lr * coef
    assert record["update_ratio"]["group1"] == pytest.approx(
        moved / math.sqrt(sum(before[n].square().sum().item() for n in names)), rel=1e-4
    )


def test_probes_and_the_step0_validation_change_nothing_the_run_computes(tmp_path, monkeypatch):
    """With dropout (each step draws from the generators; eval mode would draw nothing): probes every 5 steps,
    and a run without the step-0 validation, end with the weights and curves of the default run."""
    common = ("block.dropout=0.1", "train.log_every=1")
    base = run(tiny(*common), tmp_path / "base")
    probed = run(tiny(*common, "train.probe_every=5"), tmp_path / "probes")
    monkeypatch.setattr(Trainer, "evaluate_initial", lambda self, loop: None)
    bare = run(tiny(*common), tmp_path / "no_initial")
    weights = {d: load_file(tmp_path / d / ckpt.WEIGHTS) for d in ("base", "probes", "no_initial")}
    for other in ("probes", "no_initial"):
        assert weights[other].keys() == weights["base"].keys()
        assert all(torch.equal(weights[other][k], v) for k, v in weights["base"].items()), other
    assert probed["final"] == base["final"] == bare["final"] and probed["spikes"] == base["spikes"]
    curves = {d: without_timings(read_metrics(tmp_path / d)) for d in ("base", "probes", "no_initial")}
    assert [r for r in curves["probes"] if r["kind"] != "probe"] == curves["base"]
    assert curves["no_initial"] == curves["base"][1:] and curves["base"][0]["step"] == 0
    assert base["initial"] == {k: v for k, v in curves["base"][0].items() if k not in ("kind", "step", "tokens")}
    assert base["initial"]["val_loss"] == pytest.approx(math.log(256), abs=0.3)  # uniform over bytes at init
    assert probed["config_hash"] == base["config_hash"]  # the same experiment (train.probe_every is runtime)


def test_a_run_with_probes_resumes_bit_for_bit(tmp_path):
    overrides = ("train.probe_every=2", "train.checkpoint_every=5", "train.log_every=3", "block.dropout=0.1")
    whole = run(tiny(*overrides), tmp_path / "whole")
    interrupt(tmp_path / "whole", tmp_path / "resumed", at_step=5)  # mid log interval, after a probe step
    resumed = run(tiny(*overrides), tmp_path / "resumed", resume=True)
    assert resumed["resumed_from"] == [5] and resumed["final"] == whole["final"]
    assert resumed["initial"] == whole["initial"] and resumed["spikes"] == whole["spikes"]
    assert without_timings(read_metrics(tmp_path / "resumed")) == without_timings(read_metrics(tmp_path / "whole"))
    a, b = load_file(tmp_path / "whole" / ckpt.WEIGHTS), load_file(tmp_path / "resumed" / ckpt.WEIGHTS)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_written_before_initial_and_gradient_norms_resumes(tmp_path, monkeypatch):
    """Checkpoints as the trainer wrote them before: no ``initial`` or ``curve`` in the loop, no gradient
    sums per rank. The run resumes to the same weights; what it cannot know is left empty or None."""
    overrides = ("train.checkpoint_every=5", "train.log_every=3")
    whole = run(tiny(*overrides), tmp_path / "whole")
    old = ("n_summed", "reference", "last_loss", "final_val", "train_time")
    monkeypatch.setattr(LoopState, "SAVED", old)
    checkpoint_state = Trainer.checkpoint_state

    def older(self, step, loop):  # the ranks' running sums without the gradient norms
        sums = loop.grad_sum
        loop.grad_sum = None
        state = checkpoint_state(self, step, loop)
        loop.grad_sum = sums
        return state

    monkeypatch.setattr(Trainer, "checkpoint_state", older)
    run(tiny(*overrides), tmp_path / "old")
    monkeypatch.undo()
    saved = ckpt.read_state(ckpt.latest_checkpoint(tmp_path / "old"))["state"]
    assert "initial" not in saved["loop"] and "grad_sum" not in saved["ranks"][0]
    interrupt(tmp_path / "old", tmp_path / "resumed", at_step=5)
    resumed = run(tiny(*overrides), tmp_path / "resumed", resume=True)
    assert resumed["status"] == "ok" and resumed["final"] == whole["final"] and resumed["initial"] == {}
    a, b = load_file(tmp_path / "whole" / ckpt.WEIGHTS), load_file(tmp_path / "resumed" / ckpt.WEIGHTS)
    assert all(torch.equal(a[k], b[k]) for k in a)
    train = {r["step"]: r for r in read_metrics(tmp_path / "resumed") if r["kind"] == "train"}
    assert train[6]["grad_norm"] is None and train[9]["grad_norm"] is not None  # steps 5 and 6: not all known


def test_probes_are_refused_by_name_under_fsdp2_and_tensor_parallel():
    cfg = tiny("train.probe_every=5", "parallel.dp_shard=2")
    with pytest.raises(ConfigError, match="train.probe_every=5: 0 under FSDP2 or tensor parallelism"):
        plan_run(cfg, {}, [], world=2)


def test_probe_every_is_out_of_the_config_hash():
    assert config_hash(tiny("train.probe_every=10")) == config_hash(tiny())


# --- Spikes --------------------------------------------------------------------------------------------


def early_curve(n: int, seed: int = 0) -> list[list[float | None]]:
    """Every step of a healthy run's start, as the loop sees it: a loss falling fast from 5.5 towards 2.5 with
    each batch's scatter (2%), and a gradient norm that rises out of initialization and settles, scattered by
    20% from step to step."""
    rng = random.Random(seed)
    loss = [2.5 + 3.0 * math.exp(-i / 25) for i in range(n)]
    grad = [0.5 + 1.5 * (1 - math.exp(-i / 5)) * math.exp(-i / 60) for i in range(n)]
    return [[i + 1, x * math.exp(rng.gauss(0, 0.02)), g * math.exp(rng.gauss(0, 0.2))]
            for i, (x, g) in enumerate(zip(loss, grad, strict=True))]  # fmt: skip


def judged(rows: list[list[float | None]]) -> dict:
    state = spikes.new_state()
    spikes.update(state, rows)
    return spikes.result(state)


def test_a_healthy_start_has_no_spike_and_planted_ones_are_found_at_their_step():
    """Every step judged: a +40% loss jump at step 30 of 100 (where the curve still falls fast) and a 10x
    gradient-norm jump are each found at the step they happen, and nowhere else."""
    for seed in range(20):
        assert judged(early_curve(100, seed)) == {
            "count": 0, "steps": [], "by": {"loss": [], "grad_norm": []}, "judged": 100 - spikes.MIN_HISTORY,
        }  # fmt: skip
        loss_jump, grad_jump = early_curve(100, seed), early_curve(100, seed)
        loss_jump[29][1] *= 1.4
        grad_jump[69][2] *= 10
        assert judged(loss_jump)["by"] == {"loss": [30], "grad_norm": []} and judged(loss_jump)["steps"] == [30]
        assert judged(grad_jump)["by"] == {"loss": [], "grad_norm": [70]} and judged(grad_jump)["count"] == 1
        rising = [[i, 1.0 + 0.01 * i + random.Random(seed).gauss(0, 0.02), 1.0] for i in range(200)]  # steady
        assert judged(rising)["count"] == 0


def test_a_step_is_judged_once_it_has_enough_history_and_unknowns_are_skipped():
    flat = [[i, 5.0, None] for i in range(spikes.MIN_HISTORY)]
    assert judged([*flat, [99, 50.0, None]])["steps"] == [99]  # judged from MIN_HISTORY values on
    assert judged([*flat[1:], [99, 50.0, None]]) == {
        "count": None, "steps": [], "judged": 0,
        "reason": f"not measurable: no step had {spikes.MIN_HISTORY} earlier steps with a finite loss or "
                  "gradient norm",
    }  # fmt: skip
    gaps = [[i, 1.0, None] for i in range(6)] + [[6, None, None], [7, float("nan"), 1.0]]
    gaps += [[8 + i, 1.0, None] for i in range(4)] + [[12, 9.0, None]]
    assert judged(gaps)["steps"] == [12]  # ten finite losses before step 12: the unknowns skipped


def test_the_detector_state_is_plain_and_judging_in_pieces_is_judging_at_once():
    rows = early_curve(60, 3)
    rows[40][1] *= 1.5
    state = spikes.new_state()
    for start in range(0, 60, 7):  # log every 7 steps, the state through JSON between (as a checkpoint holds it)
        spikes.update(state, rows[start : start + 7])
        state = json.loads(json.dumps(state))
    assert spikes.result(state) == judged(rows) and judged(rows)["steps"] == [41]
    assert all(len(h) <= spikes.WINDOW for h in state["history"].values())  # bounded, however long the run


def test_a_step_at_a_huge_rate_is_a_spike_at_the_next_step_with_sparse_logging(tmp_path, monkeypatch):
    """The rate x 300 for step 16 only: the loss of step 17 (the first forward after it) jumps; logged every 8
    steps, the detector still sees step 17 (it judges every step, not the log steps)."""
    lr_at = trainer_module.lr_at
    monkeypatch.setattr(trainer_module, "lr_at", lambda s, i, cfg: lr_at(s, i, cfg) * (300 if i == 15 else 1))
    summary = run(tiny("train.steps=24", "train.log_every=8", "train.eval_every=0"), tmp_path / "spiked")
    assert summary["spikes"]["steps"][:1] == [17] and summary["status"] == "ok"
    monkeypatch.undo()
    smooth = run(tiny("train.steps=24", "train.log_every=8", "train.eval_every=0"), tmp_path / "smooth")
    assert smooth["spikes"]["count"] == 0 and smooth["spikes"]["judged"] == 24 - spikes.MIN_HISTORY
    short = run(tiny("train.steps=8", "train.eval_every=0"), tmp_path / "short")
    assert short["spikes"]["count"] is None and short["spikes"]["reason"].startswith("not measurable")


def test_a_mixer_without_logits_is_skipped_by_name(tmp_path):
    summary = run(tiny("attn=linear", "train.steps=4", "train.probe_every=4", "train.eval_every=0"), tmp_path)
    assert summary["status"] == "ok", summary["error"]
    (probe,) = [r for r in read_metrics(tmp_path) if r["kind"] == "probe"]
    assert probe["no_logits"] == {"0": "LinearAttention", "1": "LinearAttention"}
    assert probe["attn_logit_max"] == probe["attn_entropy"] == [None, None]
    assert all(v > 0 for v in probe["resid_rms"]) and math.isfinite(probe["log_z"])
