"""zoo.core.reshape: einops' functions, and under torch.compile with static shapes einops' plan as a constant.

Each case is checked against einops itself (the reference), eagerly and compiled as one graph; a planted error in
the plan (a wrong permutation, a dropped reduction, the plan ignoring an axis length) fails the compiled cases.
"""

from __future__ import annotations

import types

import einops
import pytest
import torch

import zoo.core.reshape
from zoo.core.reshape import rearrange, reduce, repeat

# (function, pattern, extra args, axis lengths, input shape)
CASES = [
    (rearrange, "b t (h d) -> b h t d", (), {"h": 4}, (2, 5, 12)),
    (rearrange, "b h t d -> b t (h d)", (), {}, (2, 3, 5, 4)),
    (rearrange, "b t (g n d) -> b g n t d", (), {"g": 2, "n": 3}, (2, 5, 24)),
    (rearrange, "... (half two) -> ... half two", (), {"two": 2}, (3, 2, 8)),
    (rearrange, "b t -> b 1 t ()", (), {}, (2, 7)),
    (rearrange, "b t d -> (b t) d", (), {}, (3, 4, 5)),
    (repeat, "h -> b h t", (), {"b": 2, "t": 3}, (4,)),
    (repeat, "b t d -> b t (r d)", (), {"r": 3}, (2, 3, 4)),
    (reduce, "b t (h d) -> b t h", ("sum",), {"h": 2}, (2, 3, 8)),
    (reduce, "b t d -> b d", ("mean",), {}, (2, 5, 3)),
    (reduce, "b (t w) d -> b t d", ("max",), {"w": 2}, (2, 6, 3)),
]
IDS = [f"{fn.__name__}:{pattern}" for fn, pattern, *_ in CASES]


def reference(fn, pattern, extra, lengths, x):  # noqa: ANN001, ANN201
    return getattr(einops, fn.__name__)(x, pattern, *extra, **lengths)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_eager_calls_are_einops_own(case):
    fn, pattern, extra, lengths, shape = case
    x = torch.randn(shape)
    assert torch.equal(fn(x, pattern, *extra, **lengths), reference(fn, pattern, extra, lengths, x))


def compiled(fn, pattern, extra, lengths, **options):  # noqa: ANN001, ANN003, ANN201
    torch._dynamo.reset()
    return torch.compile(lambda x: fn(x, pattern, *extra, **lengths) * 1, backend="eager", fullgraph=True, **options)


def test_compiled_static_calls_use_the_plan_and_equal_einops(monkeypatch):
    """Every case compiles as one graph and equals einops, with einops' public functions out of reach of the trace:
    the static path uses the plan alone."""
    expected = []
    for fn, pattern, extra, lengths, shape in CASES:
        x = torch.randn(shape, dtype=torch.float64)
        expected.append((x, reference(fn, pattern, extra, lengths, x)))
    monkeypatch.setattr(zoo.core.reshape, "einops", types.SimpleNamespace())  # einops.reduce would fail the trace
    for (fn, pattern, extra, lengths, _), (x, want), name in zip(CASES, expected, IDS, strict=True):
        got = compiled(fn, pattern, extra, lengths)(x)
        assert got.shape == want.shape and torch.equal(got, want), name


def test_a_list_of_tensors_is_stacked_as_einops_stacks_it():
    parts = [torch.randn(3, 4), torch.randn(3, 4)]
    want = einops.rearrange(parts, "two t half -> t (half two)")
    got = torch.compile(lambda a, b: rearrange([a, b], "two t half -> t (half two)"), backend="eager", fullgraph=True)
    torch._dynamo.reset()
    assert torch.equal(got(*parts), want)


def test_a_callable_reduction_compiles_as_one_graph_and_equals_einops(monkeypatch):
    def largest(tensor: torch.Tensor, axes: list[int]) -> torch.Tensor:
        return tensor.amax(dim=axes)

    x = torch.randn(2, 3, 8)
    want = einops.reduce(x, "b t (h d) -> b t h", largest, h=2)
    monkeypatch.setattr(zoo.core.reshape, "einops", types.SimpleNamespace())  # the plan's path, not einops.reduce
    torch._dynamo.reset()
    got = torch.compile(lambda x: reduce(x, "b t (h d) -> b t h", largest, h=2), backend="eager", fullgraph=True)
    assert torch.equal(got(x), want)


def test_gradients_through_a_compiled_plan_equal_einops():
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 2, 3, 4, dtype=torch.float64)
    (einops.rearrange(x, "b t (h d) -> b h t d", h=2) * weights).sum().backward()
    want, x.grad = x.grad, None
    torch._dynamo.reset()
    step = torch.compile(lambda x: (rearrange(x, "b t (h d) -> b h t d", h=2) * weights).sum(), backend="aot_eager")
    step(x).backward()
    assert torch.equal(x.grad, want)


def test_dynamic_shapes_fall_back_to_einops_and_stay_one_graph():
    fn = torch.compile(lambda x: rearrange(x, "b t (h d) -> b h t d", h=4), backend="eager", fullgraph=True,
                       dynamic=True)  # fmt: skip
    torch._dynamo.reset()
    for shape in ((2, 5, 12), (3, 7, 16)):
        x = torch.randn(shape)
        assert torch.equal(fn(x), einops.rearrange(x, "b t (h d) -> b h t d", h=4))


@pytest.mark.parametrize("dynamic", [False, None], ids=["static", "automatic"])
def test_a_new_shape_or_axis_length_gets_a_new_plan(dynamic):
    """The plan is a constant of one capture: the guards on the input's shape and on the axis length recompile it
    (``dynamic=None``: from the second call on, Dynamo makes what changed dynamic, and einops takes over)."""
    fn = torch.compile(lambda x, h: rearrange(x, "b t (h d) -> b h t d", h=h), backend="eager", fullgraph=True,
                       dynamic=dynamic)  # fmt: skip
    torch._dynamo.reset()
    for shape, heads in (((2, 5, 12), 4), ((2, 5, 12), 2), ((2, 6, 12), 3), ((1, 5, 12), 6)):
        x = torch.randn(shape)
        assert torch.equal(fn(x, heads), einops.rearrange(x, "b t (h d) -> b h t d", h=heads)), (shape, heads)


def test_a_shape_the_pattern_cannot_split_is_einops_error_under_compile_too():
    with pytest.raises(einops.EinopsError, match="can't divide axis of length 10"):
        rearrange(torch.randn(2, 10), "b (h d) -> b h d", h=4)
    fn = torch.compile(lambda x: rearrange(x, "b (h d) -> b h d", h=4), backend="eager", fullgraph=True)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="can't divide axis of length 10"):
        fn(torch.randn(2, 10))
