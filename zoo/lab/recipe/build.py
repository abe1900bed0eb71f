"""The run's recipe from its ``optim``, ``schedule`` and ``objective`` sections: checked once (before any
tensor work, by :func:`zoo.lab.planning.plan.plan_run`), then what the trainer builds its optimizer, rates and
loss from (the objective's extra heads are the model's: zoo.models.objectives)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from zoo.assembly.mup import lr_ratios
from zoo.core.errors import ConfigError
from zoo.core.options import named_section, resolve_options
from zoo.core.registry import Registry
from zoo.lab.recipe.base import OPTIMIZERS, SCHEDULES, Optimizer, Schedule
from zoo.lab.recipe.group_rates import check_ratios, ratios_by_id
from zoo.lab.recipe.qk_clip import check_run, check_tau
from zoo.models.objectives import DEFAULT as DEFAULT_OBJECTIVE
from zoo.models.objectives import OBJECTIVES, Objective, objective_entry


class TrainConfig(Protocol):
    """What the recipe reads of the run's ``train`` section (zoo.lab.planning.train_config.TrainConfig), beside the
    ``train_keys`` an optimizer names."""

    steps: int
    lr: float
    warmup_steps: int
    min_lr_ratio: float
    weight_decay: float


#: The default entries (``conf/config.yaml``'s ``optim: adamw``, ``schedule: cosine`` and ``objective: ntp``).
DEFAULTS = {"optim": "adamw", "schedule": "cosine", "objective": DEFAULT_OBJECTIVE}
REGISTRIES: dict[str, Registry] = {"optim": OPTIMIZERS, "schedule": SCHEDULES, "objective": OBJECTIVES}


def train_keys(cls: type) -> tuple[str, ...]:
    """The ``train`` keys an entry reads (its ``train_keys``: constructor arguments that are not options)."""
    return tuple(getattr(cls, "train_keys", ()))


def section_options(kind: str, section: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """The entry's name and every option (defaults filled in, types checked) of an ``optim``, ``schedule``
    or ``objective`` section; a ConfigError for an unknown name or key, or a wrong type."""
    part, raw = named_section(REGISTRIES[kind], kind, section, DEFAULTS[kind])
    name = part.name
    for key in raw:
        if key in train_keys(part.cls):
            raise ConfigError(f"{kind}.{key}", raw[key], f"{kind}={name} reads train.{key}: set that instead")
    recipe_keys = {}
    if kind == "optim":  # the recipe's own keys, over any optimizer
        ratios, tau = check_ratios(raw.pop("lr_ratios", None) or {}), check_tau(raw.pop("qk_clip", None))
        recipe_keys = {"lr_ratios": ratios, "qk_clip": tau}
    options = resolve_options(part, raw, kind, also_allowed=tuple(recipe_keys))
    return name, {**{k: v for k, v in options.items() if k not in train_keys(part.cls)}, **recipe_keys}


def is_default(kind: str, section: Any) -> bool:
    """Whether a config's ``optim``, ``schedule`` or ``objective`` section computes what leaving it out does
    (the default entry with its default options): such a section is left out of the config hash."""
    if section is None:
        return True
    try:
        return section_options(kind, section) == section_options(kind, None)
    except ConfigError:
        return False


@dataclass(frozen=True)
class Recipe:
    """A checked optimizer, schedule and objective: ``optim``, ``schedule`` and ``objective`` are their sections
    (name and options)."""

    optim: dict[str, Any] = field(default_factory=lambda: {"name": DEFAULTS["optim"]})
    schedule: dict[str, Any] = field(default_factory=lambda: {"name": DEFAULTS["schedule"]})
    objective: dict[str, Any] = field(default_factory=lambda: {"name": DEFAULTS["objective"]})

    def optimizer_entry(self, train: TrainConfig) -> Optimizer:
        """The ``optim`` entry with its options (and the ``train`` keys it reads)."""
        name, options = section_options("optim", self.optim)
        options.pop("lr_ratios")  # the recipe's (:meth:`build`), not the optimizer's
        options.pop("qk_clip")  # the trainer's (zoo.lab.recipe.qk_clip)
        cls = OPTIMIZERS.get(name).cls
        return cls(**options, **{key: getattr(train, key) for key in train_keys(cls)})

    def schedule_entry(self) -> Schedule:
        name, options = section_options("schedule", self.schedule)
        return SCHEDULES.get(name).cls(**options)

    def objective_entry(self) -> Objective:
        """The ``objective`` entry with its options (its values checked)."""
        return objective_entry(self.objective)

    def check(self, train: TrainConfig, *, sharded: bool = False, tp: int = 1, compile: bool = False) -> None:
        """Every option and combination (with the steps ``train`` has), before any tensor work."""
        self.optimizer_entry(train).check(sharded=sharded, tp=tp, compile=compile)
        check_run(self.optim.get("qk_clip"), sharded=sharded, compile=compile)
        self.schedule_entry().check(steps=train.steps, warmup_steps=train.warmup_steps)
        self.objective_entry()  # its values (the plan checks it against the task and the mesh)

    def build(self, model: nn.Module, train: TrainConfig) -> torch.optim.Optimizer:
        """The optimizer over every parameter of ``model`` at ``train.lr`` and ``train.weight_decay``;
        under ``param=mup`` each group split by the parameters' μP rate multipliers (:func:`scaled_groups`), then
        by ``optim.lr_ratios`` (zoo.lab.recipe.group_rates; their weight decay kept)."""
        optimizer = self.optimizer_entry(train).build(model, lr=train.lr, weight_decay=train.weight_decay)
        ratios = lr_ratios(model, self.optim["name"])
        optimizer = optimizer if ratios is None else scaled_groups(optimizer, ratios)
        groups = self.optim.get("lr_ratios") or {}
        return scaled_groups(optimizer, ratios_by_id(model, groups), keep_decay=True) if groups else optimizer


def scaled_groups(
    optimizer: torch.optim.Optimizer, ratios: Mapping[int, float], *, keep_decay: bool = False
) -> torch.optim.Optimizer:
    """The same optimizer with each param group split by its parameters' rate multipliers (``ratios``:
    id(parameter) -> multiplier): ``lr_ratio`` and ``lr`` multiplied, ``weight_decay`` divided (the decay
    per step, rate x decay, unchanged; ``keep_decay``: kept as it was). Groups of multiplier 1 keep their
    options as they were."""
    groups = []
    for group in optimizer.param_groups:
        options = {k: v for k, v in group.items() if k != "params"}
        by_ratio: dict[float, list[nn.Parameter]] = {}
        for p in group["params"]:
            by_ratio.setdefault(ratios.get(id(p), 1.0), []).append(p)
        for ratio, params in by_ratio.items():
            scaled = dict(options) if ratio == 1.0 else {
                **options, "lr": options["lr"] * ratio, "lr_ratio": options.get("lr_ratio", 1.0) * ratio,
                "weight_decay": options.get("weight_decay", 0.0) / (1.0 if keep_decay else ratio),
            }  # fmt: skip
            groups.append({**scaled, "params": params})
    optimizer.param_groups.clear()  # still without state: the split groups replace the built ones
    for group in groups:
        optimizer.add_param_group(group)
    return optimizer


def lr_at(schedule: Schedule, step: int, train: TrainConfig) -> float:
    """``schedule``'s rate at 0-based ``step`` for the steps, rate and warmup of ``train``."""
    return schedule.lr_at(step, steps=train.steps, lr=train.lr, warmup_steps=train.warmup_steps,
                          min_lr_ratio=train.min_lr_ratio)  # fmt: skip


def check_recipe(raw: Mapping[str, Any], train: TrainConfig, *, sharded: bool, tp: int, compile: bool) -> Recipe:
    """The run config's ``optim``, ``schedule`` and ``objective`` sections checked (names, options, the mesh,
    the steps)."""
    sections = []
    for kind in ("optim", "schedule", "objective"):
        name, options = section_options(kind, raw.get(kind))
        sections.append({"name": name, **options})
    recipe = Recipe(*sections)
    recipe.check(train, sharded=sharded, tp=tp, compile=compile)
    return recipe
