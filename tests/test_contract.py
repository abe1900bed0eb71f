"""The block contract, checked for every combination of registered parts.

Equality of two paths is tested in float64, where a real difference cannot hide in rounding.
"""

from __future__ import annotations

import pytest
import torch
from combos import VOCAB, block_config, every_combination, make_block, make_model

from zoo import build_block
from zoo.parts.attention import KVCache

B, T, D = 2, 6, 16


def inputs(batch: int = B, time: int = T, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(batch, time, D, dtype=dtype)


@every_combination
@pytest.mark.parametrize("time", [1, T])
def test_shape_kept(combo, time):
    x = inputs(time=time)
    assert make_block(combo)(x).shape == x.shape


@every_combination
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_future_tokens_do_not_change_the_past(combo, backend):
    block = make_block(combo, attn={"backend": backend})
    x = inputs()
    for t in range(T - 1):
        changed = x.clone()
        changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :]) * 3
        torch.testing.assert_close(block(changed)[:, : t + 1], block(x)[:, : t + 1], rtol=0, atol=1e-12)


@every_combination
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_jacobian_is_zero_on_future_inputs(combo, backend):
    block = make_block(combo, attn={"backend": backend})
    x = inputs(batch=1).requires_grad_()
    y = block(x)
    for t in range(T):
        (grad,) = torch.autograd.grad(y[0, t].sum(), x, retain_graph=True)
        assert torch.all(grad[0, t + 1 :] == 0), f"output {t} depends on a later input"
        assert grad[0, : t + 1].abs().sum() > 0, f"output {t} ignores its own past"


@every_combination
def test_gradients_reach_input_and_every_parameter(combo):
    block = make_block(combo).train()
    x = inputs().requires_grad_()
    (block(x) * torch.randn(B, T, D, dtype=x.dtype)).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, p in block.named_parameters():
        assert p.grad is not None, f"{name} gets no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


@every_combination
def test_finite_on_huge_inputs(combo):
    block = make_block(combo, dtype=torch.float32)
    assert torch.isfinite(block(inputs(dtype=torch.float32) * 1e4)).all()


#: bfloat16 keeps 8 mantissa bits (~0.4% per rounding); a block compounds a few dozen roundings.
BF16_RELATIVE_ERROR = 0.05


@every_combination
def test_bfloat16_close_to_float32(combo):
    block = make_block(combo, dtype=torch.float32)
    x = inputs(dtype=torch.float32)
    reference = block(x)
    low = block.to(torch.bfloat16)(x.to(torch.bfloat16)).float()
    assert torch.isfinite(low).all()
    error = (low - reference).norm() / reference.norm()
    assert error < BF16_RELATIVE_ERROR, f"bfloat16 relative error {error:.3f}"


@every_combination
def test_samples_do_not_see_each_other(combo):
    block = make_block(combo)
    x = inputs(batch=3)
    alone = torch.cat([block(x[i : i + 1]) for i in range(3)])
    torch.testing.assert_close(block(x), alone, rtol=0, atol=1e-12)
    changed = x.clone()
    changed[1:] = torch.randn_like(changed[1:])
    torch.testing.assert_close(block(changed)[0], block(x)[0], rtol=0, atol=1e-12)


@every_combination
def test_sdpa_and_math_backends_agree(combo):
    fast = make_block(combo, attn={"backend": "sdpa"})
    slow = build_block(block_config(combo, attn={"backend": "math"})).double().eval()
    slow.load_state_dict(fast.state_dict())
    x = inputs()
    key_mask = torch.ones(B, T, dtype=torch.bool)
    key_mask[0, :2] = False  # left padding on the first sample
    torch.testing.assert_close(fast(x), slow(x), rtol=0, atol=1e-10)
    torch.testing.assert_close(fast(x, key_mask=key_mask), slow(x, key_mask=key_mask), rtol=0, atol=1e-10)


