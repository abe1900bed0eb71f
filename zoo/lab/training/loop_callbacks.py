"""The built-in callbacks of every run, each on when its own keys ask for it, and the run's callbacks
built from its config (:func:`run_callbacks`, after :func:`check_callbacks` before any tensor work).

- ``records``: every record to ``metrics.jsonl`` and the tracker (``logger=``), on rank 0;
- ``progress``: the progress bar (``progress``: null shows it on a terminal), on rank 0;
- ``probes``: ``train.probe_every``'s probe records (zoo.lab.training.probes), on rank 0;
- ``spikes``: the spike score of every step's loss and gradient norm, into the summary (zoo.lab.training.spikes);
- ``tail_ema``: ``train.tail_ema``'s average of the weights, evaluated at the end (zoo.lab.recipe.tail_ema);
- ``checkpoints``: a checkpoint every ``train.checkpoint_every`` steps, on every rank.
"""

from __future__ import annotations

import difflib
import inspect
import logging
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from zoo.core.errors import ConfigError
from zoo.core.registry import FAILED_PLUGINS
from zoo.lab.recipe import tail_ema
from zoo.lab.records.checkpoint import TrainState
from zoo.lab.training import spikes
from zoo.lab.training.callbacks import CALLBACKS, Callback, RunContext
from zoo.lab.training.loop_state import FitResult, LoopState
from zoo.lab.training.probes import Probes


@CALLBACKS.register("records")
class Records(Callback):
    """Every metrics record to `metrics.jsonl` and the experiment tracker (`logger=`), on rank 0."""

    always = True

    def __init__(self, metrics: Any, tracker: Any) -> None:
        self.metrics, self.tracker = metrics, tracker

    @classmethod
    def from_run(cls, run: RunContext, **options: Any) -> Callback | None:
        return cls(run.metrics, run.tracker) if run.metrics is not None and run.tracker is not None else None

    def on_record(self, record: dict[str, Any]) -> None:
        self.metrics.write(record)
        self.tracker.log(record)


@CALLBACKS.register("progress")
class Progress(Callback):
    """The progress bar, with the logged loss and tokens/s (`progress`: null on a terminal only), on rank 0."""

    always = True
    own_key = "progress"

    def __init__(self, show: bool | None = None) -> None:
        self.show, self.bar, self.last = show, None, 0

    @classmethod
    def from_run(cls, run: RunContext, **options: Any) -> Callback | None:
        show = run.config.get("progress")
        return None if run.rank != 0 or show is False else cls(show)

    def on_run_start(self, loop: LoopState, first: int) -> None:
        disable = None if self.show is None else False  # None: shown on a terminal
        self.last = first - 1
        steps = self.trainer.cfg.steps
        self.bar = tqdm(total=steps, initial=self.last, disable=disable, unit="step", dynamic_ncols=True)

    def on_record(self, record: dict[str, Any]) -> None:
        if record.get("kind") != "train" or self.bar is None:
            return
        self.bar.update(record["step"] - self.last)
        self.last = record["step"]
        self.bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:,.0f}", refresh=False)

    def on_run_end(self, loop: LoopState, result: FitResult) -> None:
        if self.bar is not None:
            self.bar.close()


@CALLBACKS.register("probes")
class Probing(Callback):
    """`train.probe_every`: attention and output logits, residual RMS, gradient norms and update ratios, on rank 0."""

    always = True
    own_key = "train.probe_every"

    def __init__(self, every: int) -> None:
        self.every, self.probes, self.due = every, None, False

    @classmethod
    def from_run(cls, run: RunContext, **options: Any) -> Callback | None:
        return cls(run.train.probe_every) if run.train.probe_every and run.rank == 0 else None

    def on_run_start(self, loop: LoopState, first: int) -> None:
        trainer = self.trainer
        self.probes = Probes(trainer.model, trainer.optimizer, self.every, trainer.cfg.steps)

    def on_backward_end(self, loop: LoopState, step: int) -> None:
        assert self.probes is not None
        self.due = self.probes.due(step)
        if self.due:
            self.probes.snapshot()  # the gradients and the weights before the update

    def on_step_end(self, loop: LoopState, step: int) -> None:
        if not self.due:
            return
        assert self.probes is not None
        values = self.probes.record(self.trainer.task.logits, self.trainer.first_val_batch())
        self.trainer.emit({"kind": "probe", "step": step, "tokens": step * self.trainer.tokens_per_step, **values})
        self.due = False


@CALLBACKS.register("spikes")
class SpikeDetection(Callback):
    """The steps where the loss or the gradient norm spiked, judged on every step, into summary.json's `spikes`."""

    always = True

    def __init__(self) -> None:
        self.loop: LoopState | None = None

    @classmethod
    def from_run(cls, run: RunContext, **options: Any) -> Callback | None:
        return cls()

    def on_run_start(self, loop: LoopState, first: int) -> None:
        self.loop = loop
        loop.callback_state.setdefault("spikes", spikes.new_state())  # a resumed run's goes on

    def on_record(self, record: dict[str, Any]) -> None:
        if record.get("kind") == "train" and self.loop is not None:
            spikes.update(self.loop.callback_state["spikes"], self.loop.logged_steps)

    def on_run_end(self, loop: LoopState, result: FitResult) -> None:
        result.spikes = spikes.result(loop.callback_state["spikes"])


