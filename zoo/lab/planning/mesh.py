"""How a run's processes are laid out: the ``parallel`` section checked into a :class:`ProcessMesh`
(``dp_replicate x dp_shard x tp``) against the world size and the model, before any tensor work. Applying it
(FSDP2, tensor parallelism) is :mod:`zoo.lab.training.scale`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
