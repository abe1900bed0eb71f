"""The hyperball optimizers (Wen et al. 2026, "Fantastic pretraining optimizers 2.1: hyperball optimization";
Marin's MuonH): each hidden logical matrix keeps the Frobenius norm it started with,
``W <- R normalize(W - lr R normalize(u))``, and is never decayed. ``optim=muonh``: ``u`` is Muon's
orthogonalized momentum (``optim=muon optim.hyperball=true``); ``optim=adamh``: ``u`` is Adam's direction.
The embedding, the head, norms, gains and biases are not on a sphere: AdamW trains them at ``train.lr x
adam_lr_ratio``, decayed as under ``optim=muon`` (matrices only).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from zoo.core.errors import ConfigError
from zoo.lab.recipe.base import OPTIMIZERS, Optimizer
from zoo.lab.recipe.muon import Muon, matrix_optimizer

HYPERBALL = "Wen et al. 2026, Fantastic pretraining optimizers and where to find them 2.1: hyperball optimization"

OPTIMIZERS.register(
    "muonh",
    summary="Muon on the hyperball: each hidden matrix keeps its initial Frobenius norm, no decay (optim=muon "
    "optim.hyperball=true).",
    formula="hidden matrices: W <- R normalize(W - lr R normalize(NS5(momentum(g)))), R = |W_0|_F; "
    "the rest: AdamW at lr x adam_lr_ratio",
    reference=f"{HYPERBALL}; marin-community/marin (MuonH)",
    hyperball=True,
)(Muon)


@OPTIMIZERS.register(
    "adamh",
    formula="hidden matrices: W <- R normalize(W - lr R normalize(m_hat / (sqrt(v_hat) + eps))), R = |W_0|_F; "
    "the rest: AdamW at lr x adam_lr_ratio",
    reference=HYPERBALL,
)
class AdamH(Optimizer):
    """Adam on the hyperball: each hidden matrix keeps its initial Frobenius norm, no decay; AdamW for the rest.

    ``train.lr x lr_ratio`` is the step on the sphere as a fraction of each matrix's norm; ``betas`` and ``eps``
    are the matrices' Adam moments'; the AdamW part (embedding, head, gains, biases) runs at ``train.lr x
    adam_lr_ratio`` with ``adam_betas``, ``adam_eps`` and ``adam_weight_decay`` (null: ``train.weight_decay``).
    """

    def __init__(
        self,
        *,
        lr_ratio: float = 1.0,
        betas: tuple[float, ...] = (0.9, 0.95),
        eps: float = 1e-8,
        adam_lr_ratio: float = 0.015,
        adam_betas: tuple[float, ...] = (0.9, 0.95),
        adam_eps: float = 1e-10,
        adam_weight_decay: float | None = None,
    ) -> None:
        for field, value in (("lr_ratio", lr_ratio), ("eps", eps), ("adam_lr_ratio", adam_lr_ratio),
                             ("adam_eps", adam_eps)):  # fmt: skip
            if not value > 0:
                raise ConfigError(f"optim.{field}", value, "must be > 0")
        for field, value in (("betas", betas), ("adam_betas", adam_betas)):
            if not (len(value) == 2 and all(0 <= b < 1 for b in value)):
                raise ConfigError(f"optim.{field}", value, "must be two numbers in [0, 1)")
        if adam_weight_decay is not None and adam_weight_decay < 0:
            raise ConfigError("optim.adam_weight_decay", adam_weight_decay, "must be >= 0, or null for "
                              "train.weight_decay")  # fmt: skip
        self.matrix: dict[str, Any] = {"lr_ratio": lr_ratio, "betas": tuple(betas), "eps": eps, "weight_decay": 0.0,
                                       "direction": "adam", "hyperball": True}  # fmt: skip
        self.adam: dict[str, Any] = {"lr_ratio": adam_lr_ratio, "betas": tuple(adam_betas), "eps": adam_eps}
        self.adam_weight_decay = adam_weight_decay

    def check(self, *, sharded: bool, tp: int, compile: bool) -> None:
        """Refuse FSDP2 and tensor parallelism, as ``optim=muon``: each matrix's norm is the whole matrix's."""
        Muon().check(sharded=sharded, tp=tp, compile=compile)

    def build(self, model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        adam_wd = weight_decay if self.adam_weight_decay is None else self.adam_weight_decay
        return matrix_optimizer(model, lr=lr, matrix=self.matrix, adam=self.adam, adam_wd=adam_wd, whole_as_blocks=True)
