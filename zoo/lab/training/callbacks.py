"""The training loop's callbacks: everything that happens around the loop (records, the progress bar,
probes, spike detection, checkpoints, a plugin's own) without the loop naming any of it.

A :class:`Callback` has named lifecycle hooks, each a no-op unless overridden:

- ``on_run_start(loop, first)``: before the first step (``first``: 1, or the step after a restored checkpoint's);
- ``on_backward_end(loop, step)``: after a step's backward, before clipping and the optimizer step;
- ``on_step_end(loop, step)``: after a step, once it is logged and evaluated (not after a diverged step);
- ``on_record(record)``: each metrics record the run writes (``train``, ``val``, ``probe``, a plugin's own);
- ``on_evaluation_end(loop, metrics)``: after each evaluation, the initial weights' included (step 0);
- ``on_checkpoint(state)``: after a checkpoint's state is handed to the writer;
- ``on_run_end(loop, result)``: after the last step (or the divergence), with the result to complete.

Before the run starts each callback is given the trainer (:meth:`Callback.attach`), read through
:class:`LoopView`. Time spent in ``on_backward_end``, ``on_step_end`` and evaluation is not training
time (tokens/s counts the steps' own work); a callback may :meth:`LoopView.emit` records of its own.

A plugin registers its class in :data:`CALLBACKS` (``@CALLBACKS.register("name")``, from its package's
``zoo.parts`` entry point like a part) and a run names it: ``callbacks=[name]`` or
``callbacks=[{name: {option: value}}]`` (docs/runs.md, "Adding a callback"). ``callbacks`` is a runtime
key: it never changes a run's config hash.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from zoo.core.registry import Registry
from zoo.lab.planning.train_config import TrainConfig
from zoo.lab.records.checkpoint import TrainState
from zoo.lab.records.metrics import MetricsLog
from zoo.lab.records.trackers import Tracker
from zoo.lab.tasks import Batch, Task
from zoo.lab.training.loop_state import FitResult, LoopState

#: Every callback, built in or from a plugin: ``zoo-parts`` lists them.
CALLBACKS = Registry("callback", where="callbacks")

#: The hooks a callback may override, in the order of a run.
HOOKS = (
    "on_run_start", "on_backward_end", "on_step_end", "on_record", "on_evaluation_end", "on_checkpoint", "on_run_end",
)  # fmt: skip


class LoopView(Protocol):
    """What a callback reads of the trainer, and what it may ask of it."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    task: Task
    cfg: TrainConfig
    device: torch.device
    rank: int
    world: int
    tokens_per_step: int

    def emit(self, record: dict[str, Any]) -> None:
        """Send a metrics record to every callback's ``on_record`` (metrics.jsonl, the tracker...)."""

    def first_val_batch(self) -> Batch:
        """The first validation batch at the training length, on the device."""

    def evaluate(self) -> dict[str, float | None]:
        """Every validation metric of the model's weights as they are now (collective: every rank calls it)."""

    def checkpoint_state(self, step: int, loop: LoopState) -> TrainState:
        """Every rank's state after ``step`` (collective: each rank calls it at the same step)."""

    def checkpointed(self, state: TrainState) -> None:
        """Call every callback's ``on_checkpoint``: ``state`` was handed to the checkpoint writer."""


@dataclass
class RunContext:
    """What a callback may be built from (:meth:`Callback.from_run`): the run's checked train section, its
    whole config, this process's rank, and rank 0's writers (``out_dir`` None and no-op writers elsewhere)."""

    train: TrainConfig
    config: dict[str, Any]
    rank: int = 0
    world: int = 1
    out_dir: Path | None = None
    metrics: MetricsLog | None = None
    tracker: Tracker | None = None
    save_checkpoint: Callable[[TrainState, nn.Module, torch.optim.Optimizer], None] | None = None


class Callback:
    """Hooks around the training loop; override those you need (module docstring: when each runs).

    A built-in callback (``always``) is on in every run, deciding from the run's own keys in
    :meth:`from_run` (``None``: off); any other runs when the config names it in ``callbacks``, built
    with the options given there as keyword arguments.
    """

    #: Built in: :meth:`from_run` decides for every run; otherwise only when ``callbacks`` names it.
    always: ClassVar[bool] = False
    #: A built-in's own run key that turns it on (``progress``, ``train.probe_every``); empty: on in every run.
    own_key: ClassVar[str] = ""
    trainer: LoopView

    @classmethod
    def from_run(cls, run: RunContext, **options: Any) -> Callback | None:
        """This callback for ``run`` (``options``: from ``callbacks``), or None when it has nothing to do."""
        return cls(**options)

    def attach(self, trainer: LoopView) -> None:
        self.trainer = trainer

    def on_run_start(self, loop: LoopState, first: int) -> None: ...

    def on_backward_end(self, loop: LoopState, step: int) -> None: ...

    def on_step_end(self, loop: LoopState, step: int) -> None: ...

    def on_record(self, record: dict[str, Any]) -> None: ...

    def on_evaluation_end(self, loop: LoopState, metrics: dict[str, float | None]) -> None: ...

    def on_checkpoint(self, state: TrainState) -> None: ...

    def on_run_end(self, loop: LoopState, result: FitResult) -> None: ...


class Callbacks:
    """The run's callbacks, called in order at each hook; a hook that no callback overrides costs nothing
    (:meth:`uses`: the loop sets up a step's ``on_backward_end`` only when one does)."""

    def __init__(self, callbacks: Sequence[Callback] = ()) -> None:
        self.callbacks = list(callbacks)
        self.by_hook = {
            hook: [getattr(c, hook) for c in self.callbacks if getattr(type(c), hook) is not getattr(Callback, hook)]
            for hook in HOOKS
        }

    def attach(self, trainer: LoopView) -> None:
        for callback in self.callbacks:
            callback.attach(trainer)

    def uses(self, hook: str) -> bool:
        return bool(self.by_hook[hook])

    def call(self, hook: str, *args: Any) -> None:
        for method in self.by_hook[hook]:
            method(*args)
