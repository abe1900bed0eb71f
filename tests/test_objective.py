"""objective=ntp|mtp: the default leaves runs and hashes as they were; multi-token prediction's extra heads
(DeepSeek-V3's sequential modules or independent heads) see no token past the one they are given, are
scored against the right future token, train every parameter, are counted in flops_per_token, and leave the
next-token logits, evaluation, generation and every way back from a run folder to the next-token head."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import as_overrides, tiny, tiny_cli, zoo_cli

import zoo
from zoo.core.errors import ConfigError
from zoo.lab.records.config import config_hash
from zoo.lab.records.summary import read_summary
from zoo.lab.tasks import IGNORE, Batch
from zoo.lab.training.run import run
from zoo.lab.training.step import Stepper, future_losses
from zoo.models.objectives import OBJECTIVES, objective_entry

FORMS = ["sequential", "independent"]
V, T = 32, 12


IDS = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(6))


def mtp_model(heads: str, k: int = 2, carry: str = "block", **block) -> zoo.LanguageModel:
    torch.manual_seed(0)
    cfg = {
        "block": {"d_model": 16, "n_heads": 4, "placement": "pre", "norm": "rmsnorm", "attn": "mha",
                  "pos": "rotary", "mlp": "swiglu", **block},
        "model": {"vocab_size": V, "n_layers": 2},
        "objective": {"name": "mtp", "k": k, "heads": heads, "carry": carry},
    }  # fmt: skip
    return zoo.build_model(cfg).double()


def all_logits(model: zoo.LanguageModel, ids: torch.Tensor) -> list[torch.Tensor]:
    """The next-token logits, then each extra head's (a training forward with gradients: the extra heads run
    only then), detached."""
    model.train()
    logits = model(ids)
    return [x.detach() for x in [logits, *model.take_future_logits()]]


# --- the axis: config, hash, errors ---------------------------------------------------------------------------


def test_ntp_is_the_default_and_leaves_config_hashes_as_they_were():
    cfg = tiny()
    assert cfg["objective"] == {"name": "ntp"}
    assert config_hash(cfg) == "0a7575235f9168ae"  # recorded before the objective was an axis
    assert config_hash({k: v for k, v in cfg.items() if k != "objective"}) == "0a7575235f9168ae"
    mtp = ("objective=mtp",)
    changed = [tiny(*mtp), tiny(*mtp, "objective.k=2"), tiny(*mtp, "objective.weight=1")]
    assert len({config_hash(c) for c in [cfg, *changed]}) == 4
    assert "objective" not in zoo.build_model(cfg).state_dict().keys()


def test_carry_at_block_leaves_mtp_config_hashes_as_they_were():
    """objective.carry (block) is out of the hash at its default: the hashes below were recorded before the option
    existed; carry=normed is a new run."""
    recorded = {("objective=mtp",): "9350975da6042fd2", ("objective=mtp", "objective.k=2"): "a7383d75c7e692cc",
                ("objective=mtp", "objective.heads=independent"): "8baeb918a306993c"}  # fmt: skip
    for overrides, digest in recorded.items():
        assert config_hash(tiny(*overrides)) == digest, overrides
        assert config_hash(tiny(*overrides, "objective.carry=block")) == digest, overrides
    normed = config_hash(tiny("objective=mtp", "objective.k=2", "objective.carry=normed"))
    assert normed not in recorded.values()


def test_mtp_on_the_command_line_and_in_a_dict():
    cfg = tiny("objective=mtp", "objective.k=2")
    assert cfg["objective"] == {"name": "mtp", "k": 2, "heads": "sequential", "weight": 0.3, "anneal": "none",
                                "carry": "block"}  # fmt: skip
    for section in (cfg["objective"], {"name": "mtp", "k": 2}):
        model = zoo.build_model({**cfg, "objective": section})
        assert len(model.mtp.depths) == 2 and model.mtp.heads == "sequential"
    assert objective_entry("ntp").extra == 0 and objective_entry(None).extra == 0
    assert OBJECTIVES.names() == ["ntp", "mtp"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("objective=mtp", "objective.k=0"), "objective.k=0: must be a positive integer"),
        (("objective=mtp", "objective.heads=parallel"), "objective.heads='parallel': must be one of 'sequential', 'independent'"),  # noqa: E501
        (("objective=mtp", "objective.weight=-1"), "objective.weight=-1.0: must be >= 0"),
        (("objective=mtp", "objective.anneal=cosine"), "objective.anneal='cosine': must be one of 'none', 'linear'"),
        (("objective=mtp", "objective.carry=final"), "objective.carry='final': must be one of 'block', 'normed'"),
        (("objective=mtp", "objective.k=32"), "objective.k=32: must be below task.seq_len=32"),
        (("+objective.k=2",), "objective.k=2: not an option of objective 'ntp'"),
    ],
)
def test_bad_values_fail_before_any_tensor_work_naming_field_value_and_what_is_allowed(tmp_path, overrides, message):
    summary = run(tiny(*overrides), tmp_path)
    assert summary["status"] == "failed" and message in summary["error"], summary["error"]
    assert "parameters" not in summary  # no model was built


def test_an_unknown_objective_is_named_with_the_closest(tmp_path):
    summary = run({**tiny(), "objective": {"name": "mpt"}}, tmp_path)
    assert "objective.name='mpt': unknown objective; did you mean 'mtp'?" in summary["error"], summary["error"]


def test_mtp_is_refused_for_a_task_that_builds_its_own_model(tmp_path):
    summary = run(tiny("objective=mtp", "task.max_len=6", task="transduce"), tmp_path)
    assert summary["status"] == "failed" and "objective.name='mtp': " in summary["error"], summary["error"]


@pytest.mark.parametrize(
    ("anneal", "expected"), [("none", [0.3, 0.3, 0.3, 0.3]), ("linear", [0.3, 0.225, 0.15, 0.075])]
)
def test_the_weight_is_constant_or_falls_linearly_to_zero_by_the_end(anneal, expected):
    objective = objective_entry({"name": "mtp", "anneal": anneal})
    assert [objective.weight_at(step, 4) for step in range(4)] == pytest.approx(expected)
    assert objective_entry("ntp").weight_at(0, 4) == 0.0


# --- the heads: causal, scored against the right token, trained -------------------------------------------------


@pytest.mark.parametrize("heads", FORMS)
def test_no_head_sees_past_the_token_it_is_given(heads):
    """Head 0 (next token) at position t reads tokens <= t; extra head j (predicting token t + j + 1) reads
    tokens <= t + j in the sequential form (its depth j is given token t + j's embedding), <= t in the
    independent form. Perturbing token s changes no head's logits at a position that may not see s, and
    changes the sequential head j's at t = s - j (it does read the token it is given)."""
    model = mtp_model(heads)
    ids = torch.randint(0, V, (1, T), generator=torch.Generator().manual_seed(1))
    base = all_logits(model, ids)
    assert len(base) == 3
    for s in range(T):
        changed = ids.clone()
        changed[0, s] = (changed[0, s] + 1) % V
        after = all_logits(model, changed)
        for j, (a, b) in enumerate(zip(base, after, strict=True)):
            reach = j if heads == "sequential" else 0  # the furthest token head j reads, past its position
            moved = (a - b).abs().amax(-1)[0] > 1e-12  # (positions,)
            seen = [t for t in range(a.shape[1]) if moved[t]]
            assert all(t + reach >= s for t in seen), f"head {j} at {[t for t in seen if t + reach < s]} sees token {s}"
            if heads == "sequential" and 0 <= s - j < a.shape[1]:
                assert moved[s - j], f"head {j} at {s - j} does not read the token {s} it is given"


@pytest.mark.parametrize("carry", ["block", "normed"])
def test_each_sequential_depth_reads_what_its_carry_says_by_hand(carry):
    """DeepSeek-V3's equations written out with each depth's modules: depth j combines norm(c_{j-1}) of the first
    T - j positions with the embedding of token t + j, c_0 = h the trunk's final state, c_j = block_j's output
    (carry: block, the paper's h_i^k) or its final-normed state (normed); head j reads final_norm_j(block_j(...))."""
    model = mtp_model("sequential", k=3, carry=carry)
    ids = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(5))
    got = all_logits(model, ids)[1:]
    with torch.no_grad():
        c = model.hidden_states(ids)  # the trunk's final-normed state
        for j, depth in enumerate(model.mtp.depths, 1):
            n = T - j
            mixed = depth.proj(torch.cat([depth.norm_h(c[:, :n]), depth.norm_e(model.embed(ids[:, j:]))], dim=-1))
            out = depth.block(mixed)
            state = depth.final_norm(out)
            torch.testing.assert_close(got[j - 1], model.logits(state), rtol=0, atol=1e-12)
            c = out if carry == "block" else state


