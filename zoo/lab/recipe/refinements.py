"""The 2025-26 refinements of a matrix optimizer's step, each a pure function of one logical matrix's tensors
(docs/muon.md, "Refinements"): Polar Express's per-iteration coefficients for the Newton-Schulz iteration,
NorMuon's per-neuron second moment, cautious weight decay, the hyperball projection and Adam's direction
(the hyperball's AdamH). ``zoo.lab.recipe.muon`` applies them to each logical matrix.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Coefficients = tuple[float, float, float]

#: The reference's quintic (torch.optim.Muon's, Keller Jordan's): the same polynomial at every iteration.
QUINTIC: Coefficients = (3.4445, -4.7750, 2.0315)
#: Polar Express (Amsel et al. 2025, Algorithm 1): the optimal degree-5 polynomial of each iteration, then the
#: last one repeated; all but the last divided by the safety factor (a / s, b / s^3, c / s^5).
POLAR_EXPRESS_RAW: tuple[Coefficients, ...] = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
#: Polar Express's safety factor: the coefficients' and the first normalization's (X / (1.01 |X|_F)).
POLAR_SAFETY = 1.01
#: ``optim.ns``: the Newton-Schulz coefficient schedules.
NS_SCHEDULES = ("quintic", "polar_express")
#: NorMuon's and the hyperball's guard against a zero denominator.
TINY = 1e-10


def polar_express() -> tuple[Coefficients, ...]:
    """Polar Express's table with the safety factor applied (the last polynomial left as it is)."""
    s = POLAR_SAFETY
    return tuple((a / s, b / s**3, c / s**5) for a, b, c in POLAR_EXPRESS_RAW[:-1]) + POLAR_EXPRESS_RAW[-1:]


def ns_schedule(ns: str, steps: int) -> tuple[tuple[Coefficients, ...], float]:
    """``optim.ns``'s coefficients for each of ``steps`` iterations, and the factor the first normalization's
    Frobenius norm is multiplied by."""
    if ns == "quintic":
        return (QUINTIC,) * steps, 1.0
    table = polar_express()
    return table[:steps] + table[-1:] * max(0, steps - len(table)), POLAR_SAFETY


def neuron_normalized(update: torch.Tensor, second_moment: torch.Tensor, beta2: float) -> torch.Tensor:
    """NorMuon (Li et al. 2025): ``update`` (..., rows, cols, orthogonalized) with each row (an output neuron)
    divided by the root of its running mean square, ``second_moment`` (..., rows; updated in place as
    ``v <- beta2 v + (1 - beta2) mean_cols(O^2)``), then rescaled to the Frobenius norm ``update`` had."""
    update = update.float()
    second_moment.lerp_(update.square().mean(-1), 1 - beta2)
    normalized = update / (second_moment.sqrt() + TINY).unsqueeze(-1)
    norm, new = update.norm(dim=(-2, -1), keepdim=True), normalized.norm(dim=(-2, -1), keepdim=True)
    return normalized * (norm / (new + TINY))


def cautious_mask(update: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Cautious weight decay (Chen et al. 2025): 1 where the update (the step is ``-lr x update``) and the weight
    agree in sign, ``update x weight >= 0``, so that decay moves the weight the way the update does; 0 elsewhere."""
    return (update * weight >= 0).to(weight.dtype)


def on_hyperball(weight: torch.Tensor, update: torch.Tensor, lr: float, radius: torch.Tensor) -> torch.Tensor:
    """The hyperball step (Wen et al. 2026, MuonH/AdamH) of each matrix of ``weight`` (..., rows, cols):
    ``W <- R normalize(W - lr R normalize(u))``, ``R`` (...) its radius, the Frobenius norm it started with.
    A zero update leaves the direction as it was."""
    r = radius[..., None, None]
    step = update * (r / update.norm(dim=(-2, -1), keepdim=True).clamp(min=TINY))
    moved = weight - lr * step
    return moved * (r / moved.norm(dim=(-2, -1), keepdim=True).clamp(min=TINY))


def adam_direction(state: dict[str, torch.Tensor], grad: torch.Tensor, betas: Sequence[float], eps: float):
    """Adam's direction ``m_hat / (sqrt(v_hat) + eps)`` from ``state`` (``exp_avg``, ``exp_avg_sq``, ``step``:
    created on the first call, updated in place), as torch.optim.AdamW computes it before the rate."""
    if "step" not in state:
        state["step"] = torch.zeros((), dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
    beta1, beta2 = betas
    state["step"] += 1
    t = state["step"].item()
    state["exp_avg"].lerp_(grad, 1 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denominator = (state["exp_avg_sq"] / (1 - beta2**t)).sqrt_().add_(eps)
    return state["exp_avg"] / (1 - beta1**t) / denominator
