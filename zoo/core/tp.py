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

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

from zoo.core.errors import ConfigError

__all__ = [
    "Chain", "ColwiseParallel", "HeadParameters", "LocalHeads", "PartialGradient", "Plan", "PrepareModuleInput",
    "PrepareModuleOutput", "Replicate", "Replicated", "ReplicatedParameters", "RowwiseParallel", "SequenceParallel",
    "Shard", "column_branch", "gather_sequence", "has_plan", "heads_norm", "local", "no_plan", "require_whole_heads",
    "norm_plan", "prefixed", "replicated", "row_output",
]  # fmt: skip

#: A part's plan: sub-module name relative to the part ("" = the part itself) -> style.
Plan = dict[str, ParallelStyle]


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


class Replicated(ParallelStyle):
    """Parameters replicated on the tp mesh (DTensor ``Replicate``), tensor inputs taken as the same on
    every rank, outputs local: a module that every tp rank runs whole (a norm without sequence
    parallelism, learned position embeddings). Gradients of its parameters are then whole on every
    rank, as the optimizer over a DTensor model expects."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def replicate(name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
            for p_name, p in list(mod.named_parameters(recurse=False)):
                mod.register_parameter(
                    p_name, nn.Parameter(DTensor.from_local(p, mesh, [Replicate()], run_check=False))
                )

        def inputs(mod: nn.Module, args: tuple[Any, ...], mesh: DeviceMesh) -> tuple[Any, ...]:
            return tuple(
                DTensor.from_local(a, mesh, [Replicate()], run_check=False)
                if isinstance(a, torch.Tensor) and not isinstance(a, DTensor)
                else a
                for a in args
            )

        def outputs(mod: nn.Module, out: Any, mesh: DeviceMesh) -> Any:
            return out.to_local() if isinstance(out, DTensor) else out

        return distribute_module(module, device_mesh, replicate, inputs, outputs)


class LocalHeads(ParallelStyle):
    """Per-head buffers (non-persistent, e.g. ALiBi's slopes) cut to this rank's heads: rank r of a
    tp mesh of size n keeps heads r * h/n .. (r + 1) * h/n - 1, as the query projection's shard does."""

    def __init__(self, *buffers: str) -> None:
        super().__init__()
        self.buffers = buffers

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for name in self.buffers:
            whole = getattr(module, name)
            local = distribute_tensor(whole, device_mesh, [Shard(0)]).to_local()
            module.register_buffer(name, local, persistent=False)
        return module


class HeadParameters(ParallelStyle):
    """Per-head parameters of the module itself sharded on their first axis, which runs over the heads in
    turn (one entry per head, as a learned sink; or each head's rows, as Gated DeltaNet's convolution
    filters per channel): rank r of a tp mesh of size n holds heads r * h/n .. (r + 1) * h/n - 1, as the
    query projection's shard does. The forward reads them through :func:`local`."""

    def __init__(self, *parameters: str) -> None:
        super().__init__()
        self.names = parameters

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for name in self.names:
            whole = getattr(module, name)
            module.register_parameter(name, nn.Parameter(distribute_tensor(whole.data, device_mesh, [Shard(0)])))
        return module


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A parameter as this rank's local tensor (a DTensor's shard; any other tensor as it is), differentiably."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class ReplicatedParameters(ParallelStyle):
    """A module's own small parameters replicated on the tp mesh, its inputs and outputs left as they are (local
    tensors): for a part applied to the residual stream by the block (zoo.parts.residuals), which reads each
    parameter through :func:`replicated`. Under sequence parallelism each rank applies them to its own tokens,
    so its gradient is a partial sum: :func:`replicated` sums it over the tp ranks in backward."""

    def __init__(self, sequence_parallel: bool) -> None:
        super().__init__()
        self.sequence_parallel = sequence_parallel

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for name, p in list(module.named_parameters(recurse=False)):
            module.register_parameter(name, nn.Parameter(DTensor.from_local(p.data, device_mesh, [Replicate()])))
        module.tp_sum_group = device_mesh.get_group() if self.sequence_parallel else None
        return module


def replicated(module: nn.Module, param: torch.Tensor) -> torch.Tensor:
    """A parameter of ``module`` as a whole local tensor, differentiably: a :class:`ReplicatedParameters`
    DTensor's local copy (its gradient summed over the tp ranks when they hold sequence shards); any other
    tensor as it is."""
    if not isinstance(param, DTensor):
        return param
    value = param.to_local()
    group = getattr(module, "tp_sum_group", None)
    return value if group is None else _SumOverRanks.apply(value, value.shape[-1], group)


def norm_plan(self: nn.Module, sequence_parallel: bool) -> Plan:
    """A norm over the feature axis: sequence parallel (each rank normalizes its tokens; parameters
    replicated), or run whole on every rank."""
    return {"": SequenceParallel(use_local_output=True) if sequence_parallel else Replicated()}


def heads_norm() -> ParallelStyle:
    """A norm over d_head applied to (b, heads, t, d_head) local heads: sharded on the heads axis."""
    return SequenceParallel(sequence_dim=1, use_local_output=True)


def gather_sequence() -> ParallelStyle:
    """A branch (attention, MLP) under sequence parallelism: its input, sharded on the sequence, is
    gathered whole before its column-wise projections."""
    return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True)


def row_output(sequence_parallel: bool) -> ParallelStyle:
    """A branch's last projection: row-wise, its partial sums reduce-scattered to sequence shards
    under sequence parallelism, else all-reduced."""
    return RowwiseParallel(output_layouts=Shard(1) if sequence_parallel else Replicate())


def column_branch(sequence_parallel: bool, columns: tuple[str, ...], rows: str) -> Plan:
    """The usual branch: ``columns`` column-wise, ``rows`` row-wise, the input gathered under sequence
    parallelism."""
    plan: Plan = {name: ColwiseParallel() for name in columns}
    plan[rows] = row_output(sequence_parallel)
    if sequence_parallel:
        plan[""] = gather_sequence()
    return plan


def no_plan(self: nn.Module, sequence_parallel: bool) -> Plan:
    """Nothing to shard: no parameters, and the same computation on every rank's tensors."""
    return {}


class Chain(ParallelStyle):
    """Several styles on one module, applied in order (their output hooks run in that order too)."""

    def __init__(self, *styles: ParallelStyle) -> None:
        super().__init__()
        self.styles = styles

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for style in self.styles:
            module = style._apply(module, device_mesh)
        return module


class _SumOverRanks(torch.autograd.Function):
    """Identity forward; backward: the gradient of the last ``width`` features summed over ``group``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, width: int, group: Any) -> torch.Tensor:
        ctx.width, ctx.group = width, group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        from torch.distributed import _functional_collectives as funcol

        head, tail = grad.split([grad.shape[-1] - ctx.width, ctx.width], dim=-1)
        tail = funcol.all_reduce(tail.contiguous(), "sum", ctx.group)
        return torch.cat([head, tail], dim=-1), None, None


class PartialGradient(ParallelStyle):
    """For a module run whole on every rank (after :class:`Replicated`) whose last ``width`` output
    features are then read by this rank's heads only, such as latent attention's rotary key shared by
    every head: each rank's gradient of those features is a partial sum, so the backward pass
    all-reduces it over the tp mesh (identity forward), making every gradient upstream whole."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        group = device_mesh.get_group()
        module.register_forward_hook(lambda mod, args, out: _SumOverRanks.apply(out, self.width, group))
        return module