def test_the_carries_agree_at_depth_one_and_part_from_depth_two():
    """The same weights (norm gains away from 1: at init the final norm's unit gain makes norm(norm(x)) equal
    norm(x) but for its eps): depth 1 is the same, depth 2 differs."""
    from zoo.testing.combos import scramble

    models = [mtp_model("sequential", k=2, carry=c) for c in ("block", "normed")]
    torch.manual_seed(7)
    scramble(models[0])
    models[1].load_state_dict(models[0].state_dict())
    block, normed = (all_logits(m, IDS) for m in models)
    torch.testing.assert_close(normed[1], block[1], rtol=0, atol=0)
    assert (normed[2] - block[2]).norm() > 0.01 * block[2].norm()


@pytest.mark.parametrize("heads", FORMS)
def test_the_extra_heads_leave_the_next_token_logits_as_the_same_trunk_gives_them(heads):
    model = mtp_model(heads)
    plain = zoo.build_model({"block": {"d_model": 16, "n_heads": 4, "placement": "pre", "norm": "rmsnorm",
                                       "attn": "mha", "pos": "rotary", "mlp": "swiglu"},
                             "model": {"vocab_size": V, "n_layers": 2}}).double()  # fmt: skip
    trunk = {k: v for k, v in model.state_dict().items() if not k.startswith("mtp.")}
    plain.load_state_dict(trunk)  # strict: the trunk is the whole next-token model
    ids = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(all_logits(model, ids)[0], plain(ids), rtol=0, atol=0)
    model.eval()
    assert model.take_future_logits() == []  # eval: only the next-token head runs
    torch.testing.assert_close(model(ids), plain(ids), rtol=0, atol=0)


