"""Tensor-parallel plans: how a part shards over the ``tp`` mesh dimension (docs/scale.md).

A part that can run under ``parallel.tp > 1`` declares, in its own class body:

- ``tp_plan(self, sequence_parallel: bool) -> Plan``: its sub-modules' names (relative to the part;
  ``""`` is the part itself) -> a DTensor :class:`ParallelStyle` (``ColwiseParallel``,
  ``RowwiseParallel``, ``SequenceParallel``, ...), applied by ``parallelize_module``;
- optionally ``check_tp(cls, dims, tp, **options)``: its divisibility rules, raising a ConfigError
  that names ``parallel.tp`` (before any tensor work).

A part without a plan of its own (:func:`has_plan`: inherited plans count only where the class also
inherits ``forward`` and ``__init__`` from the class that declared it) is refused under ``tp > 1`` by
the compatibility map (zoo.assembly.compat), naming it.

Inside a block the residual stream is a local tensor, sharded on the sequence (dim 1) under
sequence parallelism and whole otherwise; every part returns local tensors.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from zoo.core.errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

#: The plans' helpers; the styles (zoo.core.tp_styles.__all__: ``tp.ColwiseParallel``...) are read through
#: :func:`__getattr__`.
__all__ = [
    "Plan", "column_branch", "gather_sequence", "has_plan", "heads_norm", "is_dtensor", "local", "no_plan",
    "norm_plan", "prefixed", "replicated", "require_whole_heads", "row_output",
]  # fmt: skip

#: A part's plan: sub-module name relative to the part ("" = the part itself) -> style.
Plan = dict[str, "ParallelStyle"]


#: The styles zoo.core.tp_styles defines or re-exports, read here as ``tp.ColwiseParallel`` (:func:`__getattr__`).
STYLES = frozenset({
    "Chain", "ColwiseParallel", "DTensor", "HeadParameters", "LocalHeads", "ParallelStyle", "PartialGradient",
    "PrepareModuleInput", "PrepareModuleOutput", "Replicate", "Replicated", "ReplicatedParameters", "RowwiseParallel",
    "SequenceParallel", "Shard", "SumOverRanks",
})  # fmt: skip


def __getattr__(name: str) -> Any:
    """A style of :data:`STYLES` from zoo.core.tp_styles, imported on first use (any other name, as ``__path__``
    that an import asks for, imports nothing)."""
    if name not in STYLES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from zoo.core import tp_styles

    return getattr(tp_styles, name)


def require_whole_heads(n_heads: int, tp: int) -> None:
    """A part whose plan gives each rank whole heads: ``tp`` must divide ``n_heads`` (a ConfigError
    naming ``parallel.tp`` otherwise, before any tensor work)."""
    if n_heads % tp:
        raise ConfigError("parallel.tp", tp, f"must divide block.n_heads={n_heads}: each rank holds whole heads")


def has_plan(cls: type) -> bool:
    """Whether ``cls`` declares a tensor-parallel plan for itself: ``tp_plan`` is defined in it, or in a
    base class from which it also takes ``forward`` and ``__init__`` (a subclass that only swaps an
    activation keeps its base's plan; one with its own forward must declare its own)."""
    mro = cls.__mro__

    def owner(attr: str) -> int:
        return next((i for i, k in enumerate(mro) if attr in k.__dict__), len(mro))

    plan = owner("tp_plan")
    return plan < len(mro) and plan <= owner("forward") and plan <= owner("__init__")


def prefixed(prefix: str, plan: Plan) -> Plan:
    """``plan`` with each name under ``prefix`` (``""`` becomes ``prefix`` itself)."""
    return {f"{prefix}.{name}" if name else prefix: style for name, style in plan.items()}


def is_dtensor(tensor: Any) -> bool:
    """Whether ``tensor`` is a DTensor; without importing ``torch.distributed.tensor`` (no DTensor exists before
    it is imported)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(tensor, dtensor.DTensor)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A parameter as this rank's local tensor (a DTensor's shard; any other tensor as it is), differentiably."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


def replicated(module: nn.Module, param: torch.Tensor) -> torch.Tensor:
    """A parameter of ``module`` as a whole local tensor, differentiably: a :class:`ReplicatedParameters`
    DTensor's local copy (its gradient summed over the tp ranks when they hold sequence shards); any other
    tensor as it is."""
    if not is_dtensor(param):
        return param
    from zoo.core.tp_styles import SumOverRanks

    value = param.to_local()
    group = getattr(module, "tp_sum_group", None)
    return value if group is None else SumOverRanks.apply(value, value.shape[-1], group)


def norm_plan(self: nn.Module, sequence_parallel: bool) -> Plan:
    """A norm over the feature axis: sequence parallel (each rank normalizes its tokens; parameters
    replicated), or run whole on every rank."""
    from zoo.core.tp_styles import Replicated, SequenceParallel

    return {"": SequenceParallel(use_local_output=True) if sequence_parallel else Replicated()}


def heads_norm() -> ParallelStyle:
    """A norm over d_head applied to (b, heads, t, d_head) local heads: sharded on the heads axis."""
    from zoo.core.tp_styles import SequenceParallel

    return SequenceParallel(sequence_dim=1, use_local_output=True)


def gather_sequence() -> ParallelStyle:
    """A branch (attention, MLP) under sequence parallelism: its input, sharded on the sequence, is
    gathered whole before its column-wise projections."""
    from zoo.core.tp_styles import PrepareModuleInput, Replicate, Shard

    return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True)


def row_output(sequence_parallel: bool) -> ParallelStyle:
    """A branch's last projection: row-wise, its partial sums reduce-scattered to sequence shards
    under sequence parallelism, else all-reduced."""
    from zoo.core.tp_styles import Replicate, RowwiseParallel, Shard

    return RowwiseParallel(output_layouts=Shard(1) if sequence_parallel else Replicate())


def column_branch(sequence_parallel: bool, columns: tuple[str, ...], rows: str) -> Plan:
    """The usual branch: ``columns`` column-wise, ``rows`` row-wise, the input gathered under sequence
    parallelism."""
    from zoo.core.tp_styles import ColwiseParallel

    plan: Plan = {name: ColwiseParallel() for name in columns}
    plan[rows] = row_output(sequence_parallel)
    if sequence_parallel:
        plan[""] = gather_sequence()
    return plan


def no_plan(self: nn.Module, sequence_parallel: bool) -> Plan:
    """Nothing to shard: no parameters, and the same computation on every rank's tensors."""
    return {}


