"""Latent attention, linear attention and Gated DeltaNet: what their decoding states hold, where they refuse."""

from __future__ import annotations

import pytest
import torch

from zoo import ConfigError, LayerState, build_block, check_combination
from zoo.parts.gated_deltanet import DeltaState
from zoo.parts.latent_attention import LatentCache
from zoo.parts.linear_attention import RecurrentState
from zoo.parts.positions import Position
from zoo.testing.combos import TINY, VOCAB, make_model

LLAMA = {"placement": "pre", "norm": "rmsnorm", "pos": "rotary", "mlp": "swiglu"}
D, H = TINY["d_model"], TINY["n_heads"]


def state_bytes(attn: dict | str, tokens: int, batch: int = 2) -> tuple[int, LayerState]:
    """Bytes the first layer's state holds after ``tokens`` tokens (float64), and that state."""
    model = make_model({**LLAMA, "attn": "mha"}, attn=attn if isinstance(attn, dict) else {"name": attn})
    caches = model.new_caches(max_len=tokens)
    model(torch.randint(0, VOCAB, (batch, tokens)), caches=caches)
    return caches[0].nbytes, caches[0]


def test_latent_attention_caches_the_latent_and_one_rotary_key_per_token():
    d_head = D // H
    mla, state = state_bytes({"name": "mla", "kv_rank": 6}, tokens=5)
    assert isinstance(state.mixer, LatentCache)
    assert state.mixer.latent.shape == (2, 5, 6) and state.mixer.rope_key.shape == (2, 1, 5, d_head)
    assert mla == 2 * 5 * (6 + d_head) * 8  # batch x tokens x (kv_rank + d_head) x float64
    mha, _ = state_bytes("mha", tokens=5)
    gqa, _ = state_bytes("gqa", tokens=5)
    assert mha == 2 * 5 * 2 * H * d_head * 8
    assert mla / mha == (6 + d_head) / (2 * H * d_head) < gqa / mha  # 10/32 of MHA's here, under GQA's 1/2


def test_latent_attention_generates_what_the_full_forward_predicts():
    model = make_model({**LLAMA, "attn": "mla+qrank"})
    prompt = torch.randint(0, VOCAB, (2, 4))
    new = model.generate(prompt, 5)
    ids = prompt
    for _ in range(5):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(new, ids[:, 4:])


