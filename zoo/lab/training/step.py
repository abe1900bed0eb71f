"""One training step, the same for the trainer and the benchmarks: forward under the trainer's autocast,
the loss, the parts' auxiliary losses and the z-loss, backward, gradient clipping, the optimizer step, the
parts' updates after it (their ``after_step`` hooks), zero_grad."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from zoo.core.auxiliary import after_step_hooks
from zoo.lab.recipe.qk_clip import QKClip
from zoo.lab.tasks import IGNORE, Batch


def autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on CUDA; nothing on CPU (float32)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (float32) over the positions whose target is not IGNORE."""
    flat_logits, flat_targets = rearrange(logits.float(), "b t v -> (b t) v"), rearrange(targets, "b t -> (b t)")
    return F.cross_entropy(flat_logits, flat_targets, ignore_index=IGNORE)


def z_loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over the positions whose target is not IGNORE of ``logsumexp(logits)^2`` (float32): the
    log-partition the z-loss pulls towards 0 (PaLM; OLMo's ``softmax_auxiliary_loss``)."""
    scored = (targets != IGNORE).float()
    log_z = torch.logsumexp(logits.float(), dim=-1)
    return (log_z.square() * scored).sum() / scored.sum().clamp(min=1)


def future_losses(logits: list[torch.Tensor], targets: torch.Tensor) -> list[torch.Tensor]:
    """Each extra head's mean cross-entropy (float32; ``objective=mtp``): head j's logits (b, t - j, vocab) at
    position i are scored against ``targets[:, i + j]``, token i + j + 1 of a language-model batch (targets
    are the inputs shifted by one), over the positions whose target is not IGNORE (0 when there is none)."""
    losses = []
    for j, head in enumerate(logits, 1):
        shifted = targets[:, j:]
        flat_logits, flat_targets = rearrange(head.float(), "b t v -> (b t) v"), rearrange(shifted, "b t -> (b t)")
        total = F.cross_entropy(flat_logits, flat_targets, ignore_index=IGNORE, reduction="sum")
        losses.append(total / (shifted != IGNORE).sum().clamp(min=1))
    return losses


def lm_logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    """A decoder-only language model's logits of ``batch`` (what :meth:`Task.logits` does by default)."""
    return model(batch.inputs)


@dataclass
class Stepper:
    """What a training step runs on. ``model`` is what the forward calls (a DDP wrapper, say);
    ``core`` the model itself, whose parts record auxiliary losses (weighted by ``aux_weights``).
    ``grad_clip`` 0 turns clipping off; ``logits`` is how a batch reaches the model (the task's);
    ``z_loss`` > 0 adds that weight x :func:`z_loss_fn` to the loss (reported as the auxiliary ``z_loss``).
    A model with extra heads (``objective=mtp``) adds ``future_weight`` x the mean of :func:`future_losses`
    (the trainer sets it each step: the objective's weight then), each reported as ``mtp_<j>``; the loss
    returned, like validation, is the next token's alone.
    After each step ``grad_norm`` holds the gradients' total norm before clipping (on the device: the one
    clipping computes, else computed for it); ``before_step``, when set, runs after backward, before clipping
    and the optimizer step (the trainer's probes read the gradients and weights there). ``qk_clip`` (``optim.qk_clip``)
measures each head's largest logit there and rescales the query and key weights after the optimizer step."""

    model: nn.Module
    core: nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    grad_clip: float = 0.0
    aux_weights: dict[str, float] = field(default_factory=dict)
    logits: Callable[[nn.Module, Batch], torch.Tensor] = lm_logits
    z_loss: float = 0.0
    before_step: Callable[[], None] | None = None
    future_weight: float = 0.0
    qk_clip: QKClip | None = None

    def __post_init__(self) -> None:
        self.params = list(self.core.parameters())
        self.after_step = after_step_hooks(self.core)  # parts' updates outside the gradient (a router's bias)
        self.grad_norm: torch.Tensor | None = None

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Train on ``batch``: its loss (detached, on the device) and each auxiliary loss (unweighted)."""
        with autocast(self.device):
            logits = self.logits(self.model, batch)
        loss = loss_fn(logits, batch.targets)
        total, aux = loss, {}
        for name, value in self.core.take_aux_losses().items():  # what the parts recorded in this forward
            total = total + self.aux_weights[name] * value.float()
            aux[name] = value.detach().float()
        future = future_losses(self.core.take_future_logits(), batch.targets)  # objective=mtp's extra heads
        if future:
            total = total + self.future_weight * torch.stack(future).mean()
            aux.update({f"mtp_{j}": value.detach() for j, value in enumerate(future, 1)})
        if self.z_loss > 0:
            z = z_loss_fn(logits, batch.targets)
            total = total + self.z_loss * z
            aux["z_loss"] = z.detach()
        total.backward()
        if self.before_step is not None:
            self.before_step()
        if self.qk_clip is not None:
            self.qk_clip.measure()  # the logits of this step's forward, before the update
        if self.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip, foreach=True)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None], foreach=True)
        full = getattr(norm, "full_tensor", None)  # a DTensor (FSDP2, tensor parallel): the whole model's norm
        self.grad_norm = (full() if full is not None else norm).detach()
        self.optimizer.step()
        if self.qk_clip is not None:
            self.qk_clip.rescale()
        for update in self.after_step:
            update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach(), aux
