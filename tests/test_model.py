"""The decoder-only language model stacked from blocks."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import seeded_draws

import zoo
from zoo import POSITIONS, ConfigError, build_block, build_model, compose


def tiny_model(*overrides: str):
    cfg = compose(["block.d_model=32", "block.n_heads=4", "model.n_layers=2", *overrides])
    return build_model(cfg)


def test_logits_shape_and_causality():
    model = tiny_model("preset=llama").double().eval()
    ids = torch.randint(0, 256, (2, 9))
    logits = model(ids)
    assert logits.shape == (2, 9, 256)
    changed = ids.clone()
    changed[:, 5:] = torch.randint(0, 256, (2, 4))
    torch.testing.assert_close(model(changed)[:, :5], logits[:, :5], rtol=0, atol=1e-12)


def test_parameter_counts_add_up():
    model = tiny_model("preset=gpt")
    counts = model.parameter_counts()
    assert counts["total"] == model.num_parameters() == sum(v for k, v in counts.items() if k != "total")
    assert counts["embedding"] == 256 * 32 + 1024 * 32  # tokens and GPT-2's learned positions; tied head adds nothing
    assert counts["attention"] == 2 * (32 * 96 + 96 + 32 * 32 + 32)
    assert model.flops_per_token(64) > 6 * (counts["total"] - counts["embedding"])


def test_post_norm_stack_has_no_final_norm():
    assert isinstance(tiny_model("preset=vaswani").final_norm, torch.nn.Identity)
    assert not isinstance(tiny_model("preset=gpt").final_norm, torch.nn.Identity)


def test_untied_head_is_its_own_parameter():
    tied, untied = tiny_model(), tiny_model("model.tie_embeddings=false")
    assert tied.head is None and untied.head is not None
    assert untied.parameter_counts()["embedding"] == 2 * tied.parameter_counts()["embedding"]
    assert "head.weight" in dict(untied.named_parameters())


def test_init_scales_residual_outputs_by_depth():
    torch.manual_seed(0)
    model = build_model(compose(["block.d_model=128", "block.n_heads=4", "model.n_layers=8"]))
    weights = dict(model.named_parameters())
    assert abs(weights["blocks.0.attn.qkv.weight"].std().item() - 0.02) < 0.002
    for name in ("blocks.3.attn.out.weight", "blocks.3.mlp.down.weight"):
        assert abs(weights[name].std().item() - 0.02 / 4) < 0.0005, name  # 0.02 / sqrt(2 * 8)
    assert torch.all(weights["blocks.0.attn.qkv.bias"] == 0)


def test_per_layer_overrides_from_the_command_line():
    model = tiny_model("model.n_layers=4", "+model.layers.3.attn=mqa", "+model.layers.1.attn.n_kv_heads=2")
    assert [block.attn.n_kv_heads for block in model.blocks] == [4, 2, 4, 1]
    mixed = tiny_model("preset=llama", "model.n_layers=3", "+model.layers.0.mlp=gelu", "+model.layers.2.norm=layernorm")
    assert type(mixed.blocks[0].mlp).__name__ == "GeluMLP" and type(mixed.blocks[1].mlp).__name__ == "SwiGLU"
    assert type(mixed.blocks[2].placement.norms[0]).__name__ == "LayerNorm"
    assert type(mixed.final_norm).__name__ == "LayerNorm"  # the last block's norm


def test_per_layer_overrides_from_a_dict():
    block = {"d_model": 32, "n_heads": 4, "placement": "pre", "norm": "rmsnorm", "attn": "gqa", "pos": "rotary"}
    cfg = {"block": {**block, "mlp": "swiglu"}, "model": {"n_layers": 3, "layers": {2: {"attn": "mha"}}}}
    model = build_model(cfg)
    assert [block.attn.n_kv_heads for block in model.blocks] == [2, 2, 4]


@pytest.mark.parametrize(
    ("overrides", "field", "allowed"),
    [
        (["+model.layers.4.attn=mqa"], "model.layers.4=4", "0..3"),
        (["+model.layers.x.attn=mqa"], "model.layers.x='x'", "layer index"),
        (["+model.layers.1.attn=mqb"], "model.layers.1.attn.name='mqb'", "did you mean 'mqa'"),
        (["+model.layers.1.attn.n_kv_heads=3"], "model.layers.1.attn.n_kv_heads=3", "must divide"),
        (["+model.layers.1.d_model=64"], "model.layers.1.d_model=64", "must equal block.d_model=32"),
        (["+model.layers.1.d_modle=64"], "model.layers.1.d_modle=64", "unknown key"),
        (["+model.layers.1=mqa"], "model.layers.1='mqa'", "mapping of block overrides"),
        (["+model.n_layer=3"], "model.n_layer=3", "unknown key"),
        (["model.n_layers=0"], "model.n_layers=0", "positive integer"),
        (["model.vocab_size=-1"], "model.vocab_size=-1", "positive integer"),
        (["model.tie_embeddings=maybe"], "model.tie_embeddings='maybe'", "true or false"),
        (["block.cross_attention=true"], "block.cross_attention=True", "build_seq2seq"),
        (["+model.layers.2.cross_attention=true"], "model.layers.2.cross_attention=True", "build_seq2seq"),
    ],
)
def test_bad_model_config_names_the_field(overrides, field, allowed):
    with pytest.raises(ConfigError) as error:
        tiny_model("model.n_layers=4", *overrides)
    assert field in str(error.value) and allowed in str(error.value), str(error.value)


@pytest.mark.parametrize("pos", POSITIONS.names())
@pytest.mark.parametrize("window", [None, 3])
def test_every_position_in_a_model_caches_and_stays_causal(pos, window):
    """Absolute positions (learned, sinusoidal) continue after the cached tokens; score biases and
    windows count from absolute positions too."""
    model = tiny_model(f"pos={pos}", "block.max_len=16", f"block.attn.window={window or 'null'}").double().eval()
    ids = torch.randint(0, 256, (2, 9))
    logits = model(ids)
    caches = model.new_caches()
    steps = [model(ids[:, :4], caches=caches)] + [model(ids[:, t : t + 1], caches=caches) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), logits, rtol=0, atol=1e-10)
    changed = ids.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 256
    torch.testing.assert_close(model(changed)[:, :5], logits[:, :5], rtol=0, atol=1e-12)
    model.train()
    model(ids).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name} gets no gradient"


def test_absolute_positions_make_order_visible():
    ids = torch.randint(0, 256, (1, 6))
    swapped = ids[:, [1, 0, 2, 3, 4, 5]]
    for pos, sees_order in [("none", False), ("learned", True), ("sinusoidal", True)]:
        model = tiny_model(f"pos={pos}", "block.max_len=16", "model.n_layers=1").double().eval()
        # The last position sees the same tokens in both: only positions can tell the order.
        differs = not torch.allclose(model(ids)[0, -1], model(swapped)[0, -1])
        assert differs == sees_order, pos


def test_init_draws_every_weight_from_its_name_with_residual_outputs_scaled_by_depth():
    model = build_model(compose(["block.d_model=32", "block.n_heads=4", "model.n_layers=3", "preset=gpt",
                                 "model.tie_embeddings=false"]))  # fmt: skip
    model.reset_parameters(seed=11)
    weights = dict(model.named_parameters())
    expected = seeded_draws(model, 11, residual_std=0.02 / math.sqrt(2 * 3))
    assert {"embed.weight", "head.weight", "blocks.2.attn.out.weight", "blocks.2.mlp.down.weight"} <= set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(weights[name].detach(), value, rtol=0, atol=0, msg=name)


def test_flops_per_token_counts_every_matmul_and_the_lm_head_once():
    """6 x (block matrices, biases and norms + the LM head's vocab x d_model) + 6 x layers x seq_len x d_model,
    counted here from the sizes: tied or not, the head's matmul is done once per token."""
    d, d_ff, layers, vocab, seq = 16, 24, 2, 32, 64
    block = {"d_model": d, "n_heads": 2, "d_ff": d_ff, "bias": True, "placement": "pre", "norm": "layernorm",
             "attn": "mha", "pos": "none", "mlp": "gelu"}  # fmt: skip
    attention = (d * 3 * d + 3 * d) + (d * d + d)
    mlp = (d * d_ff + d_ff) + (d_ff * d + d)
    norms = 2 * (2 * d)  # two LayerNorms of weight and bias
    dense = layers * (attention + mlp + norms) + 2 * d + vocab * d  # + the final norm and the LM head
    expected = 6 * dense + 6 * layers * seq * d
    for tied in (True, False):
        model_section = {"n_layers": layers, "vocab_size": vocab, "tie_embeddings": tied}
        model = build_model({"block": block, "model": model_section})
        assert model.flops_per_token(seq) == expected, tied


def test_flops_per_token_counts_a_sliding_window_by_the_keys_each_query_sees():
    """A windowed layer: 6 x min(window, seq_len) x d_model in place of 6 x seq_len x d_model (by hand: d 16,
    window 5, seq 64: 480 per layer, not 6144); an encoder block's window reaches both sides, 2 window - 1 keys."""
    d, layers, vocab = 16, 2, 32
    block = {"d_model": d, "n_heads": 4, "d_ff": 24, "bias": True, "placement": "pre", "norm": "layernorm",
             "attn": {"name": "gqa", "window": 5}, "pos": "rotary", "mlp": "gelu"}  # fmt: skip
    model = build_model({"block": block, "model": {"n_layers": layers, "vocab_size": vocab}})
    full = build_model({"block": {**block, "attn": "gqa"}, "model": {"n_layers": layers, "vocab_size": vocab}})
    assert model.num_parameters() == full.num_parameters()
    assert full.flops_per_token(64) - model.flops_per_token(64) == layers * (6144 - 480)
    assert model.flops_per_token(64) == 6 * model.num_parameters() + layers * 480
    assert model.flops_per_token(3) == full.flops_per_token(3)  # a window wider than the sequence is no window
    s2s = {"block": {**block, "attn": "gqa"}, "model": {"n_layers": 1, "vocab_size": vocab}}
    windowed = zoo.build_seq2seq({**s2s, "encoder": {"n_layers": 1, "block": {"attn": {"window": 5}}}})
    assert zoo.build_seq2seq(s2s).flops_per_token(64) - windowed.flops_per_token(64) == 6 * (64 - 9) * d


@pytest.mark.parametrize("attn", ["mha", "gqa", "mla"])
def test_flops_per_token_counts_the_attention_output_options(attn):
    """Over the same model without them, per layer: 6 x the new parameters (the gate's weights and biases, the sinks),
    plus 3 x (forward + 2 backward) the elementwise work counted from the sizes: the gate's sigmoids and product,
    the sink's rescaling of the heads, XSA's unit values (per key/value head) and removal (per head)."""
    d, heads, layers, seq = 16, 4, 2, 64
    d_head, kv = d // heads, {"mha": heads, "gqa": 2, "mla": heads}[attn]

    def flops(**options):
        block = {"d_model": d, "n_heads": heads, "bias": True, "placement": "pre", "norm": "layernorm",
                 "attn": {"name": attn, **options}, "pos": "none", "mlp": "gelu"}  # fmt: skip
        return build_model({"block": block, "model": {"n_layers": layers, "vocab_size": 32}}).flops_per_token(seq)

    base = flops()
    headwise = 6 * (d * heads + heads) + 3 * (heads * d_head + heads)
    elementwise = 6 * (d * heads * d_head + heads * d_head) + 3 * (2 * heads * d_head)
    sink = 6 * heads + 3 * heads * d_head
    xsa = 3 * (3 * kv * d_head + 4 * heads * d_head)
    assert flops(gate="headwise") - base == layers * headwise
    assert flops(gate="elementwise") - base == layers * elementwise
    assert flops(sink="learned") - base == layers * sink
    assert flops(xsa=True) - base == layers * xsa
    assert flops(gate="elementwise", sink="learned", xsa=True) - base == layers * (elementwise + sink + xsa)


def test_flops_per_token_counts_gated_deltanets_chunked_form_in_place_of_softmax_attention():
    """Gated DeltaNet's layers: 6 x their parameters (projections, convolution taps, gains) plus, per
    head and token, chunk (3 d_key + 2 d_head) + 3 d_key d_head multiply-adds of the chunked form, x 6;
    the chunk is the sequence when shorter. A hybrid counts softmax attention's term for its other layers."""
    d, heads, d_key, chunk, vocab = 16, 2, 4, 8, 32
    d_head = d // heads
    attn = {"name": "gated_deltanet", "d_key": d_key, "chunk": chunk}
    block = {"d_model": d, "n_heads": heads, "d_ff": 24, "bias": False, "placement": "pre", "norm": "rmsnorm",
             "attn": attn, "pos": "none", "mlp": "gelu"}  # fmt: skip
    model = build_model({"block": block, "model": {"n_layers": 2, "vocab_size": vocab}})
    channels = heads * (2 * d_key + d_head)
    attention = d * channels + channels * 4 + 2 * d * heads + 2 * heads + d_head + 2 * d * heads * d_head
    assert model.parameter_counts()["attention"] == 2 * attention
    dense = model.num_parameters()  # the blocks, the final norm, and the tied embedding once: the head's matmul
    for seq, used in ((64, chunk), (5, 5)):
        mixing = 6 * heads * (used * (3 * d_key + 2 * d_head) + 3 * d_key * d_head)
        assert model.flops_per_token(seq) == 6 * dense + 2 * mixing, seq
    layers = {1: {"attn": "mha"}}
    hybrid = build_model({"block": block, "model": {"n_layers": 2, "vocab_size": vocab, "layers": layers}})
    mixing = 6 * heads * (chunk * (3 * d_key + 2 * d_head) + 3 * d_key * d_head)
    assert hybrid.flops_per_token(64) == 6 * hybrid.num_parameters() + mixing + 6 * 64 * d


@pytest.mark.parametrize(("preset", "embedding"), [("gpt", "LearnedEmbedding"), ("vaswani", "SinusoidalEmbedding")])
def test_presets_build_the_model_they_name_with_its_positions(preset, embedding):
    """GPT-2 adds learned positions (1024 of them), the original Transformer sinusoidal ones: the last
    token's logits then depend on the order of the tokens before it, which a one-layer causal model
    without positions cannot see (its attention over the prefix is a set operation)."""
    model = tiny_model(f"preset={preset}", "model.n_layers=1").double().eval()
    assert type(model.pos_embed).__name__ == embedding
    if preset == "gpt":
        assert model.pos_embed.weight.shape == (1024, 32)
    ids = torch.randint(0, 256, (1, 6))
    swapped = ids[:, [1, 0, 2, 3, 4, 5]]
    assert not torch.allclose(model(ids)[:, -1], model(swapped)[:, -1])
    order_blind = tiny_model(f"preset={preset}", "pos=none", "model.n_layers=1").double().eval()
    torch.testing.assert_close(order_blind(ids)[:, -1], order_blind(swapped)[:, -1])


@pytest.mark.parametrize("preset", ["gpt", "vaswani"])
def test_a_lone_block_of_a_preset_says_why_not_and_builds_for_a_model(preset):
    block = compose([f"preset={preset}", "block.d_model=32", "block.n_heads=4"]).block
    with pytest.raises(ConfigError, match=r"block.pos.name='\w+': needs embedding: .*context='model'"):
        build_block(block)
    assert build_block(block, context="model").attn.position.embedding() is not None


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["+model.layers.1.pos=learned"], "model.layers.1.pos='learned'"),
        (["pos=sinusoidal", "+model.layers.2.pos=rotary"], "model.layers.2.pos='rotary'"),
        (["pos=learned", "+model.layers.1.pos=sinusoidal"], "model.layers.1.pos='sinusoidal'"),
        (["pos=learned", "+model.layers.1.max_len=32"], "model.layers.1.pos='learned'"),
        (["pos=rotary", "+model.layers.0.pos=learned"], "model.layers.0.pos='learned'"),  # the layer that set it
    ],
)
def test_per_layer_embedding_positions_are_rejected_naming_the_layer(overrides, field):
    with pytest.raises(ConfigError) as error:
        tiny_model("model.n_layers=3", "block.max_len=16", *overrides)
    assert field in str(error.value) and "set them once with block.pos" in str(error.value), str(error.value)