@every_combination
def test_dropout_only_in_train(combo):
    block = make_block(combo, dropout=0.5)
    plain = build_block(block_config(combo, dropout=0.0)).double().eval()
    plain.load_state_dict(block.state_dict())
    x = inputs()
    torch.testing.assert_close(block(x), block(x), rtol=0, atol=0)
    torch.testing.assert_close(block(x), plain(x), rtol=0, atol=1e-12)
    block.train()
    assert not torch.allclose(block(x), block(x)), "dropout is not active in train()"


@every_combination
def test_state_dict_round_trip(combo):
    first = make_block(combo)
    torch.manual_seed(123)
    second = build_block(block_config(combo)).double().eval()
    second.load_state_dict(first.state_dict())
    x = inputs()
    torch.testing.assert_close(second(x), first(x), rtol=0, atol=0)


@every_combination
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_cached_decoding_equals_full_forward(combo, backend):
    block = make_block(combo, attn={"backend": backend})
    x = inputs()
    cache = KVCache()
    steps = [block(x[:, :3], cache=cache)] + [block(x[:, t : t + 1], cache=cache) for t in range(3, T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), block(x), rtol=0, atol=1e-10)


@every_combination
def test_padding_never_changes_real_positions_and_stays_finite(combo):
    block = make_block(combo)
    x = inputs()
    key_mask = torch.ones(B, T, dtype=torch.bool)
    key_mask[:, :2] = False  # left padding: queries 0 and 1 see no real key at all
    y = block(x, key_mask=key_mask)
    assert torch.isfinite(y).all()
    changed = x.clone()
    changed[:, :2] = torch.randn_like(changed[:, :2]) * 5
    torch.testing.assert_close(block(changed, key_mask=key_mask)[:, 2:], y[:, 2:], rtol=0, atol=1e-12)


# --- Models: cached decoding, cache memory, left-padded batches -------------------------------------

#: Logits compared at float32 tolerance; computed in float64 so only a real difference can exceed it.
FLOAT32 = {"rtol": 1.3e-6, "atol": 1e-5}


@every_combination
def test_model_prefill_then_cached_decoding_equals_full_forward(combo):
    model = make_model(combo)
    ids = torch.randint(0, VOCAB, (B, 7))
    full = model(ids)
    # One prefill then single tokens, and a prefill in chunks (the block-level test covers both backends).
    for chunks in [(3, 1, 1, 1, 1), (2, 3, 1, 1)]:
        caches = model.new_caches(max_len=4)  # smaller than the sequence: the cache must grow
        steps, start = [], 0
        for size in chunks:
            steps.append(model(ids[:, start : start + size], caches=caches))
            start += size
        assert all(cache.length == ids.shape[1] for cache in caches)
        torch.testing.assert_close(torch.cat(steps, dim=1), full, **FLOAT32)


@every_combination
def test_cache_holds_only_the_kv_heads(combo):
    model = make_model(combo)
    mha = make_model({**combo, "attn": "mha"})
    ids = torch.randint(0, VOCAB, (B, 5))
    nbytes = {}
    for name, m in (("combo", model), ("mha", mha)):
        caches = m.new_caches(max_len=8)
        m(ids, caches=caches)
        nbytes[name] = sum(cache.nbytes for cache in caches)
    attn = model.blocks[0].attn
    # keys and values: 2 x layers x batch x kv heads x slots x d_head x 8 bytes (float64)
    assert nbytes["combo"] == 2 * len(model.blocks) * B * attn.n_kv_heads * 8 * attn.d_head * 8
    assert nbytes["combo"] * attn.n_heads == nbytes["mha"] * attn.n_kv_heads


