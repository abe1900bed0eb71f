"""Learning-rate schedules, as ``schedule=<name>`` entries: pure functions of the 0-based step.

Every one warms up linearly over ``train.warmup_steps`` (step ``s``: ``lr (s + 1) / W``) and never goes
below ``lr x train.min_lr_ratio`` after it. A phase that decays from step ``a`` runs its progress
``p = (s - a) / (steps - a)`` from 0 (at the peak) towards 1 (the floor): the cosine's convention.
"""

from __future__ import annotations

import math
from typing import Literal

from zoo.core.errors import ConfigError
from zoo.lab.recipe.base import SCHEDULES, Schedule

#: ``schedule.shape`` of a WSD decay: the rate's fraction of the way from the peak at progress ``p``.
SHAPES = {
    "linear": lambda p: 1 - p,
    "cosine": lambda p: 0.5 * (1 + math.cos(math.pi * p)),
    "1-sqrt": lambda p: 1 - math.sqrt(p),
}


def warmup(step: int, lr: float, warmup_steps: int) -> float:
    """The warmup's rate at ``step`` (< ``warmup_steps``)."""
    return lr * (step + 1) / warmup_steps


def progress(step: int, start: int, steps: int) -> float:
    """How far ``step`` is through a decay from ``start`` to ``steps``: 0 at ``start``, capped at 1."""
    return min(1.0, (step - start) / max(1, steps - start))


def refuse_warmup_past(name: str, warmup_steps: int, last: int, what: str) -> None:
    """A ConfigError when the warmup does not end by step ``last`` (``what`` says why that bound)."""
    if warmup_steps > last:
        raise ConfigError("train.warmup_steps", warmup_steps, f"must be at most {last} for schedule={name} ({what})")


@SCHEDULES.register("cosine", formula="lr_min + (lr - lr_min) (1 + cos(pi p)) / 2")
class Cosine(Schedule):
    """Linear warmup, then a cosine decay to ``lr x min_lr_ratio``: the default.

    A warmup longer than the run is allowed (it never reaches the peak), as it always was.
    """

    def lr_at(self, step: int, *, steps: int, lr: float, warmup_steps: int, min_lr_ratio: float) -> float:
        if step < warmup_steps:
            return warmup(step, lr, warmup_steps)
        low = lr * min_lr_ratio
        return low + 0.5 * (lr - low) * (1 + math.cos(math.pi * progress(step, warmup_steps, steps)))


@SCHEDULES.register("linear", formula="lr_min + (lr - lr_min) (1 - p)")
class Linear(Schedule):
    """Linear warmup, then a linear decay to ``lr x min_lr_ratio``."""

    def lr_at(self, step: int, *, steps: int, lr: float, warmup_steps: int, min_lr_ratio: float) -> float:
        if step < warmup_steps:
            return warmup(step, lr, warmup_steps)
        low = lr * min_lr_ratio
        return low + (lr - low) * (1 - progress(step, warmup_steps, steps))

    def check(self, *, steps: int, warmup_steps: int) -> None:
        refuse_warmup_past("linear", warmup_steps, steps, "train.steps: the warmup must end within the run")


@SCHEDULES.register("constant", formula="lr")
class Constant(Schedule):
    """Linear warmup, then the peak rate to the end."""

    def lr_at(self, step: int, *, steps: int, lr: float, warmup_steps: int, min_lr_ratio: float) -> float:
        return warmup(step, lr, warmup_steps) if step < warmup_steps else lr

    def check(self, *, steps: int, warmup_steps: int) -> None:
        refuse_warmup_past("constant", warmup_steps, steps, "train.steps: the warmup must end within the run")


@SCHEDULES.register("inverse_sqrt", formula="max(lr_min, lr sqrt(T / (s - W + T))), T = max(W, 1)")
class InverseSqrt(Schedule):
    """Linear warmup, then a decay as one over the square root of the step (Vaswani et al. 2017)."""

    def lr_at(self, step: int, *, steps: int, lr: float, warmup_steps: int, min_lr_ratio: float) -> float:
        if step < warmup_steps:
            return warmup(step, lr, warmup_steps)
        scale = max(warmup_steps, 1)  # the peak at the first step after warmup, then lr sqrt(W / s)
        return max(lr * min_lr_ratio, lr * math.sqrt(scale / (step - warmup_steps + scale)))

    def check(self, *, steps: int, warmup_steps: int) -> None:
        refuse_warmup_past("inverse_sqrt", warmup_steps, steps, "train.steps: the warmup must end within the run")


@SCHEDULES.register("wsd", formula="lr, then lr_min + (lr - lr_min) shape(p) over the last decay_fraction")
class WSD(Schedule):
    """Warmup-stable-decay: linear warmup, the peak rate, then a decay over the last ``decay_fraction``
    of the steps to ``lr x min_lr_ratio`` (Hägele et al. 2024)."""

    def __init__(self, *, decay_fraction: float = 0.2, shape: Literal["linear", "cosine", "1-sqrt"] = "1-sqrt"):
        if not 0 < decay_fraction <= 1:
            raise ConfigError("schedule.decay_fraction", decay_fraction, "must be in (0, 1]")
        self.decay_fraction, self.shape = decay_fraction, shape

    def decay_start(self, steps: int) -> int:
        """The first step of the decay: the last ``round(decay_fraction x steps)`` steps (at least 1) decay."""
        return steps - max(1, round(self.decay_fraction * steps))

    def lr_at(self, step: int, *, steps: int, lr: float, warmup_steps: int, min_lr_ratio: float) -> float:
        if step < warmup_steps:
            return warmup(step, lr, warmup_steps)
        start = self.decay_start(steps)
        if step < start:
            return lr
        low = lr * min_lr_ratio
        return low + (lr - low) * SHAPES[self.shape](progress(step, start, steps))

    def check(self, *, steps: int, warmup_steps: int) -> None:
        start = self.decay_start(steps)
        refuse_warmup_past("wsd", warmup_steps, start, f"its decay starts at step {start} of train.steps={steps}")
