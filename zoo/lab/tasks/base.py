"""The task interface the trainer sees: batches of token ids and targets, and named metrics."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch

from zoo.assembly.spec import to_dict
from zoo.core.errors import ConfigError
from zoo.core.options import resolve_options
from zoo.core.registry import Registry

#: Target value for positions that are not scored (``F.cross_entropy``'s default ignore_index).
IGNORE = -100


@dataclass(frozen=True)
class Batch:
    """``inputs`` (b, t) token ids; ``targets`` (b, t) the token each position should predict, or IGNORE."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.inputs.to(device, non_blocking=True), self.targets.to(device, non_blocking=True))


class Task(ABC):
    """A training task. Subclasses take their options as keyword-only constructor arguments
    (they become the ``task.*`` config keys, type-checked) and implement the data.

    Metrics are named ``val_<name>`` at the trained length and ``val_<name>_<k>x`` at k times it.
    """

    name: ClassVar[str]
    vocab_size: int
    seq_len: int

    def __init__(self, *, eval_lengths: tuple[int, ...] = (1,), metric: str | None = None) -> None:
        self.eval_lengths = eval_lengths
        names = self.metric_names()
        self.metric = metric or names[0]
        if self.metric not in names:
            raise ConfigError("task.metric", self.metric, f"one of {', '.join(names)}")

    # -- data ---------------------------------------------------------------------------------
    @abstractmethod
    def train_batch(self, batch_size: int, generator: torch.Generator) -> Batch:
        """A fresh training batch drawn with ``generator`` (the run's data seed)."""

    @abstractmethod
    def val_batches(self, batch_size: int, n_batches: int, factor: int = 1) -> list[Batch]:
        """The fixed validation set at ``factor`` times the trained length: the same for every run."""

    @abstractmethod
    def info(self) -> dict[str, Any]:
        """What the data is: its source, sizes and a hash (recorded in summary.json)."""

    # -- metrics ------------------------------------------------------------------------------
    #: Metric names (without ``val_`` and the length suffix) and whether lower is better.
    metrics: ClassVar[dict[str, str]] = {"loss": "min"}

    def compute(self, loss_sum: float, count: int, correct: int) -> dict[str, float]:
        """Metrics from summed cross-entropy (nats), scored positions and correct argmax predictions."""
        return {"loss": loss_sum / max(count, 1)}

    def metric_names(self) -> list[str]:
        return [metric_name(m, f) for m in self.metrics for f in self.eval_lengths]

    def mode(self, metric: str | None = None) -> str:
        """``min`` or ``max``: which way is better for ``metric`` (default: the headline metric)."""
        base = (metric or self.metric).removeprefix("val_")
        for name, mode in self.metrics.items():
            if base == name or base.startswith(f"{name}_"):
                return mode
        return "min"


def metric_name(base: str, factor: int) -> str:
    return f"val_{base}" if factor == 1 else f"val_{base}_{factor}x"


TaskT = TypeVar("TaskT", bound=type[Task])

#: Tasks by name: the same registry (and option checking) as the block's parts.
TASKS = Registry("task", where="task.name")


def register_task(name: str, **registration: Any) -> Callable[[TaskT], TaskT]:
    """Class decorator: make a Task subclass available as ``task.name=<name>``."""

    def decorator(cls: TaskT) -> TaskT:
        cls.name = name
        return TASKS.register(name, **registration)(cls)

    return decorator


def build_task(cfg: Mapping[str, Any] | Any) -> Task:
    """A task from the ``task`` config section; bad names, keys and types raise ConfigError."""
    raw = to_dict(cfg) if cfg is not None else {}
    part = TASKS.get(raw.pop("name", None))
    options = resolve_options(part, raw, "task")
    if "eval_lengths" in options:
        options["eval_lengths"] = check_lengths(options["eval_lengths"])
    return part.cls(**options)


def check_lengths(value: Any) -> tuple[int, ...]:
    """``task.eval_lengths``: positive integer multiples of the trained length, 1 first."""
    allowed = "a list of positive integers (multiples of the trained length), e.g. [1, 2, 4]"
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError("task.eval_lengths", value, allowed)
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError("task.eval_lengths", value, allowed)
    return tuple(sorted(set(value)))


def positive(field: str, value: int | float) -> None:
    if value <= 0 or (isinstance(value, float) and not math.isfinite(value)):
        raise ConfigError(field, value, "must be positive")
