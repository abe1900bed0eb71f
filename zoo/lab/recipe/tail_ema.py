"""``train.tail_ema=<decay>``: an exponential moving average of the weights over the end of training, evaluated
at the end with the same validation as the last weights (docs/recipe.md, "Tail EMA").

From step ``train.tail_ema_from`` the average starts as that step's weights; after each later step it moves
``ema <- decay x ema + (1 - decay) x weights``. Every floating-point entry of the model's state dict is
averaged (parameters and buffers). It lives in the loop's callback state, so a checkpoint keeps it in
``state.safetensors`` and a resumed run goes on bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn


def averaged(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's floating-point state entries by name (what the EMA averages), as they are."""
    return {name: value for name, value in model.state_dict().items() if value.is_floating_point()}


@torch.no_grad()
def update(ema: dict[str, torch.Tensor], model: nn.Module, decay: float) -> dict[str, torch.Tensor]:
    """``ema`` moved towards ``model``'s weights by ``1 - decay``; empty ``ema``: a copy of the weights."""
    weights = averaged(model)
    if not ema:
        return {name: value.detach().clone() for name, value in weights.items()}
    ema = {name: value.to(weights[name].device) for name, value in ema.items()}  # a resumed run's, from the CPU
    for name, value in weights.items():
        ema[name].lerp_(value, 1 - decay)
    return ema


@torch.no_grad()
def swapped(model: nn.Module, ema: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Load ``ema`` into ``model``; the weights it replaced (copies), to load back."""
    kept = {name: value.detach().clone() for name, value in averaged(model).items()}
    model.load_state_dict(ema, strict=False)
    return kept