@every_combination
def test_left_padded_batch_equals_each_prompt_alone(combo):
    model = make_model(combo)
    lengths, width, new = [3, 6, 4], 6, 3
    prompts = [torch.randint(0, VOCAB, (1, n)) for n in lengths]
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    key_mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for i, prompt in enumerate(prompts):
        ids[i, width - prompt.shape[1] :] = prompt
        key_mask[i, width - prompt.shape[1] :] = True
    positions = (key_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(ids, key_mask=key_mask, positions=positions)
    for i, prompt in enumerate(prompts):
        torch.testing.assert_close(logits[i, width - prompt.shape[1] :], model(prompt)[0], **FLOAT32)
    batched = model.generate(ids, new, key_mask=key_mask)
    alone = torch.cat([model.generate(prompt, new) for prompt in prompts])
    assert torch.equal(batched, alone)
    assert torch.equal(model.generate(ids, new, key_mask=key_mask, use_cache=False), alone)


# --- Cross-attention and encoder blocks ------------------------------------------------------------

S = 5  # source length


def memory_inputs(batch: int = B) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder memory (b, S, D) and its padding mask: the first sample's last 2 positions are padding."""
    memory_mask = torch.ones(batch, S, dtype=torch.bool)
    memory_mask[0, -2:] = False
    return torch.randn(batch, S, D, dtype=torch.float64), memory_mask


@every_combination
def test_cross_attention_reads_real_memory_never_its_padding_nor_the_future(combo):
    block = make_block(combo, cross_attention=True)
    x = inputs()
    memory, memory_mask = memory_inputs()
    y = block(x, memory=memory, memory_mask=memory_mask)
    changed = memory.clone()
    changed[0, -2:] = torch.randn(2, D, dtype=memory.dtype) * 5  # padding only
    torch.testing.assert_close(block(x, memory=changed, memory_mask=memory_mask), y, rtol=0, atol=1e-12)
    changed[:, 0] += torch.randn(D, dtype=memory.dtype)  # a real source token
    assert not torch.allclose(block(x, memory=changed, memory_mask=memory_mask), y), "memory is ignored"
    for t in range(T - 1):
        future = x.clone()
        future[:, t + 1 :] = torch.randn_like(future[:, t + 1 :]) * 3
        out = block(future, memory=memory, memory_mask=memory_mask)
        torch.testing.assert_close(out[:, : t + 1], y[:, : t + 1], rtol=0, atol=1e-12)


@every_combination
def test_cross_attention_cached_decoding_equals_full_forward(combo):
    block = make_block(combo, cross_attention=True)
    x = inputs()
    memory, memory_mask = memory_inputs()
    cache = KVCache()
    steps = [block(x[:, :3], cache=cache, memory=memory, memory_mask=memory_mask)]
    # Later steps get no memory: its keys and values were computed once, at the first step.
    steps += [block(x[:, t : t + 1], cache=cache, memory_mask=memory_mask) for t in range(3, T)]
    full = block(x, memory=memory, memory_mask=memory_mask)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-10)


@every_combination
def test_cross_attention_gradients_reach_memory_and_every_parameter(combo):
    block = make_block(combo, cross_attention=True).train()
    x = inputs().requires_grad_()
    memory, memory_mask = memory_inputs()
    memory.requires_grad_()
    (block(x, memory=memory, memory_mask=memory_mask) * torch.randn(B, T, D, dtype=x.dtype)).sum().backward()
    assert memory.grad is not None and memory.grad[:, :-2].abs().sum() > 0
    assert torch.all(memory.grad[0, -2:] == 0), "gradient flows into padded memory"
    assert len(block.placement.norms) == 3
    for name, p in block.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


@every_combination
def test_encoder_block_sees_both_directions_and_ignores_padding(combo):
    block = make_block(combo, causal=False)
    x = inputs()
    key_mask = torch.ones(B, T, dtype=torch.bool)
    key_mask[:, -2:] = False  # right padding
    y = block(x, key_mask=key_mask)
    assert torch.isfinite(y).all()
    future = x.clone()
    future[:, T - 3] += torch.randn(D, dtype=x.dtype)  # a later real token changes an earlier output
    assert not torch.allclose(block(future, key_mask=key_mask)[:, 0], y[:, 0]), "encoder block is causal"
    padded = x.clone()
    padded[:, -2:] = torch.randn_like(padded[:, -2:]) * 5
    torch.testing.assert_close(block(padded, key_mask=key_mask)[:, :-2], y[:, :-2], rtol=0, atol=1e-12)
