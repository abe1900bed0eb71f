"""The encoder-decoder: stacks from one block config, cached decoding, memory keys computed once."""

from __future__ import annotations

import pytest
import torch

from zoo import ConfigError, Seq2SeqModel, build_seq2seq, compose
from zoo.testing.combos import VOCAB, scramble

SIZES = ["block.d_model=16", "block.n_heads=4", f"model.vocab_size={VOCAB}", "model.n_layers=2"]


def tiny_seq2seq(*overrides: str) -> Seq2SeqModel:
    """Untied head: with random weights a tied post-norm decoder repeats one token, which tests nothing.

    A fixed seed for the weights: some draws make a post-norm decoder repeat one token, too.
    """
    torch.manual_seed(0)
    model = build_seq2seq(compose([*SIZES, "+encoder.n_layers=3", "model.tie_embeddings=false", *overrides])).double()
    scramble(model)
    return model.eval()


def source(batch: int = 3, time: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded source ids and their mask (sample i has i padding tokens)."""
    ids = torch.randint(0, VOCAB, (batch, time))
    mask = torch.ones(batch, time, dtype=torch.bool)
    for i in range(batch):
        mask[i, time - i :] = False
    return ids, mask


def test_stacks_are_built_from_the_block_config():
    model = tiny_seq2seq("preset=llama")
    assert len(model.encoder.blocks) == 3 and len(model.decoder.blocks) == 2
    assert all(not b.attn.causal and b.cross_attn is None for b in model.encoder.blocks)
    assert all(b.attn.causal and b.cross_attn is not None for b in model.decoder.blocks)
    assert all(b.cross_attn.n_kv_heads == 2 for b in model.decoder.blocks)  # follows the attn choice
    assert len(model.decoder.blocks[0].placement.norms) == 3
    counts = model.parameter_counts()
    assert counts["total"] == model.num_parameters() and counts["attention"] > 0
    assert model.flops_per_token(8) > 6 * (counts["total"] - counts["embedding"])


def test_encoder_overrides_and_defaults():
    model = build_seq2seq(compose([*SIZES, "+encoder.block.attn=mqa", "+encoder.layers.0.mlp=relu"]))
    assert len(model.encoder.blocks) == 2  # defaults to the decoder's depth
    assert [b.attn.n_kv_heads for b in model.encoder.blocks] == [1, 1]
    assert type(model.encoder.blocks[0].mlp).__name__ == "ReluMLP"
    assert [b.attn.n_kv_heads for b in model.decoder.blocks] == [4, 4]


@pytest.mark.parametrize("preset", ["vaswani", "llama"])
def test_cached_generation_equals_recomputing_and_teacher_forcing(preset):
    model = tiny_seq2seq(f"preset={preset}")
    src, src_mask = source()
    new = model.generate(src, 6, bos_id=1, src_mask=src_mask)
    assert torch.equal(model.generate(src, 6, bos_id=1, src_mask=src_mask, use_cache=False), new)
    tgt = torch.cat([torch.ones(3, 1, dtype=torch.long), new], dim=1)
    logits = model(src, tgt, src_mask=src_mask)  # teacher forcing on the generated target
    assert torch.equal(logits[:, :-1].argmax(-1), new)
    assert len(set(new.flatten().tolist())) > 2, "weights too uniform for the test to mean anything"


def test_memory_keys_and_values_are_projected_once_per_layer():
    model = tiny_seq2seq("preset=vaswani")
    calls = []
    for block in model.decoder.blocks:
        block.cross_attn.kv.register_forward_hook(lambda *_: calls.append(1))
    model.generate(source()[0], 5)
    assert len(calls) == len(model.decoder.blocks)
    calls.clear()
    model.generate(source()[0], 5, use_cache=False)
    assert len(calls) == 5 * len(model.decoder.blocks)


def test_padded_sources_generate_what_each_would_alone():
    model = tiny_seq2seq("preset=llama")
    src, src_mask = source()
    batched = model.generate(src, 5, src_mask=src_mask)
    for i in range(3):
        real = src[i : i + 1, src_mask[i]]
        assert torch.equal(model.generate(real, 5)[0], batched[i])


def test_gradients_reach_every_parameter():
    model = tiny_seq2seq("preset=vaswani").train()
    src, src_mask = source()
    tgt = torch.randint(0, VOCAB, (3, 4))
    model(src, tgt, src_mask=src_mask).square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["+encoder.n_layers=0"], "encoder.n_layers=0"),
        (["+encoder.depth=2"], "encoder.depth=2"),
        (["+encoder.block.d_model=32"], "encoder.block.d_model=32"),
        (["+encoder.block.attn.n_kv_heads=3"], "encoder.block.attn.n_kv_heads=3"),
        (["+encoder.layers.7.attn=mqa"], "encoder.layers.7=7"),
        (["+model.layers.1.norm=rmsnrom"], "model.layers.1.norm.name='rmsnrom'"),
    ],
)
def test_bad_seq2seq_config_names_the_field(overrides, field):
    with pytest.raises(ConfigError) as error:
        build_seq2seq(compose([*SIZES, *overrides]))
    assert field in str(error.value), str(error.value)


def test_init_draws_every_weight_from_its_full_name():
    """Encoder block i and decoder block i do not share a draw; embed and head come from the seeded
    per-name draw too (not the global generator), each stack's residual outputs scaled by its depth."""
    import math

    from helpers import seeded_draws

    cfg = compose([*SIZES, "+encoder.n_layers=3", "model.tie_embeddings=false", "preset=llama"])
    torch.manual_seed(5)
    torch.randn(100)  # the global generator moves on; the init must not depend on it
    model = build_seq2seq(cfg)
    weights = dict(model.named_parameters())
    for name in ("blocks.0.attn.qkv.weight", "blocks.0.mlp.gate_up.weight"):
        assert not torch.equal(weights[f"encoder.{name}"], weights[f"decoder.{name}"]), name

    def residual_std(name: str) -> float:
        return 0.02 / math.sqrt(2 * 3 if name.startswith("encoder.") else 3 * 2)  # 3 encoder, 2 decoder layers

    expected = seeded_draws(model, 5, residual_std)
    assert {"embed.weight", "head.weight", "decoder.blocks.1.cross_attn.out.weight"} <= set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(weights[name].detach(), value, rtol=0, atol=0, msg=name)
    model.reset_parameters(seed=6)
    torch.testing.assert_close(dict(model.named_parameters())["embed.weight"].detach(),
                               seeded_draws(model, 6, residual_std)["embed.weight"], rtol=0, atol=0)  # fmt: skip


def test_vaswani_is_the_original_transformer_with_sinusoidal_positions_on_both_sides():
    model = tiny_seq2seq("preset=vaswani")
    assert type(model.encoder.pos_embed).__name__ == type(model.decoder.pos_embed).__name__ == "SinusoidalEmbedding"
    src, tgt = torch.randint(0, VOCAB, (1, 5)), torch.randint(0, VOCAB, (1, 4))
    memory = model.encode(src)
    assert not torch.allclose(model.encode(src[:, [1, 0, 2, 3, 4]])[:, 2:], memory[:, 2:]), "encoder ignores order"
    learned = tiny_seq2seq("pos=learned", "block.max_len=16")
    assert learned.encoder.pos_embed.weight is not learned.decoder.pos_embed.weight  # a table each
    assert learned.parameter_counts()["embedding"] == VOCAB * 16 * 2 + 2 * 16 * 16  # embed, head, two tables
    logits = model(src, tgt)
    assert logits.shape == (1, 4, VOCAB)


@pytest.mark.parametrize("preset", ["vaswani", "gpt", "llama"])
@pytest.mark.parametrize("pos", ["none", "rotary", "alibi", "learned", "sinusoidal"])
def test_check_combination_and_build_seq2seq_give_one_answer(preset, pos):
    from zoo import check_combination

    cfg = compose([*SIZES, f"preset={preset}", f"pos={pos}", "block.max_len=16"])
    assert check_combination(cfg) is None
    model = build_seq2seq(cfg)
    assert (model.decoder.pos_embed is not None) == (pos in ("learned", "sinusoidal"))


def test_per_layer_embedding_positions_in_the_encoder_are_rejected():
    with pytest.raises(ConfigError, match=r"encoder.layers.1.pos='learned'.*set them once with block.pos"):
        build_seq2seq(compose([*SIZES, "block.max_len=16", "+encoder.layers.1.pos=learned"]))
    model = build_seq2seq(compose([*SIZES, "block.max_len=16", "+encoder.block.pos=learned"]))
    assert model.encoder.pos_embed is not None and model.decoder.pos_embed is None
