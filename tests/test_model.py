"""The decoder-only language model stacked from blocks."""

from __future__ import annotations

import torch

from zoo import build_model, compose


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
