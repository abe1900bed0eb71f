"""The training recipe: optimizers (``optim=<name>``) and learning-rate schedules (``schedule=<name>``)."""

from zoo.lab.recipe import optimizers, schedules  # registers adamw, sgd, adafactor and the schedules

# isort: split
from zoo.lab.recipe import muon  # registers optim=muon, after the default
from zoo.lab.recipe.base import OPTIMIZERS, SCHEDULES, Optimizer, Schedule
from zoo.lab.recipe.build import Recipe, check_recipe, is_default, lr_at

__all__ = ["OPTIMIZERS", "SCHEDULES", "Optimizer", "Recipe", "Schedule", "check_recipe", "is_default", "lr_at",
           "muon", "optimizers", "schedules"]  # fmt: skip
