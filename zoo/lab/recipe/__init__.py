"""The training recipe: optimizers (``optim=<name>``) and learning-rate schedules (``schedule=<name>``)."""

from zoo.lab.recipe import muon as muon  # registers optim=muon
from zoo.lab.recipe.base import OPTIMIZERS, SCHEDULES, Optimizer, Schedule

__all__ = ["OPTIMIZERS", "SCHEDULES", "Optimizer", "Schedule"]
