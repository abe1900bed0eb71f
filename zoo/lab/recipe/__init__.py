"""The training recipe: optimizers (``optim=<name>``) and learning-rate schedules (``schedule=<name>``)."""

from zoo.lab.recipe import optimizers, schedules
from zoo.lab.recipe.base import OPTIMIZERS, SCHEDULES, Optimizer, Schedule
from zoo.lab.recipe.build import Recipe, check_recipe, is_default, lr_at

__all__ = ["OPTIMIZERS", "SCHEDULES", "Optimizer", "Recipe", "Schedule", "check_recipe", "is_default", "lr_at",
           "optimizers", "schedules"]  # fmt: skip
