"""einops' ``rearrange``, ``repeat`` and ``reduce``, cheap for torch.compile to trace.

Called eagerly, each is einops' own function. Under torch.compile, Dynamo traces einops' pattern parser
on every call (its recipe cache is a ``functools.lru_cache``, which Dynamo traces through): about 80 ms of
compile time a call, most of a block's capture. Where the input's shape and every axis length are static,
as in training at a fixed sequence length, these functions instead hand Dynamo einops' own plan for the
call (the recipe and the shapes it resolves to, computed once, outside the trace, as a constant) and
apply it with the same reshape, permute, reduction and expansion einops would: the graph is einops'
graph, and the capture takes well under a millisecond a call (benchmarks/compile.py measures it). Dynamic
shapes go to einops itself. The plan uses einops' internal helpers; an einops without them gets einops'
functions throughout (``STATIC_PLANS`` says which).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import einops
import torch
from torch.fx.experimental.symbolic_shapes import has_static_value

try:
    from einops._backends import TorchBackend
    from einops.einops import _prepare_transformation_recipe, _reconstruct_from_shape_uncached, _reduce_axes
except ImportError:  # an einops whose internals moved: its public functions, traced as they are
    STATIC_PLANS = False
else:
    STATIC_PLANS = True
    _TORCH = TorchBackend()

__all__ = ["rearrange", "reduce", "repeat"]

Tensors = torch.Tensor | Sequence[torch.Tensor]
Plan = tuple[tuple[int, ...] | None, tuple[int, ...] | None, tuple[int, ...], tuple, tuple[int, ...] | None, int]


def rearrange(tensor: Tensors, pattern: str, **axes_lengths: int) -> torch.Tensor:
    """``einops.rearrange``: reorder, split and merge axes (``"b t (h d) -> b h t d"``)."""
    return reduce(tensor, pattern, "rearrange", **axes_lengths)


def repeat(tensor: Tensors, pattern: str, **axes_lengths: int) -> torch.Tensor:
    """``einops.repeat``: add or tile axes (``"h -> b h t"``)."""
    return reduce(tensor, pattern, "repeat", **axes_lengths)


def reduce(tensor: Tensors, pattern: str, reduction: str | Callable, **axes_lengths: int) -> torch.Tensor:
    """``einops.reduce`` (``reduction`` one of einops' names, ``rearrange``/``repeat``, or a callable
    ``f(tensor, reduced_axes)`` as einops takes it)."""
    if not (STATIC_PLANS and torch.compiler.is_compiling()):
        return einops.reduce(tensor, pattern, reduction, **axes_lengths)
    if not isinstance(tensor, torch.Tensor):
        tensor = torch.stack(list(tensor))  # einops stacks a list on a new first axis
    lengths = tuple(axes_lengths.items())
    if not all(map(has_static_value, (*tensor.shape, *axes_lengths.values()))):
        return einops.reduce(tensor, pattern, reduction, **axes_lengths)  # dynamic shapes: einops traced
    shape = tuple(int(n) for n in tensor.shape)  # static: plain ints
    init, order, reduced, added, final, n_axes = _static_plan(pattern, reduction, lengths, shape)
    if init is not None:
        tensor = tensor.reshape(init)
    if order is not None:
        tensor = tensor.permute(order)
    if reduced:
        tensor = _reduce_axes(tensor, reduction_type=reduction, reduced_axes=list(reduced), backend=_TORCH)
    if added:
        tensor = _TORCH.add_axes(tensor, n_axes=n_axes, pos2len=dict(added))
    if final is not None:
        tensor = tensor.reshape(final)
    return tensor


@torch._dynamo.assume_constant_result
def _static_plan(
    pattern: str, reduction: str | Callable, lengths: tuple[tuple[str, int], ...], shape: tuple[int, ...]
) -> Plan:
    """einops' plan for one call with static sizes, as hashable constants: the shape to split the input
    into, the permutation, the reduced axes, the added axes (position, length), the output shape and the
    rank after adding. Dynamo runs this at capture and keeps the result; the guards on the input's shape
    and on the axis lengths (constants in the traced code) decide when it is recomputed."""
    names = tuple(name for name, _ in lengths)
    recipe = _prepare_transformation_recipe(pattern, reduction, axes_names=names, ndim=len(shape))
    init, order, reduced, added, final, n_axes = _reconstruct_from_shape_uncached(recipe, shape, lengths)
    split, merged = _tuple_or_none(init), _tuple_or_none(final)
    return split, _tuple_or_none(order), tuple(reduced), tuple(added.items()), merged, n_axes


def _tuple_or_none(values: list[int] | None) -> tuple[int, ...] | None:
    return None if values is None else tuple(values)
