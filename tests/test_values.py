"""Value residual (block.attn.value_residual, ResFormer) and value embeddings (model.value_embeddings), and
the side channel that carries them (zoo.core.channel): the equations by hand on tiny tensors, the model
contract's checks on models that use them, the zero-weight identity, errors and counts."""

from __future__ import annotations

import math

import pytest
import torch
from test_contract import MODEL_CHECKS, PATTERN_CHECKS, Built, left_padded_batch_equals_each_prompt_alone

from zoo import ConfigError, build_block, build_model
from zoo.core.channel import Channel
from zoo.parts.attention import split_qkv
from zoo.testing.combos import VOCAB, make_model
from zoo.testing.contract import close

COMBO = {"placement": "pre", "norm": "rmsnorm", "attn": "gqa+vres", "pos": "rotary", "mlp": "swiglu"}
BLOCK = {"placement": "pre", "norm": "rmsnorm", "pos": "none", "mlp": "gelu", "d_model": 16, "n_heads": 4}


def model_of(attn: dict, n_layers: int = 2, value_embeddings: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    cfg = {"block": {**BLOCK, "attn": attn}, "model": {"n_layers": n_layers, "vocab_size": VOCAB}}
    cfg["model"]["value_embeddings"] = value_embeddings
    return build_model(cfg).double().eval()


class Made(Built):
    """The contract's Built with a model of our own making."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(COMBO)
        self._made["model"] = model


CHECKS = {**MODEL_CHECKS, **PATTERN_CHECKS, "left padded": left_padded_batch_equals_each_prompt_alone}


@pytest.mark.parametrize(
    "mix, value_embeddings",
    [("learned", False), ("per_token", False), ("learned", True), ("none", True)],
    ids=["learned", "per_token", "learned+embeddings", "embeddings"],
)
@pytest.mark.parametrize("check", list(CHECKS), ids=lambda name: name.replace(" ", "_"))
def test_the_model_contract_holds_with_value_residual_and_embeddings(mix, value_embeddings, check):
    """Cached decoding (in chunks, static), left padding, causality and gradients to every parameter, on
    3 layers: layers 1 and 2 read what layer 0 wrote, each step the new tokens' values only."""
    torch.manual_seed(0)
    attn = COMBO["attn"].partition("+")[0]
    model = make_model({**COMBO, "attn": attn}, n_layers=3, value_embeddings=value_embeddings,
                       attn={"value_residual": mix})  # fmt: skip
    CHECKS[check](Made(model))


def qkv_rows(attn: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (b, h, t, d), k and v (b, g, t, d) of ``x`` from ``attn``'s fused weights, split by hand."""
    wq, wk, wv = split_qkv(attn.qkv.weight, attn.n_heads, attn.n_kv_heads)
    bq, bk, bv = split_qkv(attn.qkv.bias, attn.n_heads, attn.n_kv_heads)
    heads = [(x @ w.T + b).unflatten(-1, (-1, attn.d_head)).transpose(1, 2) for w, b in ((wq, bq), (wk, bk), (wv, bv))]
    return heads[0], heads[1], heads[2]


def attention_by_hand(attn: torch.nn.Module, x: torch.Tensor, v: torch.Tensor, q, k) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal mask) v, query head h reading kv head h // (h / g), then ``out``."""
    group = attn.n_heads // attn.n_kv_heads
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(attn.d_head)
    t = x.shape[1]
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2)
    return attn.out(y)


def inputs_and_outputs(model, ids):
    """Each attention's input and output in a forward of ``ids``."""
    seen = {}
    hooks = [
        block.attn.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__(i, (args[0], out)))
        for i, block in enumerate(model.blocks)
    ]
    model(ids)
    for h in hooks:
        h.remove()
    return seen


@pytest.mark.parametrize("value_embeddings", [False, True], ids=["values", "with_embeddings"])
def test_layer_one_mixes_layer_zeros_values_as_resformers_equation(value_embeddings):
    """Zhou et al. 2024, learnable form: V_n' = λ1 V_n + λ2 V_1, V_1 layer 0's values; with value embeddings,
    each layer's values first take v + 2 sigmoid(x[..., :c] W) ve (nanochat). Computed by hand from the
    weights, on tiny tensors, for layer 1 of a 2-layer GQA model."""
    model = model_of({"name": "gqa", "value_residual": "learned"}, value_embeddings=value_embeddings)
    with torch.no_grad():
        model.blocks[1].attn.value_mix.lambdas.copy_(torch.tensor([0.7, -1.3], dtype=torch.float64))
    ids = torch.randint(0, VOCAB, (2, 5))
    seen = inputs_and_outputs(model, ids)
    values = []
    for i in (0, 1):
        attn, x = model.blocks[i].attn, seen[i][0]
        q, k, v = qkv_rows(attn, x)
        if value_embeddings:
            ve = model.value_embeds[i].weight[ids].unflatten(-1, (attn.n_kv_heads, attn.d_head)).transpose(1, 2)
            gate = 2 * torch.sigmoid(x[..., :16] @ attn.value_gate.proj.weight.T)  # c = min(32, d_model)
            v = v + gate.transpose(1, 2)[..., None] * ve
        values.append((q, k, v))
    q, k, v = values[1]
    mixed = 0.7 * v - 1.3 * values[0][2]
    close(seen[1][1], attention_by_hand(model.blocks[1].attn, seen[1][0], mixed, q, k), 1e-12, "layer 1's output")
    q, k, v = values[0]
    close(seen[0][1], attention_by_hand(model.blocks[0].attn, seen[0][0], v, q, k), 1e-12, "layer 0's output")


