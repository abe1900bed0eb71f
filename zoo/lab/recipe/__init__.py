"""The training recipe: optimizers (``optim=<name>``), learning-rate schedules (``schedule=<name>``) and the
objective (``objective=<name>``, whose entries and extra heads are the model's: zoo.models.objectives)."""

from zoo.lab.recipe import optimizers, schedules  # registers adamw, sgd, adafactor and the schedules

# isort: split
from zoo.lab.recipe import hyperball, muon  # registers optim=muon, normuon, muonh and adamh, after the default
from zoo.lab.recipe.base import OPTIMIZERS, SCHEDULES, Optimizer, Schedule
from zoo.lab.recipe.build import Recipe, check_recipe, is_default, lr_at
from zoo.models.objectives import OBJECTIVES

__all__ = ["OBJECTIVES", "OPTIMIZERS", "SCHEDULES", "Optimizer", "Recipe", "Schedule", "check_recipe", "hyperball",
           "is_default", "lr_at", "muon", "optimizers", "schedules"]  # fmt: skip
