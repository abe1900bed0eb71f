"""One stack under both models: the decoder-only LanguageModel is a Stack with the token embedding in
front and the LM head after it; the encoder-decoder runs two Stacks over one shared embedding.

Parameter names and their order are those that saved runs, checkpoints and the Hugging Face conversion
hold (recorded from the models before they shared the stack).
"""

from __future__ import annotations

import pytest
import torch

from zoo import build_model, build_seq2seq, compose
from zoo.models.stack import Stack

SMALL = ["block.d_model=16", "block.n_heads=2", "model.vocab_size=11", "block.max_len=8", "model.n_layers=1"]
BRANCH = [
    "placement.norms.0.weight",
    "placement.norms.0.bias",
    "placement.norms.1.weight",
    "placement.norms.1.bias",
    "attn.qkv.weight",
    "attn.qkv.bias",
    "attn.out.weight",
    "attn.out.bias",
]
MLP = ["mlp.up.weight", "mlp.up.bias", "mlp.down.weight", "mlp.down.bias"]
CROSS = [
    "placement.norms.2.weight",
    "placement.norms.2.bias",
    "attn.qkv.weight",
    "attn.qkv.bias",
    "attn.out.weight",
    "attn.out.bias",
    "cross_attn.q.weight",
    "cross_attn.q.bias",
    "cross_attn.kv.weight",
    "cross_attn.kv.bias",
    "cross_attn.out.weight",
    "cross_attn.out.bias",
]
#: GPT-2 style, learned positions, untied head, one layer.
LANGUAGE_NAMES = [
    "embed.weight",
    "pos_embed.weight",
    *(f"blocks.0.{name}" for name in [*BRANCH, *MLP]),
    "final_norm.weight",
    "final_norm.bias",
    "head.weight",
]
#: The original Transformer (post-norm: no final norm; sinusoidal: no position table), one layer each side.
SEQ2SEQ_NAMES = [
    "embed.weight",
    *(f"encoder.blocks.0.{name}" for name in [*BRANCH, *MLP]),
    *(f"decoder.blocks.0.{name}" for name in [*BRANCH[:4], *CROSS, *MLP]),
]


def test_parameter_names_and_order_are_those_saved_runs_hold():
    lm = build_model(compose(["preset=gpt", "pos=learned", "model.tie_embeddings=false", *SMALL]))
    assert [name for name, _ in lm.named_parameters()] == list(lm.state_dict()) == LANGUAGE_NAMES
    s2s = build_seq2seq(compose(["preset=vaswani", *SMALL]))
    assert [name for name, _ in s2s.named_parameters()] == list(s2s.state_dict()) == SEQ2SEQ_NAMES


def test_both_models_run_the_same_stack():
    lm = build_model(compose(["preset=llama", *SMALL]))
    s2s = build_seq2seq(compose(["preset=llama", *SMALL]))
    assert isinstance(lm, Stack) and isinstance(s2s.encoder, Stack) and isinstance(s2s.decoder, Stack)
    ids = torch.randint(0, 11, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(lm.hidden_states(ids), Stack.forward(lm, lm.embed(ids)), rtol=0, atol=0)


def seq2seq_gradients(model, src, tgt) -> list[torch.Tensor]:
    model.zero_grad()
    torch.manual_seed(3)  # the same dropout masks with and without recomputation
    model(src, tgt).float().pow(2).mean().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_activation_checkpointing_reaches_both_stacks_of_an_encoder_decoder():
    torch.manual_seed(0)
    model = build_seq2seq(compose(["preset=vaswani", "block.dropout=0.1", *SMALL])).train()
    src, tgt = torch.randint(0, 11, (2, 6)), torch.randint(0, 11, (2, 5))
    kept = seq2seq_gradients(model, src, tgt)
    model.checkpoint_blocks = True
    assert model.encoder.checkpoint_blocks and model.decoder.checkpoint_blocks
    calls = []
    for block in [*model.encoder.blocks, *model.decoder.blocks]:  # recomputed: run again in backward
        block.register_forward_pre_hook(lambda *args: calls.append(1))
    recomputed = seq2seq_gradients(model, src, tgt)
    assert len(calls) == 2 * (len(model.encoder.blocks) + len(model.decoder.blocks))
    for a, b in zip(kept, recomputed, strict=True):
        assert torch.equal(a, b)


def test_a_learned_table_is_checked_on_either_stack():
    model = build_seq2seq(compose(["preset=gpt", "pos=learned", *SMALL]))  # max_len 8
    with pytest.raises(ValueError, match=r"position 8 is past the learned table \(block.max_len=8\)"):
        model(torch.zeros(1, 9, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"position 8 is past the learned table \(block.max_len=8\)"):
        model(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 9, dtype=torch.long))
