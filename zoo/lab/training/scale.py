"""Beyond one process and one eager forward, through PyTorch's own engine (docs/scale.md):

- ``compile=true``: ``torch.compile`` per block, ``fullgraph=True`` (a graph break is an error);
- ``train.activation_checkpointing=true``: ``torch.utils.checkpoint`` per block;
- ``parallel.*``: a DeviceMesh ``(dp_replicate, dp_shard, tp)``; tensor parallelism from each part's
  own plan (``parallelize_module``, sequence parallel norms); FSDP2 (``fully_shard``) per block then
  the model, HSDP when ``dp_replicate`` > 1 too; bf16 mixed precision with float32 reductions on CUDA.
  Pure replication (``dp_shard = tp = 1``) stays DDP.

Every ``parallel`` key is checked against the world size and the model before any tensor work.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from zoo.lab.planning.mesh import ProcessMesh


def compile_block(block: nn.Module, backend: str = "inductor") -> None:
    """Compile ``block`` in place (``nn.Module.compile``) as one graph: a graph break is an error.

    Integers read from tensors (MoE's tokens per expert) are captured as symbolic sizes rather than
    breaking the graph (Dynamo's ``capture_scalar_outputs``, set for the process)."""
    torch._dynamo.config.capture_scalar_outputs = True
    block.compile(fullgraph=True, backend=backend)


def compile_blocks(model: nn.Module, backend: str = "inductor") -> None:
    """Compile each of ``model.blocks`` in place (:func:`compile_block`); parameter names and the
    state dict are unchanged."""
    for block in model.blocks:  # type: ignore[union-attr]
        compile_block(block, backend)


def parallelize(
    model: nn.Module,
    parallel: ProcessMesh,
    mesh: Any,
    *,
    compile: bool = False,
    backend: str = "inductor",
    sequence_parallel: bool = True,
    mixed_precision: bool = False,
) -> nn.Module:
    """Shard ``model`` in place over ``mesh``: tensor parallel plans (when tp > 1), then compile per
    block, then FSDP2 per block and the model over the data-parallel dimensions (when dp > 1).

    ``mixed_precision``: bf16 parameters and activations with float32 gradient reductions (CUDA).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    if parallel.tp > 1:
        parallelize_module(model, mesh["tp"], model.tp_plan(sequence_parallel))  # type: ignore[operator]
    if compile:
        compile_blocks(model, backend)
    if parallel.dp > 1:
        dp_mesh = mesh["dp_replicate", "dp_shard"] if parallel.dp_replicate > 1 else mesh["dp_shard"]
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        options = {"mesh": dp_mesh, "mp_policy": policy if mixed_precision else MixedPrecisionPolicy()}
        blocks = list(model.blocks)  # type: ignore[union-attr]
        for i, block in enumerate(blocks):
            fully_shard(block, reshard_after_forward=i < len(blocks) - 1, **options)
        fully_shard(model, **options)
    return model
