"""The model of a run, built in one place from the run's recorded config with every axis applied.

The trainer, resume, :func:`zoo.load_run`, ``zoo-eval``, ``zoo-generate``, the lm-eval model, ``to_hf``
and ``zoo-coordcheck`` all build a run's model through :func:`build_run_model` (or a :class:`RunModel`
that a checked plan already holds), so a run comes back as it trained:

- the task's model kind (a decoder-only language model, or the encoder-decoder a ``transduce`` task trains);
- ``model.vocab_size`` null taking the task's vocabulary (:func:`with_task_vocab`, applied when a run starts
  and recorded, so the recorded config names the vocabulary it trained);
- the initialization (``init=<scheme>``: zoo.assembly.init.initialize);
- the parametrization (``param=mup``: the logit multiplier and the attention score scales, zoo.lab.recipe.param).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from zoo.assembly.init import init_options, initialize
from zoo.assembly.mup import MuP
from zoo.assembly.spec import BlockSpec, to_dict
from zoo.core.errors import ConfigError
from zoo.lab.recipe.param import infer_for, param_options, parametrize
from zoo.lab.tasks.base import Task, task_options
from zoo.models.config import block_section, model_options, stack_specs
from zoo.models.language import LanguageModel


@dataclass(frozen=True)
class RunModel:
    """What builds a run's model: the task's class (which model kind it trains), the layer specs and the
    μP scalings (None under ``param=standard``)."""

    task_cls: type[Task]
    specs: tuple[BlockSpec, ...]
    mup: MuP | None

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> RunModel:
        """From a recorded run config alone (no data read, no run folder touched)."""
        config = with_task_vocab(config)
        task_cls, _ = task_options(config.get("task"))
        options = model_options(config)
        specs = stack_specs(block_section(config), options)
        param = param_options(config.get("param"))
        mup = infer_for(config, param["base_width"]) if param["name"] == "mup" else None
        return cls(task_cls, tuple(specs), mup)

    def build(self, config: Mapping[str, Any]) -> nn.Module:
        """The model, freshly initialized from the current torch seed, under the run's parametrization."""
        model = self.task_cls.build_model(with_task_vocab(config), self.specs)
        init = init_options(config.get("init"))
        if not self.task_cls.builds_own_model():  # a decoder-only model: 2 residual branches a layer
            initialize(model, init, self.specs[0].dims.d_model, 2 * len(self.specs))
        return parametrize(model, self.mup)


def build_run_model(config: Mapping[str, Any] | Any) -> nn.Module:
    """The model a run with ``config`` (its summary.json's ``config``, or a composed one) trained, freshly
    initialized."""
    config = to_dict(config)
    return RunModel.of(config).build(config)


def task_vocab_size(task: Mapping[str, Any] | None) -> int:
    """The vocabulary of the ``task`` section, read without building the task where the task can say
    (:meth:`Task.planned_vocab_size`), else from the built task."""
    task_cls, options = task_options(task)
    planned = task_cls.planned_vocab_size(options)
    return planned if planned is not None else task_cls(**options).vocab_size


def with_task_vocab(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with ``model.vocab_size`` null replaced by the task's vocabulary (unchanged when set)."""
    model = config.get("model") or {}
    if not isinstance(model, Mapping) or model.get("vocab_size") is not None:
        return dict(config)
    return {**config, "model": {**model, "vocab_size": task_vocab_size(config.get("task"))}}


def is_language_model(model: nn.Module, command: str, hint: str = "") -> None:
    """Refuse, naming the command, a run whose model is not a decoder-only language model."""
    if not isinstance(model, LanguageModel):
        raise ConfigError("run", type(model).__name__, f"a decoder-only run for {command}{hint}")


__all__: Sequence[str] = ["RunModel", "build_run_model", "is_language_model", "task_vocab_size", "with_task_vocab"]
