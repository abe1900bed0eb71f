"""Validation: a task's metrics of a model on the task's fixed validation sets, at each evaluated length.

The trainer evaluates through an :class:`Evaluator` during and after training; ``zoo-eval`` (``evaluate_run``)
evaluates a finished run through the same one, with no optimizer built. Under several processes each rank
scores its share of the batches and the sums are added up over ranks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from zoo.lab.tasks import Batch, Task
from zoo.lab.tasks.base import MACRO, heldout_name, metric_name
from zoo.lab.training.probes import eval_mode
from zoo.lab.training.step import autocast


class Evaluator:
    """``model``'s validation metrics on ``task`` (``batch_size`` x ``eval_batches`` sequences per length).
    ``world`` processes, of which ``dp`` hold different data (tensor-parallel ranks share theirs); this one
    is data-parallel rank ``dp_rank``. After :meth:`evaluate`: ``eval_errors`` (per length a part could not
    run at) and ``routing`` (each routing part's fraction of validation tokens per expert)."""

    def __init__(
        self,
        model: nn.Module,
        task: Task,
        batch_size: int,
        eval_batches: int,
        *,
        device: torch.device,
        world: int = 1,
        dp: int = 1,
        dp_rank: int = 0,
    ) -> None:
        self.model, self.task, self.device = model, task, device
        self.world, self.dp, self.dp_rank = world, dp, dp_rank
        self.val_sets = {f: task.val_batches(batch_size, eval_batches, f) for f in task.eval_lengths}
        self.heldout_sets = task.heldout_batches(batch_size, eval_batches)
        self.eval_errors: dict[str, str] = {}
        self.routing: dict[str, list[float]] = {}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float | None]:
        """Every validation metric, at each evaluated length (batches shared out across ranks); the model's
        modes as they were after."""
        with eval_mode(self.model):
            return self.evaluated()

    def evaluated(self) -> dict[str, float | None]:
        """:meth:`evaluate`'s metrics, the model in eval mode."""
        out: dict[str, float | None] = {}
        # Parts that route tokens (a mixture of experts) keep the tokens per expert of their last forward.
        routers = {name: m for name, m in self.model.named_modules() if hasattr(m, "last_counts")}
        routed: dict[str, Any] = {name: 0.0 for name in routers}
        for factor, batches in self.val_sets.items():
            try:
                sums = self.score(batches, routers if factor == 1 else {}, routed)
            except Exception as error:  # a part that cannot run at this length: record, keep training
                if factor == 1:
                    raise
                self.eval_errors[f"{factor}x"] = f"{type(error).__name__}: {error}"
                out.update({metric_name(name, factor): None for name in self.task.metrics})
                continue
            for name, value in self.task.compute(sums).items():
                out[metric_name(name, factor)] = value
        out.update(self.heldout_metrics())
        for name, counts in routed.items():
            if isinstance(counts, torch.Tensor):
                if self.world > 1:
                    dist.all_reduce(counts)
                self.routing[name] = (counts / counts.sum()).tolist()
        return out

    def heldout_metrics(self) -> dict[str, float]:
        """Each metric on each held-out set (``val_bpb_cpp``), and its mean over them (``val_bpb_macro``)."""
        out: dict[str, float] = {}
        for held, batches in self.heldout_sets.items():
            for name, value in self.task.compute(self.score(batches, {}, {})).items():
                out[heldout_name(name, held)] = value
        if self.heldout_sets:
            for name in self.task.metrics:
                values = [out[heldout_name(name, held)] for held in self.heldout_sets]
                out[heldout_name(name, MACRO)] = sum(values) / len(values)
        return out

    def score(self, batches: list[Batch], routers: dict[str, nn.Module], routed: dict[str, Any]) -> dict[str, float]:
        """The task's sums over this rank's share of ``batches``, added up over every rank (``routed``
        adds up each of ``routers``' tokens per expert)."""
        sums = {name: torch.zeros((), dtype=torch.float64, device=self.device) for name in self.task.sums}
        for batch in batches[self.dp_rank :: self.dp]:
            batch = batch.to(self.device)
            with autocast(self.device):
                logits = self.task.logits(self.model, batch).float()
                scored = self.task.score(self.model, batch, logits)
            for name, router in routers.items():
                routed[name] = routed[name] + router.last_counts.double()
            for name, value in scored.items():
                sums[name] = sums[name] + value.to(self.device)
        total = torch.stack(list(sums.values()))
        if self.world > 1:
            dist.all_reduce(total)
            total /= self.world // self.dp  # each batch was scored by its tp ranks alike
        return dict(zip(sums, total.tolist(), strict=True))
