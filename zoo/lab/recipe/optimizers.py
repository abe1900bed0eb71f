"""The optimizers torch ships, as ``optim=<name>`` entries: ``adamw`` (the default), ``sgd``, ``adafactor``.

Each puts the matrices and the embedding (every parameter with ``ndim >= 2``) in a group decayed by
``train.weight_decay`` and the biases and norm gains (``ndim < 2``) in one that is not.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from zoo.core.errors import ConfigError
from zoo.lab.recipe.base import OPTIMIZERS, Optimizer


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two param groups: ``ndim >= 2`` (matrices, embedding) decayed by ``weight_decay``; the rest not."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def in_range(field: str, value: float, low: float, high: float, *, closed_high: bool = False) -> None:
    """A ConfigError unless ``low <= value < high`` (``<= high`` when ``closed_high``)."""
    if not (low <= value <= high if closed_high else low <= value < high):
        raise ConfigError(field, value, f"must be in [{low:g}, {high:g}{']' if closed_high else ')'}")


@OPTIMIZERS.register("adamw", reference="Loshchilov & Hutter 2019 (torch.optim.AdamW)")
class AdamW(Optimizer):
    """AdamW (decoupled weight decay): the default; betas from ``train.beta1`` and ``train.beta2``."""

    train_keys: ClassVar[tuple[str, ...]] = ("beta1", "beta2")

    def __init__(self, *, beta1: float = 0.9, beta2: float = 0.95, eps: float = 1e-8) -> None:
        if not eps > 0:
            raise ConfigError("optim.eps", eps, "must be > 0")
        self.betas, self.eps = (beta1, beta2), eps

    def build(self, model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        return torch.optim.AdamW(decay_groups(model, weight_decay), lr=lr, betas=self.betas, eps=self.eps)


@OPTIMIZERS.register("sgd", reference="Sutskever et al. 2013 (torch.optim.SGD)")
class SGD(Optimizer):
    """SGD with (Nesterov) momentum and coupled weight decay."""

    def __init__(self, *, momentum: float = 0.9, nesterov: bool = True, dampening: float = 0.0) -> None:
        in_range("optim.momentum", momentum, 0.0, 1.0)
        in_range("optim.dampening", dampening, 0.0, 1.0)
        if nesterov and (momentum == 0 or dampening != 0):
            raise ConfigError("optim.nesterov", nesterov, "needs optim.momentum > 0 and optim.dampening=0")
        self.momentum, self.nesterov, self.dampening = momentum, nesterov, dampening

    def build(self, model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        return torch.optim.SGD(
            decay_groups(model, weight_decay), lr=lr, momentum=self.momentum, nesterov=self.nesterov,
            dampening=self.dampening,
        )  # fmt: skip


@OPTIMIZERS.register("adafactor", reference="Shazeer & Stern 2018 (torch.optim.Adafactor)")
class Adafactor(Optimizer):
    """Adafactor: a factored second moment (a row and a column vector per matrix), no first moment."""

    def __init__(self, *, beta2_decay: float = -0.8, eps1: float | None = None, eps2: float = 1e-3, d: float = 1.0):
        if not beta2_decay <= 0:
            raise ConfigError("optim.beta2_decay", beta2_decay, "must be <= 0")
        for field, value in (("optim.eps1", eps1), ("optim.eps2", eps2), ("optim.d", d)):
            if value is not None and not value > 0:
                raise ConfigError(field, value, "must be > 0" + (" (or null)" if field == "optim.eps1" else ""))
        self.beta2_decay, self.eps, self.d = beta2_decay, (eps1, eps2), d

    def build(self, model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        groups = decay_groups(model, weight_decay)
        return torch.optim.Adafactor(groups, lr=lr, beta2_decay=self.beta2_decay, eps=self.eps, d=self.d)

    def check(self, *, sharded: bool, tp: int, compile: bool) -> None:
        if sharded:
            key, value = ("parallel.tp", tp) if tp > 1 else ("parallel.dp_shard", "> 1")
            raise ConfigError(
                key, value, "optim=adafactor factors each whole matrix's second moment over its rows and columns; "
                "a shard's would differ: use parallel.dp_shard=1 parallel.tp=1 (DDP), or optim=adamw or sgd",
            )  # fmt: skip