def test_per_token_value_residual_follows_its_formula():
    """per_token: v_n' = (1 - w) v_n + w v_1, w = sigmoid(x W_r + b_r) per token and key/value head."""
    model = model_of({"name": "gqa", "value_residual": "per_token"})
    ids = torch.randint(0, VOCAB, (2, 5))
    seen = inputs_and_outputs(model, ids)
    attn, x = model.blocks[1].attn, seen[1][0]
    q, k, v = qkv_rows(attn, x)
    first = qkv_rows(model.blocks[0].attn, seen[0][0])[2]
    w = torch.sigmoid(model.blocks[1].attn.value_mix.proj(x)).transpose(1, 2)[..., None]
    close(seen[1][1], attention_by_hand(attn, x, (1 - w) * v + w * first, q, k), 1e-12, "layer 1's output")


def test_value_residual_at_zero_weight_equals_none():
    """λ1 = 1, λ2 = 0: the same weights compute the model without value residual, to the last bit; at the
    initial (0.5, 0.5) they do not (the mixing is applied)."""
    ids = torch.randint(0, VOCAB, (2, 7))
    plain = model_of({"name": "gqa"}, n_layers=3)
    mixed = model_of({"name": "gqa", "value_residual": "learned"}, n_layers=3)
    missing, unexpected = mixed.load_state_dict(plain.state_dict(), strict=False)
    assert sorted(missing) == ["blocks.1.attn.value_mix.lambdas", "blocks.2.attn.value_mix.lambdas"]
    assert not unexpected
    assert not torch.allclose(mixed(ids), plain(ids)), "value residual at its initial weights changes nothing"
    with torch.no_grad():
        for i in (1, 2):
            mixed.blocks[i].attn.value_mix.lambdas.copy_(torch.tensor([1.0, 0.0]))
    close(mixed(ids), plain(ids), 0, "logits at λ = (1, 0)")


def test_the_first_layer_mixes_nothing_and_a_block_alone_runs_as_without():
    """Layer 0 writes its values and has no mixing weights; a block alone (no stack, no channel) none either."""
    model = model_of({"name": "mha", "value_residual": "learned"}, n_layers=3)
    assert model.blocks[0].attn.value_mix is None and model.blocks[0].attn.writes_first
    assert model.channel_layers == [True, True, True]
    block = build_block({**BLOCK, "attn": {"name": "mha", "value_residual": "learned"}})
    assert not any("value" in name for name, _ in block.named_parameters())
    assert build_model({"block": {**BLOCK, "attn": "mha"}}).channel_layers == [False] * 4  # by default: no channel


def test_a_read_nothing_provides_is_refused_by_field():
    """Value residual on a layer after a Gated DeltaNet first layer: nothing writes first_values."""
    cfg = {"block": {**BLOCK, "attn": {"name": "gqa", "value_residual": "learned"}}}
    cfg["model"] = {"n_layers": 2, "pattern": [{"attn": "gated_deltanet"}, {}]}
    with pytest.raises(ConfigError, match=r"model\.layers\.1\.attn\.value_residual='learned'.*'first_values'"):
        build_model(cfg)
    cfg["model"] = {"n_layers": 2, "layers": {0: {"attn": {"value_residual": "none"}}}}
    with pytest.raises(ConfigError, match=r"nothing before layer 1 writes"):
        build_model(cfg)


@pytest.mark.parametrize("attn", ["mla", "linear", "gated_deltanet"])
def test_other_mixers_refuse_value_residual_by_name(attn):
    with pytest.raises(ConfigError, match=rf"block\.attn\.value_residual='learned': not an option of attn '{attn}'"):
        build_model({"block": {**BLOCK, "attn": {"name": attn, "value_residual": "learned"}}})


