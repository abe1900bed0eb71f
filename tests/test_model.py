"""The decoder-only language model stacked from blocks."""

from __future__ import annotations

import pytest
import torch

from zoo import POSITIONS, build_model, compose


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
    assert counts["embedding"] == 256 * 32  # tied head adds nothing
    assert counts["attention"] == 2 * (32 * 96 + 96 + 32 * 32 + 32)
    assert model.flops_per_token(64) > 6 * (counts["total"] - counts["embedding"])


def test_post_norm_stack_has_no_final_norm():
    assert isinstance(tiny_model("preset=vaswani").final_norm, torch.nn.Identity)
    assert not isinstance(tiny_model("preset=gpt").final_norm, torch.nn.Identity)


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
