"""The shared attention kernel's score scale: 1 / sqrt(d) by default, any multiplier when given."""

import math

import pytest
import torch

from zoo.parts.kernels import attend


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale q k^T + causal mask) v, written out: q, k, v (b, h, t, d) -> (b, h, t, d)."""
    scores = q.double() @ k.double().transpose(-1, -2) * scale
    future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
    return torch.softmax(scores.masked_fill(future, -math.inf), dim=-1) @ v.double()


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("scale", [None, 1 / 16, 0.9])
def test_attend_scales_the_scores_by_the_given_multiplier(backend: str, scale: float | None) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 16) * 3 for _ in range(3))
    out = attend(q, k, v, None, is_causal=True, backend=backend, scale=scale)
    expected = reference(q, k, v, 1 / math.sqrt(16) if scale is None else scale)
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)


def test_the_default_scale_is_the_one_before_the_option() -> None:
    """scale=None keeps the math path's arithmetic as it was: the same bits as dividing by sqrt(d)."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(8)
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)
    expected = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(scores.masked_fill(future, -math.inf), -1), v)
    assert torch.equal(attend(q, k, v, None, is_causal=True, backend="math"), expected)
