"""The block contract, checked for every combination of registered parts.

Equality of two paths is tested in float64, where a real difference cannot hide in rounding.
"""

from __future__ import annotations

import pytest
import torch
from combos import block_config, every_combination, make_block

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
