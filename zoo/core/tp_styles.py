"""The tensor-parallel styles the parts' plans use (zoo.core.tp), in a module of their own: importing
``torch.distributed.tensor`` costs a process most of a second, and only a run under ``parallel.tp > 1`` (or
``parallel.fsdp``) needs it. Read them through zoo.core.tp (``tp.ColwiseParallel``), which imports this module on
first use."""

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

#: zoo.core.tp.STYLES: what zoo.core.tp reads from here.
__all__ = [
    "Chain", "ColwiseParallel", "DTensor", "HeadParameters", "LocalHeads", "ParallelStyle", "PartialGradient",
    "PrepareModuleInput", "PrepareModuleOutput", "Replicate", "Replicated", "ReplicatedParameters", "RowwiseParallel",
    "SequenceParallel", "Shard", "SumOverRanks",
]  # fmt: skip


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


class Chain(ParallelStyle):
    """Several styles on one module, applied in order (their output hooks run in that order too)."""

    def __init__(self, *styles: ParallelStyle) -> None:
        super().__init__()
        self.styles = styles

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for style in self.styles:
            module = style._apply(module, device_mesh)
        return module


class SumOverRanks(torch.autograd.Function):
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
        module.register_forward_hook(lambda mod, args, out: SumOverRanks.apply(out, self.width, group))
        return module