def test_per_layer_positions_inside_attention_still_mix():
    model = tiny_model("model.n_layers=3", "pos=rotary", "+model.layers.1.pos=alibi", "+model.layers.2.pos=none")
    assert [type(b.attn.position).__name__ for b in model.blocks] == ["Rotary", "ALiBi", "NoPosition"]
    assert model.pos_embed is None


def test_a_sinusoidal_model_draws_its_token_embedding_at_d_model_to_the_minus_half():
    """Tokens scaled by sqrt(d_model) in the forward, drawn with std d_model^-0.5: per element about 1, as
    the table's sin and cos (the original Transformer); everything else as under any other position."""
    model = build_model(compose(["block.d_model=64", "block.n_heads=4", "model.n_layers=2", "preset=vaswani"]))
    model.reset_parameters(seed=3)
    expected = seeded_draws(model, 3, residual_std=0.02 / 2, embed_std=64**-0.5)
    for name, value in expected.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].detach(), value, rtol=0, atol=0, msg=name)
    ids = torch.randint(0, 256, (4, 16))
    tokens = (
        model.pos_embed(model.embed(ids), torch.zeros(16, dtype=torch.long))
        - model.pos_embed.table(1, torch.device("cpu"), torch.float32)[0]
    )
    assert 0.8 < tokens.std().item() < 1.2