@pytest.mark.parametrize("decay", ["none", "fixed", "gated"])
def test_linear_attention_state_has_one_size_whatever_the_length(decay):
    short, state = state_bytes({"name": "linear", "decay": decay}, tokens=3)
    long, _ = state_bytes({"name": "linear", "decay": decay}, tokens=30)
    assert isinstance(state.mixer, RecurrentState)
    assert short == long == 2 * H * (D // H) * (D // H) * 8  # batch x heads x d_key x d_head x float64
    state.truncate(3)  # the present is fine
    with pytest.raises(ConfigError, match="cannot rewind"):
        state.truncate(2)
    state.reset()
    assert state.length == 0 and state.nbytes == 0


@pytest.mark.parametrize("attn", ["linear", "linear+gated"])
def test_linear_attention_decodes_like_recomputing_with_left_padding(attn):
    model = make_model({**LLAMA, "attn": attn})
    ids = torch.randint(0, VOCAB, (2, 5))
    key_mask = torch.ones(2, 5, dtype=torch.bool)
    key_mask[0, :2] = False
    cached = model.generate(ids, 6, key_mask=key_mask)
    assert torch.equal(cached, model.generate(ids, 6, key_mask=key_mask, use_cache=False))
    assert torch.equal(cached[0], model.generate(ids[:1, 2:], 6)[0]), "padding changed the short prompt"


def test_linear_attention_refuses_a_score_bias_naming_the_position():
    base = {**TINY, "placement": "pre", "norm": "rmsnorm", "mlp": "gelu", "attn": "linear"}
    reason = check_combination({**base, "pos": "alibi"})
    assert reason is not None and "pos=alibi" in reason and "score bias" in reason, reason
    assert check_combination({**base, "pos": "rotary"}) is None
    assert check_combination({**base, "attn": "mla", "pos": "alibi"}) is None  # latent attention has scores

    class Kerple(Position):  # a position from elsewhere: what it provides follows from what it overrides
        def score_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
            return torch.zeros(())

    assert Kerple.provides == {"score bias"} and Position.provides == frozenset()


def test_linear_attention_rejects_a_key_narrower_than_the_rotation():
    cfg = {**TINY, "placement": "pre", "norm": "rmsnorm", "mlp": "gelu", "pos": "rotary"}
    with pytest.raises(ConfigError, match="block.attn.d_key=2"):
        build_block({**cfg, "attn": {"name": "linear", "d_key": 2}})
    build_block({**cfg, "pos": {"name": "rotary", "rotary_fraction": 0.5}, "attn": {"name": "linear", "d_key": 2}})


@pytest.mark.parametrize(
    ("attn", "field"),
    [
        ({"name": "mla", "kv_rank": 0}, "block.attn.kv_rank=0"),
        ({"name": "mla", "q_rank": -1}, "block.attn.q_rank=-1"),
        ({"name": "mla", "latent_norm": "batchnorm"}, "block.attn.latent_norm='batchnorm'"),
        ({"name": "linear", "chunk": 0}, "block.attn.chunk=0"),
        ({"name": "linear", "d_key": 0}, "block.attn.d_key=0"),
        ({"name": "linear", "decay": "exp"}, "block.attn.decay='exp'"),
        ({"name": "gated_deltanet", "conv": 0}, "block.attn.conv=0"),
        ({"name": "gated_deltanet", "chunk": 0}, "block.attn.chunk=0"),
        ({"name": "gated_deltanet", "d_key": 0}, "block.attn.d_key=0"),
        ({"name": "gated_deltanet", "backend": "flash"}, "block.attn.backend='flash'"),
        ({"name": "gated_deltanet", "n_key_heads": 3}, "block.attn.n_key_heads=3: must divide block.n_heads=4"),
        ({"name": "gated_deltanet", "n_key_heads": 0}, "block.attn.n_key_heads=0"),
        ({"name": "gated_deltanet", "norm_eps": 0.0}, "block.attn.norm_eps=0.0: must be > 0"),
        ({"name": "gated_deltanet", "allow_neg_eigval": "yes"}, "block.attn.allow_neg_eigval='yes'"),
    ],
)
def test_bad_options_name_the_field(attn, field):
    cfg = {**TINY, "placement": "pre", "norm": "rmsnorm", "mlp": "gelu", "pos": "none", "attn": attn}
    with pytest.raises(ConfigError) as error:
        build_block(cfg)
    assert field in str(error.value), str(error.value)


def test_a_sweep_records_a_refused_combination_as_incompatible_not_failed(tmp_path):
    from omegaconf import OmegaConf

    from zoo import compose
    from zoo.lab.records.exit_status import runs_not_done
    from zoo.lab.training.run import run

    small = ["block.d_model=16", "block.n_heads=4", "model.n_layers=1", "task.max_bytes=20000", "task.seq_len=16"]
    cfg = compose(["attn=linear", "pos=alibi", *small, "train.steps=2", "train.batch_size=2", "threads=1"])
    summary = run(OmegaConf.create(cfg), tmp_path / "run")
    assert summary["status"] == "incompatible" and "pos=alibi" in summary["error"], summary
    assert runs_not_done(tmp_path) == [], "a refused combination is a result of the grid, not a failure"


@pytest.mark.parametrize("conv", [1, 4])
def test_gated_deltanet_state_holds_the_matrix_and_the_convolutions_last_inputs(conv):
    """One (d_key, d_head) matrix per head and the last conv - 1 inputs of the convolution's
    n_heads x (2 d_key + d_head) channels, whatever the length; it cannot rewind."""
    attn = {"name": "gated_deltanet", "d_key": 6, "conv": conv}
    short, state = state_bytes(attn, tokens=3)
    long, _ = state_bytes(attn, tokens=30)
    d_head = D // H
    assert isinstance(state.mixer, DeltaState)
    assert state.mixer.matrix.shape == (2, H, 6, d_head)
    assert state.mixer.conv.shape == (2, conv - 1, H * (2 * 6 + d_head))
    assert short == long == 2 * (H * 6 * d_head + (conv - 1) * H * (2 * 6 + d_head)) * 8
    with pytest.raises(ConfigError, match="cannot rewind"):
        state.truncate(2)
    state.reset()
    assert state.length == 0 and state.nbytes == 0


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_gated_deltanet_decodes_like_recomputing_with_left_padding(backend):
    """Padding enters the convolution as zeros and neither writes nor decays the state: a left-padded
    prompt generates what it generates alone, cached or not."""
    model = make_model({**LLAMA, "attn": "gated_deltanet"}, attn={"backend": backend, "chunk": 2})
    ids = torch.randint(0, VOCAB, (2, 5))
    key_mask = torch.ones(2, 5, dtype=torch.bool)
    key_mask[0, :2] = False
    cached = model.generate(ids, 6, key_mask=key_mask)
    assert torch.equal(cached, model.generate(ids, 6, key_mask=key_mask, use_cache=False))
    assert torch.equal(cached[0], model.generate(ids[:1, 2:], 6)[0]), "padding changed the short prompt"


def test_gated_deltanet_refuses_encoders_cross_attention_score_biases_and_a_tp_that_splits_a_head():
    from zoo.assembly.compat import tp_refusal
    from zoo.assembly.spec import resolve_block

    base = {**TINY, "placement": "pre", "norm": "rmsnorm", "mlp": "gelu", "pos": "none", "attn": "gated_deltanet"}
    assert check_combination(base) is None
    reason = check_combination({**base, "causal": False})
    assert reason is not None and "block.attn.name='gated_deltanet': is causal only" in reason, reason
    reason = check_combination({**base, "cross_attention": True})
    assert reason is not None and "attn=gated_deltanet has no cross-attention" in reason, reason
    reason = check_combination({**base, "pos": "alibi"})
    assert reason is not None and "pos=alibi" in reason and "score bias" in reason, reason
    assert tp_refusal(resolve_block(base), 2) is None  # its plan: whole heads per rank
    refusal = tp_refusal(resolve_block(base), 3)
    assert refusal is not None and "parallel.tp=3: must divide block.n_heads=4" in str(refusal), refusal
    grouped = {**base, "attn": {"name": "gated_deltanet", "n_key_heads": 1}}  # one key head for the four value heads
    refusal = tp_refusal(resolve_block(grouped), 2)
    assert refusal is not None and "parallel.tp=2: must divide block.attn.n_key_heads=1" in str(refusal), refusal


def test_gated_deltanet_with_fewer_key_heads_holds_the_value_heads_states_and_fewer_channels():
    """n_key_heads = 2 for 4 value heads: a (d_key, d_head) matrix per value head, and the convolution's last inputs
    over 2 x (2 d_key) + 4 d_head channels; its qkv has those rows."""
    attn = {"name": "gated_deltanet", "d_key": 6, "n_key_heads": 2}
    nbytes, state = state_bytes(attn, tokens=5)
    d_head = D // H
    channels = 2 * 2 * 6 + H * d_head
    assert state.mixer.matrix.shape == (2, H, 6, d_head) and state.mixer.conv.shape == (2, 3, channels)
    assert nbytes == 2 * (H * 6 * d_head + 3 * channels) * 8


def test_gated_deltanets_options_at_their_defaults_leave_config_hashes_as_they_were():
    """n_key_heads (null), allow_neg_eigval (false) and norm_eps (1e-5) are out of the hash at their defaults: the
    hash below was recorded before the options existed; set, each is a new run."""
    from helpers import tiny

    from zoo.lab.records.config import config_hash

    config = tiny("attn=gated_deltanet")
    assert {"n_key_heads": None, "allow_neg_eigval": False, "norm_eps": 1e-5}.items() <= config["block"]["attn"].items()
    assert config_hash(config) == "a136122f0d36426a"
    changed = [tiny("attn=gated_deltanet", f"block.attn.{key}")
               for key in ("n_key_heads=2", "allow_neg_eigval=true", "norm_eps=1e-6")]  # fmt: skip
    assert len({config_hash(c) for c in changed} | {"a136122f0d36426a"}) == 4
