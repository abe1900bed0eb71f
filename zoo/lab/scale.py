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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from zoo.assembly.compat import tp_refusal
from zoo.assembly.spec import BlockSpec
from zoo.core.errors import ConfigError
from zoo.core.options import check_type

#: How the world's processes are laid out: the ``parallel`` config section.
MESH_DIMS = ("dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True)
class ProcessMesh:
    """``parallel.dp_replicate`` x ``parallel.dp_shard`` x ``parallel.tp`` = the world size.

    ``dp_replicate`` null takes what is left: world / (dp_shard x tp).
    """

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1

    @classmethod
    def from_config(cls, raw: Mapping[str, Any] | None, world: int) -> ProcessMesh:
        raw = dict(raw or {})
        for key in raw:
            if key not in MESH_DIMS:
                raise ConfigError(f"parallel.{key}", raw[key], f"unknown key; allowed: {', '.join(MESH_DIMS)}")
        values = {}
        for key in MESH_DIMS:
            value = check_type(f"parallel.{key}", raw.get(key, 1 if key != "dp_replicate" else None), int | None)
            if value is not None and value < 1:
                raise ConfigError(f"parallel.{key}", value, "must be a positive integer")
            values[key] = value
        inner = values["dp_shard"] * values["tp"]
        if values["dp_replicate"] is None:
            if world % inner:
                key = "tp" if world % values["tp"] else "dp_shard"  # the key that cannot fit, named with its value
                raise ConfigError(
                    f"parallel.{key}",
                    values[key],
                    f"parallel.dp_shard x parallel.tp = {inner} must divide the world size {world} "
                    "(torchrun --nproc_per_node x --nnodes)",
                )
            values["dp_replicate"] = world // inner
        product = values["dp_replicate"] * inner
        if product != world:
            raise ConfigError(
                "parallel.dp_replicate",
                values["dp_replicate"],
                f"parallel.dp_replicate x parallel.dp_shard x parallel.tp = {product} must equal the world size "
                f"{world} (torchrun --nproc_per_node x --nnodes)",
            )
        return cls(**values)

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel ways: the number of different batches per step."""
        return self.dp_replicate * self.dp_shard

    @property
    def sharded(self) -> bool:
        """FSDP2 and/or tensor parallelism (else: one process, or DDP)."""
        return self.dp_shard > 1 or self.tp > 1

    def dp_rank(self, rank: int) -> int:
        """The data-parallel index of global ``rank`` (tp is the fastest mesh dimension)."""
        return rank // self.tp

    def check_model(self, specs: Sequence[BlockSpec], vocab_size: int, seq_lens: Sequence[int] = ()) -> None:
        """Every layer's parts have a tensor-parallel plan and divide by ``tp``; the vocabulary and the
        sequence lengths too (vocab-sharded embedding, sequence-parallel norms). No tensor work."""
        if self.tp == 1:
            return
        for i, spec in enumerate(specs):
            error = tp_refusal(spec, self.tp)
            if error is not None:
                where = f" (layer {i})" if len(specs) > 1 and i else ""
                raise ConfigError(error.field, error.value, f"{error.allowed}{where}")
        if vocab_size % self.tp:
            raise ConfigError(
                "parallel.tp", self.tp, f"must divide model.vocab_size={vocab_size} (the embedding is split by rows)"
            )
        for length in seq_lens:
            if length % self.tp:
                raise ConfigError(
                    "parallel.tp",
                    self.tp,
                    f"must divide the sequence length {length} (sequence parallelism splits tokens between ranks)",
                )

    def mesh(self, device_type: str):  # -> DeviceMesh
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, (self.dp_replicate, self.dp_shard, self.tp), mesh_dim_names=MESH_DIMS)


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
