"""Auxiliary losses: training objectives a part adds beside the model's loss (a router's load
balance, a z-loss), through one mechanism any part may use.

A part class declares the losses it may record and their default weights::

    aux_losses = {"balance": 0.01, "router_z": 0.001}

and records a scalar during a training forward with :func:`record_aux` (nothing is kept in eval()
or without gradients). The model collects them with :func:`collect_aux`: each name's mean over the
modules that recorded it (so a weight does not depend on depth), which clears the records. The
trainer adds ``weight * value`` for each, a weight being ``train.aux_weights.<name>`` or else the
part's default, and logs each value as ``aux_<name>``.

A part may also keep state that no gradient trains (a router's balancing bias): its ``after_step``
hook updates it after each optimizer step, called on every module that defines it
(:func:`after_step_hooks`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from zoo.core.errors import ConfigError
from zoo.core.interface import defines, hook

_RECORDS = "_aux_records"


def record_aux(module: nn.Module, name: str, value: torch.Tensor) -> None:
    """Record ``value`` (a scalar) as ``module``'s auxiliary loss ``name`` for this training forward.

    Kept only in train() with gradients enabled; a later forward replaces it. ``name`` must be one
    of the module class's ``aux_losses``.
    """
    if not (module.training and torch.is_grad_enabled()):
        return
    if name not in declared_aux(type(module)):
        raise ValueError(
            f"{type(module).__name__} records aux loss {name!r} but declares only {declared_aux(type(module))}"
        )
    module.__dict__.setdefault(_RECORDS, {})[name] = value


def declared_aux(cls: type) -> dict[str, float]:
    """The auxiliary losses a part class declares, with their default weights."""
    declared = hook(cls, "aux_losses")
    return dict(declared) if isinstance(declared, Mapping) else {}


def model_aux(model: nn.Module) -> dict[str, float]:
    """Every auxiliary loss some module of ``model`` declares, with its default weight."""
    weights: dict[str, float] = {}
    for module in model.modules():
        weights.update(declared_aux(type(module)))
    return weights


def collect_aux(model: nn.Module) -> dict[str, torch.Tensor]:
    """Each recorded auxiliary loss of ``model``'s modules, averaged over the modules that recorded
    it; the records are cleared."""
    sums: dict[str, list[torch.Tensor]] = {}
    for module in model.modules():
        records = module.__dict__.pop(_RECORDS, None)
        for name, value in (records or {}).items():
            sums.setdefault(name, []).append(value)
    return {name: torch.stack(values).mean() for name, values in sums.items()}


def aux_weights(
    model: nn.Module, configured: Mapping[str, float], field: str = "train.aux_weights"
) -> dict[str, float]:
    """The weight of each auxiliary loss ``model`` declares: ``configured`` over the parts' defaults.
    A configured name no part of the model declares raises ConfigError."""
    weights = model_aux(model)
    for name, weight in configured.items():
        if name not in weights:
            known = ", ".join(weights) or "none (no part of this model records one)"
            raise ConfigError(f"{field}.{name}", weight, f"not an auxiliary loss of this model; declared: {known}")
        if weight < 0:
            raise ConfigError(f"{field}.{name}", weight, "must be >= 0")
        weights[name] = float(weight)
    return weights


def after_step_hooks(model: nn.Module) -> list[Callable[[], None]]:
    """The ``after_step`` hook of every module of ``model`` that defines one, in module order: what a
    training step calls after the optimizer's."""
    return [hook(module, "after_step") for module in model.modules() if defines(module, "after_step")]