@CALLBACKS.register("tail_ema")
class TailEMA(Callback):
    """`train.tail_ema`: the weights' EMA from `train.tail_ema_from` on, evaluated at the end (`val_loss_ema` ...)."""

    always = True
    own_key = "train.tail_ema"

    def __init__(self, decay: float, start: int) -> None:
        self.decay, self.start = decay, start

    @classmethod
    def from_run(cls, run: RunContext, **options: Any) -> Callback | None:
        return cls(run.train.tail_ema, run.train.tail_ema_from) if run.train.tail_ema else None

    def on_step_end(self, loop: LoopState, step: int) -> None:
        if step >= self.start:  # before the checkpoint of this step (registered before it)
            ema = loop.callback_state.get("tail_ema", {})
            loop.callback_state["tail_ema"] = tail_ema.update(ema, self.trainer.model, self.decay)

    def on_run_end(self, loop: LoopState, result: FitResult) -> None:
        ema = loop.callback_state.get("tail_ema")
        if not ema and result.status == "ok":
            logging.getLogger(__name__).warning(
                "train.tail_ema_from=%d is past the run's last step %d: no tail EMA, no *_ema metrics",
                self.start, self.trainer.cfg.steps,
            )
        if not ema or result.status != "ok":
            return
        kept = tail_ema.swapped(self.trainer.model, ema)
        metrics = self.trainer.evaluate()
        tail_ema.swapped(self.trainer.model, kept)
        result.final.update({f"{key}_ema": value for key, value in metrics.items()})


@CALLBACKS.register("checkpoints")
class Checkpoints(Callback):
    """A checkpoint every `train.checkpoint_every` steps (not at the last: the final weights are saved), every rank."""

    always = True
    own_key = "train.checkpoint_every"

    def __init__(self, every: int, save: Callable[[TrainState, Any, Any], None] | None) -> None:
        self.every, self.save = every, save

    @classmethod
    def from_run(cls, run: RunContext, **options: Any) -> Callback | None:
        every = run.train.checkpoint_every
        wanted = every > 0 and (run.save_checkpoint is not None or run.world > 1)  # every rank gathers
        return cls(every, run.save_checkpoint) if wanted else None

    def on_step_end(self, loop: LoopState, step: int) -> None:
        if step % self.every or step >= self.trainer.cfg.steps:
            return
        state = self.trainer.checkpoint_state(step, loop)
        if self.save is not None:  # rank 0, or every rank of a sharded run
            self.save(state, self.trainer.model, self.trainer.optimizer)
            self.trainer.checkpointed(state)


def check_callbacks(raw: Any) -> list[tuple[str, dict[str, Any]]]:
    """The ``callbacks`` key checked before any tensor work: ``[(name, options)]``. Each entry a registered
    callback's name or ``{name: {option: value}}``; a built-in (always on) is refused, as are options its
    class does not take."""
    entries = raw if isinstance(raw, (list, tuple)) else [raw] if raw else []
    named = []
    for entry in entries:
        if isinstance(entry, dict) and len(entry) == 1:
            name, options = next(iter(entry.items()))
        elif isinstance(entry, str):
            name, options = entry, {}
        else:
            raise ConfigError("callbacks", raw, "a list of callback names, or {name: {option: value}} entries")
        if str(name) not in CALLBACKS or CALLBACKS.get(str(name)).cls.always:
            raise not_a_callback(str(name))
        part = CALLBACKS.get(str(name))
        options = dict(options or {})
        accepted = inspect.signature(part.cls).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
        for key in options:
            if not takes_any and key not in accepted:
                allowed = ", ".join(accepted) or "none"
                raise ConfigError(f"callbacks.{name}.{key}", options[key], f"options of {name}: {allowed}")
        named.append((str(name), options))
    return named


def not_a_callback(name: str) -> ConfigError:
    """``callbacks`` naming a built-in or an unknown callback: the closest name and the list offer only those
    ``callbacks`` may give (a plugin's); the built-ins are listed with the keys that turn them on."""
    parts = CALLBACKS.parts()
    givable = [p.name for p in parts if not p.cls.always]
    builtins = ", ".join(f"{p.name} ({p.cls.own_key or 'every run'})" for p in parts if p.cls.always)
    if name in CALLBACKS:
        part = CALLBACKS.get(name).cls
        what = f"built in: on by its own key {part.own_key}" if part.own_key else "built in: on in every run"
    else:
        close = difflib.get_close_matches(name, givable, n=1)
        what = "unknown callback" + (f"; did you mean {close[0]!r}?" if close else "")
    offered = ", ".join(givable) or "none (a plugin registers one: docs/runs.md, Adding a callback)"
    failed = "".join(f"; {failure}" for failure in FAILED_PLUGINS)
    listed = f"to name here: {offered}; built in, each on by its own key: {builtins}{failed}"
    return ConfigError("callbacks", name, f"{what}; {listed}")


def run_callbacks(run: RunContext, named: list[tuple[str, dict[str, Any]]]) -> list[Callback]:
    """Every built-in callback ``run`` turns on, then those ``callbacks`` names, in its order."""
    built = [part.cls.from_run(run) for part in CALLBACKS.parts() if part.cls.always]
    built += [CALLBACKS.get(name).cls.from_run(run, **options) for name, options in named]
    return [callback for callback in built if callback is not None]

