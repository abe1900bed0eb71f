"""The training recipe's extension points: optimizers (``optim=<name>``) and learning-rate schedules
(``schedule=<name>``), registered and listed like the block's parts.

An optimizer or a schedule is a class whose keyword-only constructor arguments are its options
(``optim.momentum=0.9``, ``schedule.decay_fraction=0.2``: type-checked, misspellings named), registered
with ``@OPTIMIZERS.register("name")`` or ``@SCHEDULES.register("name")`` plus an option file
``conf/optim/<name>.yaml`` or ``conf/schedule/<name>.yaml``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import nn

from zoo.core.registry import Registry

#: ``optim=<name>``: how the parameters are updated.
OPTIMIZERS = Registry("optim", where="optim.name")
#: ``schedule=<name>``: the learning rate at each step.
SCHEDULES = Registry("schedule", where="schedule.name")


class Optimizer(ABC):
    """An ``optim=<name>`` entry: builds the torch optimizer for a model.

    Every parameter lands in exactly one param group. A group may carry ``lr_ratio``: its rate over
    the run's main rate (``train.lr``, what ``tune.lr`` tunes); the trainer sets each group's ``lr`` to
    ``schedule rate x lr_ratio`` every step (1 when absent). ``weight_decay`` is ``train.weight_decay``,
    applied to the groups the optimizer decays.
    """

    #: ``train`` keys the optimizer reads (``adamw``: beta1, beta2): the run passes each to the constructor
    #: as a keyword argument of that name; they are not ``optim.*`` options (``optim.beta1`` is refused).
    train_keys: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def build(self, model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        """The optimizer over every parameter of ``model``."""

    def check(self, *, sharded: bool, tp: int, compile: bool) -> None:
        """Refuse, before any tensor work, a combination this optimizer cannot run (a ConfigError naming
        the key, the value and why); nothing by default."""
        return None


class Schedule(ABC):
    """A ``schedule=<name>`` entry: the learning rate as a pure function of the step."""

    @abstractmethod
    def lr_at(self, step: int, *, steps: int, lr: float, warmup_steps: int, min_lr_ratio: float) -> float:
        """The rate at 0-based ``step`` of ``steps``, for the main rate ``lr``."""

    def check(self, *, steps: int, warmup_steps: int) -> None:
        """Refuse settings this schedule cannot run (e.g. a warmup longer than the run); nothing by default."""
        return None