def test_head_j_at_t_is_scored_against_token_t_plus_j_plus_one():
    """future_losses against a loop over positions reading the raw sequence (not the shifted targets)."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, V, (2, T + 1), generator=g)
    targets = tokens[:, 1:].clone()
    targets[0, 5] = IGNORE  # a position not scored: token 6 of row 0 is no head's target
    logits = [torch.randn(2, T - j, V, generator=g, dtype=torch.float64) for j in (1, 2)]
    got = future_losses(logits, targets)
    for j, (head, value) in enumerate(zip(logits, got, strict=True), 1):
        terms = [F.cross_entropy(head[b, t], tokens[b, t + j + 1]) for b in range(2) for t in range(T - j)
                 if not (b == 0 and t + j + 1 == 6)]  # fmt: skip
        torch.testing.assert_close(value.double(), torch.stack(terms).mean(), rtol=1e-5, atol=1e-6)  # float32 loss


@pytest.mark.parametrize("heads", FORMS)
def test_a_training_step_logs_each_heads_loss_and_trains_every_parameter(heads):
    model = mtp_model(heads)
    tokens = torch.randint(0, V, (2, T + 1), generator=torch.Generator().manual_seed(4))
    batch = Batch(tokens[:, :-1], tokens[:, 1:])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads: dict[str, torch.Tensor] = {}

    def keep_grads() -> None:
        grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

    step = Stepper(model, model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"),
                   future_weight=0.5, before_step=keep_grads)  # fmt: skip
    heads_logits = all_logits(model, tokens[:1, :-1])  # a training forward: the extra heads run too
    expected = [F.cross_entropy(x[0], tokens[0, j + 1 :]).detach().float() for j, x in enumerate(heads_logits)]
    loss, aux = step(Batch(tokens[:1, :-1], tokens[:1, 1:]))
    assert set(aux) == {"mtp_1", "mtp_2"}
    for got, want in zip([loss, aux["mtp_1"], aux["mtp_2"]], expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    step(batch)
    for name, p in model.named_parameters():
        assert name in grads and grads[name].abs().sum() > 0, name
        assert not torch.equal(p, before[name]), name


def test_the_step_trains_on_the_next_token_loss_plus_the_weight_times_the_mean_of_the_extra_losses():
    """The documented loss, L_ntp + weight / k sum_j L_j (k = 3 heads here), by hand: the step's gradients equal
    those of that sum written out; a sum of the extra losses (k times the weight) moves them."""
    model = mtp_model("sequential", k=3)
    tokens = torch.randint(0, V, (2, T + 1), generator=torch.Generator().manual_seed(5))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    model.train()
    logits, *extra = [model(inputs), *model.take_future_logits()]
    by_hand = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    by_hand = by_hand + 0.5 / 3 * sum(F.cross_entropy(x.flatten(0, 1), targets[:, j:].flatten())
                                      for j, x in enumerate(extra, 1))  # fmt: skip
    expected = torch.autograd.grad(by_hand, list(model.parameters()))
    grads: list[torch.Tensor] = []
    step = Stepper(model, model, torch.optim.SGD(model.parameters(), lr=0.0), torch.device("cpu"), future_weight=0.5,
                   before_step=lambda: grads.extend(p.grad.clone() for p in model.parameters()))  # fmt: skip
    step(Batch(inputs, targets))
    for (name, _), got, want in zip(model.named_parameters(), grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7, msg=name)  # the step scores in float32


def test_the_extra_heads_are_counted_in_flops_per_token_by_hand():
    """d=16, 4 heads, mha + gelu + layernorm with biases, vocab 256, 2 layers, seq_len 32: each extra depth adds
    6 x its parameters, the shared head's 6 x 256 x 16 matmul and its attention's 6 x 32 x 16."""
    block = 16 * 48 + 48 + 16 * 16 + 16 + 16 * 64 + 64 + 64 * 16 + 16 + 2 * (16 + 16)  # qkv, out, up, down, norms
    assert block == 3280
    per_depth = {"sequential": block + 2 * 16 * 16 + 3 * 32, "independent": block + 32}  # + proj, norms
    base = tiny("block.d_model=16", "model.vocab_size=256")
    ntp = zoo.build_model(base).flops_per_token(32)
    for heads, params in per_depth.items():
        model = zoo.build_model({**base, "objective": {"name": "mtp", "k": 2, "heads": heads}})
        assert model.parameter_counts()["mtp"] == 2 * params
        assert model.flops_per_token(32) - ntp == 2 * (6 * params + 6 * 256 * 16 + 6 * 32 * 16), heads


# --- runs: recorded, evaluated on the next token, every way back ---------------------------------------------------


def test_an_mtp_run_records_its_extra_losses_and_comes_back_as_the_next_token_model(tmp_path):
    from safetensors.torch import load_file

    from zoo.lab.finished.runs import evaluate_run, load_run
    from zoo.lab.records import checkpoint as ckpt

    summary = run(tiny("objective=mtp", "objective.k=2", "objective.anneal=linear"), tmp_path)
    assert summary["status"] == "ok", summary["error"]
    final = summary["final"]
    assert all(math.isfinite(final[f"aux_mtp_{j}"]) and final[f"aux_mtp_{j}"] > 0 for j in (1, 2))
    assert summary["parameters"]["mtp"] > 0
    ntp = run(tiny(), tmp_path / "ntp")
    assert summary["flops_per_token"] > ntp["flops_per_token"]
    assert any(k.startswith("mtp.") for k in load_file(tmp_path / ckpt.WEIGHTS))
    metrics, errors, _ = evaluate_run(tmp_path)  # zoo-eval: the next-token loss, as the run recorded it
    assert not errors
    for key, value in final.items():
        if key.startswith("val_"):
            assert abs(metrics[key] - value) <= 1e-6 * abs(value), key
    model, _ = load_run(tmp_path)
    prompt = torch.randint(0, 256, (1, 4), generator=torch.Generator().manual_seed(0))
    new = model.generate(prompt, 6)  # the next-token head alone
    with torch.no_grad():
        assert torch.equal(new[0, 0], model(prompt)[0, -1].argmax())


def test_zoo_train_trains_a_tiny_mtp_run_end_to_end(tmp_path):
    keys = tiny_cli(objective="mtp", objective__k=2, objective__heads="independent", train__steps=3)
    done = zoo_cli("zoo.train", *as_overrides(keys), "hydra.run.dir=run", cwd=tmp_path)
    summary = read_summary(tmp_path / "run")
    assert summary["status"] == "ok" and summary["config"]["objective"]["heads"] == "independent", done.stderr
    assert "aux_mtp_2" in summary["final"]


def test_objective_entries_refuse_bad_values_before_building():
    with pytest.raises(ConfigError, match=r"objective\.k=-1"):
        objective_entry({"name": "mtp", "k": -1})


def test_the_trainer_weighs_the_extra_losses_by_the_objectives_weight_at_each_step(tmp_path, monkeypatch):
    weights: list[float] = []
    step_call = Stepper.__call__

    def recording(self: Stepper, batch: Batch):
        weights.append(self.future_weight)
        return step_call(self, batch)

    monkeypatch.setattr(Stepper, "__call__", recording)
    summary = run(tiny("objective=mtp", "objective.weight=0.5", "objective.anneal=linear"), tmp_path)
    assert summary["status"] == "ok", summary["error"]
    assert weights == pytest.approx([0.5 * (1 - s / 12) for s in range(12)])