def test_value_embeddings_are_refused_where_a_layer_takes_none():
    cfg = {"block": {**BLOCK, "attn": "mha"}, "model": {"n_layers": 2, "value_embeddings": True}}
    cfg["model"]["layers"] = {1: {"attn": "gated_deltanet"}}
    with pytest.raises(ConfigError, match=r"model\.value_embeddings=True: .*layer 1's attention \(GatedDeltaNet\)"):
        build_model(cfg)
    with pytest.raises(ConfigError, match=r"model\.value_embeddings=1: must be true or false"):
        build_model({"block": {**BLOCK, "attn": "mha"}, "model": {"value_embeddings": 1}})


def test_value_residual_is_refused_under_tensor_parallelism():
    from zoo import resolve_block
    from zoo.assembly.compat import tp_refusal

    spec = resolve_block({**BLOCK, "attn": {"name": "gqa", "value_residual": "learned"}})
    error = tp_refusal(spec, 2)
    assert error is not None and error.field == "block.attn.value_residual" and "parallel.tp=2" in str(error)


def test_counts_flops_and_optimizer_treatment():
    """Value embedding tables count as embedding (no FLOPs), the mixing weights and gates as attention; FLOPs
    add 6 x those parameters and the documented elementwise cost; Muon leaves scalars and tables to AdamW."""
    from zoo.lab.recipe.muon import treatments

    plain = model_of({"name": "gqa"}, n_layers=3)
    both = model_of({"name": "gqa", "value_residual": "learned"}, n_layers=3, value_embeddings=True)
    kv = 2 * 4  # n_kv_heads x d_head
    counts, before = both.parameter_counts(), plain.parameter_counts()
    assert counts["embedding"] - before["embedding"] == 3 * VOCAB * kv
    gates = 3 * 16 * 2  # c = d_model = 16 inputs, 2 kv heads, per layer
    assert counts["attention"] - before["attention"] == 2 * 2 + gates
    extra = 6 * (2 * 2 + gates) + 2 * 9 * kv + 3 * 3 * (2 * kv + 2 * 2)
    assert both.flops_per_token(8) - plain.flops_per_token(8) == extra
    how = treatments(both)
    assert how["blocks.1.attn.value_mix.lambdas"].kind == "adamw"
    assert how["value_embeds.0.weight"].kind == "adamw"
    assert how["blocks.0.attn.value_gate.proj.weight"].kind == "muon"


def test_mup_pairs_the_new_parameters_across_widths():
    """μP infers each parameter's role from two widths: the value tables grow on their fan-out (input), the
    gates' inputs are a fixed c = 32 features (fixed at widths above 32), the mixing scalars fixed."""
    from zoo.assembly.mup import infer

    def build(width: int):
        cfg = {"block": {**BLOCK, "d_model": width, "attn": {"name": "gqa", "value_residual": "learned"}}}
        return build_model({**cfg, "model": {"n_layers": 2, "value_embeddings": True}})

    roles = {name: scaling.role for name, scaling in infer(build, 128, 64).scalings.items()}
    assert roles["value_embeds.0.weight"] == "input"
    assert roles["blocks.1.attn.value_mix.lambdas"] == "fixed"
    assert roles["blocks.0.attn.value_gate.proj.weight"] == "fixed"


def test_activation_checkpointing_keeps_the_gradients():
    """Recomputing each block in backward: the entries layer 0 wrote still carry their gradient."""
    model = model_of({"name": "gqa", "value_residual": "learned"}, n_layers=3, value_embeddings=True)
    ids = torch.randint(0, VOCAB, (2, 6))
    grads = []
    for recompute in (False, True):
        model.zero_grad(set_to_none=True)
        model.checkpoint_blocks = recompute
        model(ids).square().sum().backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    for name, grad in grads[0].items():
        close(grads[1][name], grad, 1e-12, name)


def test_a_channel_names_what_nothing_wrote():
    channel = Channel(torch.zeros(1, 2, dtype=torch.long))
    channel.layer = 3
    with pytest.raises(KeyError, match=r"layer 3 reads side-channel entry 'first_values', which nothing wrote"):
        channel.read("first_values")


def test_export_to_transformers_refuses_them_by_name():
    from zoo.models.hf import to_hf_model

    llama = {**BLOCK, "norm": "rmsnorm", "pos": "rotary", "mlp": "swiglu", "bias": False}
    model = build_model({"block": {**llama, "attn": {"name": "gqa", "value_residual": "learned"}}})
    with pytest.raises(ConfigError, match=r"block\.attn\.value_residual='learned'.*needs .*value_residual='none'"):
        to_hf_model(model)
    model = build_model({"block": {**llama, "attn": "gqa"}, "model": {"value_embeddings": True}})
    with pytest.raises(ConfigError, match=r"model\.value_embeddings=True.*needs model\.value_embeddings=False"):
        to_hf_model(model)
