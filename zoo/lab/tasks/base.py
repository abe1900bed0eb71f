"""The task interface the trainer sees: batches, how a batch reaches the model and is scored, named
metrics, and which model the task trains. The defaults are a decoder-only language model's."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

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

    Metrics are named ``val_<name>`` at the trained length and ``val_<name>_<k>x`` at k times it; on a held-out
    source (:attr:`heldout`, :meth:`heldout_batches`) ``val_<name>_<source>``, and ``val_<name>_macro`` their mean.
    """

    name: ClassVar[str]
    vocab_size: int
    seq_len: int
    #: The held-out sources validated on beside the task's own validation set (zoo.lab.data.heldout).
    heldout: tuple[str, ...] = ()

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

    def heldout_batches(self, batch_size: int, n_batches: int) -> dict[str, list[Batch]]:
        """Each held-out source's fixed validation set at the trained length (none by default)."""
        return {}

    @abstractmethod
    def info(self) -> dict[str, Any]:
        """What the data is: its source, sizes and a hash (recorded in summary.json)."""

    @classmethod
    def planned_seq_len(cls, options: Mapping[str, Any]) -> int | None:
        """The trained length the task will have with ``options``, known before it reads any data
        (None when the options do not say, or are not valid: the task's constructor then says why)."""
        seq_len = options.get("seq_len")
        return seq_len if isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len > 0 else None

    @classmethod
    def planned_vocab_size(cls, options: Mapping[str, Any]) -> int | None:
        """The vocabulary the task will have with ``options``, known without reading its data (None: the
        task must be built to tell; a run's ``model.vocab_size: null`` takes it, zoo.lab.planning.run_model)."""
        return None

    #: The options that name files or folders: a run records them made absolute (``summary.json``'s
    #: ``data.paths``), so evaluation reads the same data from any working folder.
    path_options: ClassVar[tuple[str, ...]] = ()

    # -- the model ----------------------------------------------------------------------------
    @classmethod
    def build_model(cls, raw: Mapping[str, Any], specs: Sequence[Any] | None = None) -> nn.Module:
        """The model this task trains, from the run config: a decoder-only language model built from
        ``specs`` (the config's layer specs, already resolved) or from ``raw``. A classmethod: a run's
        model is built without its data (zoo.lab.planning.run_model)."""
        from zoo.models.language import build_model

        return build_model(raw, specs=specs)

    @classmethod
    def builds_own_model(cls) -> bool:
        """Whether the task trains another model than the decoder-only language model (an encoder-decoder)."""
        return cls.build_model.__func__ is not Task.build_model.__func__  # type: ignore[attr-defined]

    def logits(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The logits (b, t, vocab) of ``batch``: a language model reads its ``inputs``."""
        return model(batch.inputs)

    # -- metrics ------------------------------------------------------------------------------
    #: Metric names (without ``val_`` and the length suffix) and whether lower is better.
    metrics: ClassVar[dict[str, str]] = {"loss": "min"}
    #: The names of the float64 sums :meth:`score` returns for a batch (the trainer adds them up over the
    #: validation set and across processes, then hands them to :meth:`compute`).
    sums: ClassVar[tuple[str, ...]] = ("loss_sum", "count", "correct")

    def score(self, model: nn.Module, batch: Batch, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """One validation batch's sums (float64 scalars, named as :attr:`sums`), from its ``logits``
        (float32): summed cross-entropy in nats, scored positions and correct argmax predictions."""
        scored = batch.targets != IGNORE
        logits, targets = logits[scored], batch.targets[scored]  # (n, v), (n,)
        loss = F.cross_entropy(logits, targets, reduction="sum")
        correct = (logits.argmax(-1) == targets).sum()
        return {"loss_sum": loss.double(), "count": scored.sum().double(), "correct": correct.double()}

    def compute(self, sums: Mapping[str, float]) -> dict[str, float]:
        """Metrics (named as :attr:`metrics`) from the validation set's :meth:`score` sums."""
        return {"loss": sums["loss_sum"] / max(sums["count"], 1)}

    def metric_names(self) -> list[str]:
        names = [metric_name(m, f) for m in self.metrics for f in self.eval_lengths]
        sources = [*self.heldout, MACRO] if self.heldout else []
        return names + [heldout_name(m, s) for m in self.metrics for s in sources]

    def mode(self, metric: str | None = None) -> str:
        """``min`` or ``max``: which way is better for ``metric`` (default: the headline metric)."""
        base = (metric or self.metric).removeprefix("val_")
        for name, mode in self.metrics.items():
            if base == name or base.startswith(f"{name}_"):
                return mode
        return "min"


def metric_name(base: str, factor: int) -> str:
    return f"val_{base}" if factor == 1 else f"val_{base}_{factor}x"


#: The name of the mean over a task's held-out sources (``val_bpb_macro``).
MACRO = "macro"


def heldout_name(base: str, source: str) -> str:
    """Metric ``base`` on held-out ``source`` (``val_bpb_cpp``), or their mean for :data:`MACRO`."""
    return f"val_{base}_{source}"


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
    cls, options = task_options(cfg)
    return cls(**options)


def task_options(cfg: Mapping[str, Any] | Any) -> tuple[type[Task], dict[str, Any]]:
    """The ``task`` section checked (name, keys, types, ``eval_lengths``), without reading data:
    the task's class and the options to build it with."""
    raw = to_dict(cfg) if cfg is not None else {}
    part = TASKS.get(raw.pop("name", None))
    options = resolve_options(part, raw, "task")
    if "eval_lengths" in options:
        options["eval_lengths"] = check_lengths(options["eval_lengths"])
    return part.cls, options


def absolute_paths(task: Mapping[str, Any] | Any) -> dict[str, str]:
    """The ``task`` section's file and folder options (:attr:`Task.path_options`) that are set, made
    absolute against the working folder: what a run records so that its data is found from anywhere."""
    cls, options = task_options(task)
    paths = {key: options.get(key) for key in cls.path_options}
    return {key: str(Path(value).expanduser().absolute()) for key, value in paths.items() if isinstance(value, str)}


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


def planned_sum(*terms: Any) -> int | None:
    """The sum of ``terms`` when each is a positive integer (a planned length), else None."""
    if all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in terms):
        return sum(terms)
    return None
