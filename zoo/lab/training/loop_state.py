"""The loop's running values (:class:`LoopState`, what a checkpoint keeps of them) and what a run's loop
did (:class:`FitResult`), read by the trainer and its callbacks."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch


@dataclass
class FitResult:
    """What :meth:`Trainer.fit` did: ``status`` is ``ok`` or ``diverged``."""

    status: str
    steps: int
    tokens: int
    train_time_s: float
    tokens_per_s: float
    final: dict[str, float | None]
    reason: str | None = None
    initial: dict[str, float | None] = field(default_factory=dict)  # validation of the initial weights (step 0)
    spikes: dict[str, Any] = field(default_factory=dict)  # zoo.lab.training.spikes: {"count", "steps"}
    steady_steps: int = 0  # the steps this process trained after its first (compile and kernel warm-up)
    steady_time_s: float = 0.0  # ... and their training time

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoopState:
    """The loop's running values. A checkpoint keeps those in :data:`SAVED` (``state.json``'s ``loop``:
    the same on every rank; ``initial`` and ``curve`` are missing from older checkpoints); ``loss_sum``,
    ``aux_sums`` and the gradient norms since the last log step are per rank, on the device."""

    SAVED: ClassVar[tuple[str, ...]] = (
        "n_summed", "reference", "last_loss", "final_val", "train_time", "initial", "callback_state",
    )  # fmt: skip

    n_summed: int = 0  # steps summed into loss_sum since the last log step
    reference: float | None = None  # the first logged loss (divergence is judged against it)
    last_loss: float | None = None
    final_val: dict[str, float | None] = field(default_factory=dict)  # the last evaluation's metrics
    initial: dict[str, float | None] = field(default_factory=dict)  # the evaluation of the initial weights
    train_time: float = 0.0  # seconds of training (no evaluation) up to the last log step
    loss_sum: torch.Tensor | None = None
    grad_sum: torch.Tensor | None = None  # the steps' gradient norms (before clipping) since the last log step
    grad_max: torch.Tensor | None = None  # ... and the largest of them
    #: Each step's loss and gradient norm since the last log step, on the device (a pair of scalars per step).
    pending: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    #: ``[step, loss, grad_norm]`` of every step up to the latest log step since the one before (the loss
    #: averaged over ranks, None where unknown): set before the log step's ``train`` record is emitted.
    logged_steps: list[list[float | None]] = field(default_factory=list)
    #: The callbacks' own state, by callback name (plain values): checkpoints keep it, a resumed run goes on.
    callback_state: dict[str, Any] = field(default_factory=dict)
    aux_sums: dict[str, torch.Tensor] = field(default_factory=dict)  # each auxiliary loss since the last log
    last_aux: dict[str, float] = field(default_factory=dict)  # their means at the last log step
    #: ``(step, training time)`` at the end of the first step this process trained: the steps after it are
    #: the steady ones a run's ``flops_per_second`` is read over (not in a checkpoint: per process).
    warm: tuple[int, float] | None = None
    step: int = 0
    status: str = "ok"
    reason: str | None = None

    def saved(self, train_time: float) -> dict[str, Any]:
        """What a checkpoint records of the loop, with ``train_time`` up to now: copies, as the checkpoint is
        written on a background thread while the loop goes on (the logged curve grows in place)."""
        return {**{name: copy.deepcopy(getattr(self, name)) for name in self.SAVED}, "train_time": train_time}

    def restore(self, loop: dict[str, Any]) -> None:
        """Take the values a checkpoint recorded (:meth:`saved`)."""
        for name in self.SAVED:
            if name in loop:  # "initial", "callback_state": not in checkpoints written before they were recorded
                setattr(self, name, loop[name])
