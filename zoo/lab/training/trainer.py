"""The training loop: the recipe's optimizer, schedule and objective (``optim=``, ``schedule=``, ``objective=``:
zoo.lab.recipe; AdamW, a cosine and next-token prediction by default), gradient clipping, z-loss, logging,
divergence and periodic evaluation.

Everything else around the loop (records, the progress bar, probes, spike detection, checkpoints, a
plugin's) is a callback (zoo.lab.training.callbacks): the loop calls hooks and names none of them. It keeps
the per-step cost to the model's own forward, backward and optimizer step: the loss is summed on the
device and read back only every ``train.log_every`` steps (that is also when divergence is checked).
"""

from __future__ import annotations

import contextlib
import math
import resource
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from zoo.core.auxiliary import aux_weights
from zoo.lab.planning.mesh import ProcessMesh
from zoo.lab.planning.train_config import TrainConfig
from zoo.lab.recipe import Recipe, lr_at
from zoo.lab.recipe.optimizers import AdamW
from zoo.lab.recipe.qk_clip import QKClip
from zoo.lab.records.checkpoint import TrainState
from zoo.lab.records.state_tree import rng_state, set_rng_state
from zoo.lab.tasks import Batch, Task
from zoo.lab.training.callbacks import Callback, Callbacks
from zoo.lab.training.evaluation import Evaluator
from zoo.lab.training.loop_state import FitResult, LoopState
from zoo.lab.training.scale import compile_blocks, parallelize
from zoo.lab.training.step import Stepper, autocast
from zoo.models.base import TokenModel


def make_optimizer(model: nn.Module, cfg: TrainConfig, recipe: Recipe | None = None) -> torch.optim.Optimizer:
    """The recipe's optimizer (default: AdamW with ``cfg``'s betas; weight decay on matrices and the
    embedding, none on biases and norm gains)."""
    if recipe is not None:
        return recipe.build(model, cfg)
    return AdamW(beta1=cfg.beta1, beta2=cfg.beta2).build(model, lr=cfg.lr, weight_decay=cfg.weight_decay)


class Trainer:
    """Trains ``model`` on ``task``. Under DDP (``world > 1``) the process group is already initialized,
    every rank built the same model from the same seed, and ``data_seed`` differs by rank.

    ``recipe`` (checked by the plan) gives the optimizer and the schedule; None: the default (AdamW,
    cosine). ``callbacks`` see every record (:meth:`emit`) and the loop's hooks; a checkpoint's state is
    gathered by :meth:`checkpoint_state` (a callback's request); :meth:`restore` continues from one.
    """

    def __init__(
        self,
        model: TokenModel,
        task: Task,
        cfg: TrainConfig,
        *,
        device: torch.device,
        data_seed: int,
        rank: int = 0,
        world: int = 1,
        callbacks: Sequence[Callback] = (),
        compile: bool = False,
        parallel: ProcessMesh | None = None,
        mesh: Any = None,
        recipe: Recipe | None = None,
    ) -> None:
        self.model, self.task, self.cfg, self.device = model.to(device), task, cfg, device
        self.model.checkpoint_blocks = cfg.activation_checkpointing
        self.parallel = parallel or ProcessMesh(dp_replicate=world)
        self.sharded = self.parallel.sharded
        if self.sharded:  # tensor parallel plans, compile, FSDP2 (zoo.lab.training.scale)
            parallelize(self.model, self.parallel, mesh, compile=compile, mixed_precision=device.type == "cuda")
        elif compile:
            compile_blocks(self.model)
        self.rank, self.world = rank, world
        self.dp_rank, self.dp = self.parallel.dp_rank(rank), self.parallel.dp  # tp ranks share their batches
        self.generator = torch.Generator().manual_seed(data_seed)
        self.recipe = recipe or Recipe()
        self.recipe.check(cfg, sharded=self.sharded, tp=self.parallel.tp, compile=compile)  # steps set by a budget
        self.schedule = self.recipe.schedule_entry()
        self.optimizer = self.recipe.build(self.model, cfg)
        tau = self.recipe.optim.get("qk_clip")  # optim.qk_clip: hooks on the mixers, before DDP wraps the model
        self.qk_clip = QKClip(self.model, tau) if tau is not None else None
        self.aux_weights = aux_weights(self.model, cfg.aux_weights)  # the parts' defaults, then train.aux_weights
        self.objective = self.recipe.objective_entry()  # objective=mtp: the weight of its extra heads' losses
        #: The auxiliary values logged: the parts' losses, the extra heads' (objective=mtp), then the z-loss
        #: (train.z_loss > 0).
        future = [f"mtp_{j}" for j in range(1, self.objective.extra + 1)]
        self.aux_names = [*self.aux_weights, *future, *(["z_loss"] if cfg.z_loss > 0 else [])]
        self.tokens_per_step = cfg.batch_size * task.seq_len * self.dp
        if world > 1 and not self.sharded:
            from torch.nn.parallel import DistributedDataParallel

            ids = [device.index] if device.type == "cuda" else None
            self.train_model: nn.Module = DistributedDataParallel(self.model, device_ids=ids)
        else:
            self.train_model = self.model
        self.evaluator = Evaluator(self.model, task, cfg.batch_size, cfg.eval_batches, device=device, world=world,
                                   dp=self.dp, dp_rank=self.dp_rank)  # fmt: skip
        self.restored: TrainState | None = None
        self.resumed_from: list[int] = []  # the steps this run was resumed at (its checkpoints record them)
        self.train_time_now = 0.0  # the training time when the hooks after a step began
        self.callbacks = Callbacks(callbacks)
        self.callbacks.attach(self)

    def restore(self, state: TrainState, *, resumed: bool = True) -> None:
        """Continue from ``state`` (model and optimizer already loaded): this rank's generators now;
        the loop's running values when :meth:`fit` starts, at step ``state.step + 1``. ``resumed`` False: a
        branch's start (another run's checkpoint), not a resume of this run (its checkpoints' history)."""
        if len(state.ranks) == self.world:  # a sharded checkpoint read at another world size: fresh generators
            set_rng_state(state.ranks[self.rank]["rng"], self.generator, self.device)
        self.restored = state
        self.resumed_from = [*state.resumed_from, state.step] if resumed else []

    def emit(self, record: dict[str, Any]) -> None:
        """A metrics record to every callback (metrics.jsonl and the tracker are callbacks too)."""
        self.callbacks.call("on_record", record)

    def first_val_batch(self) -> Batch:
        """The first validation batch at the training length, on the device (what probes read)."""
        return self.val_sets[1][0].to(self.device)  # length factor 1: the training length

    def checkpoint_state(self, step: int, loop: LoopState) -> TrainState:
        """Every rank's generators and running sums after ``step`` (collective: every rank calls it), with
        the loop's running values and the training time up to the end of ``step``."""
        assert loop.loss_sum is not None
        mine = {"rng": rng_state(self.generator, self.device), "loss_sum": loop.loss_sum.detach().cpu().clone()}
        if loop.grad_sum is not None and loop.grad_max is not None:
            mine.update(grad_sum=loop.grad_sum.detach().cpu().clone(), grad_max=loop.grad_max.detach().cpu().clone())
        if loop.aux_sums:
            mine["aux_sums"] = {name: value.detach().cpu().clone() for name, value in loop.aux_sums.items()}
        if loop.pending:  # the steps since the last log step, each [loss, grad norm]
            mine["pending"] = pending_values(loop.pending).cpu()
        ranks = [mine]
        if self.world > 1:
            ranks = [None] * self.world
            dist.all_gather_object(ranks, mine)
        return TrainState(step=step, loop=loop.saved(self.train_time_now), ranks=ranks, resumed_from=self.resumed_from)

    def checkpointed(self, state: TrainState) -> None:
        """Tell every callback that ``state`` was handed to the checkpoint writer."""
        self.callbacks.call("on_checkpoint", state)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast on CUDA; nothing on CPU (float32): :func:`zoo.lab.training.step.autocast`."""
        return autocast(self.device)

    def batches(self) -> Iterator[Batch]:
        while True:
            yield self.task.train_batch(self.cfg.batch_size, self.generator).to(self.device)

    def start_loop(self) -> tuple[LoopState, int]:
        """The loop's state at its first step, and that step: 1, or after the restored checkpoint's."""
        zero = torch.zeros((), device=self.device)
        loop = LoopState(loss_sum=zero.clone(), aux_sums=dict.fromkeys(self.aux_names, zero))
        loop.grad_sum, loop.grad_max = zero.clone(), zero.clone()
        if self.restored is None:
            return loop, 1
        loop.restore(self.restored.loop)
        if len(self.restored.ranks) == self.world:  # this rank's running sums (fresh at another world size)
            mine = self.restored.ranks[self.rank]
            loop.loss_sum += mine["loss_sum"].to(self.device)
            for name, value in mine.get("aux_sums", {}).items():
                loop.aux_sums[name] = value.to(self.device)
            unknown = torch.full((), math.nan if loop.n_summed else 0.0, device=self.device)  # an older checkpoint
            loop.grad_sum = mine.get("grad_sum", unknown).to(self.device)
            loop.grad_max = mine.get("grad_max", unknown).to(self.device)
            if "pending" in mine:
                loop.pending = [(row[0], row[1]) for row in mine["pending"].to(self.device)]
        return loop, self.restored.step + 1

    def fit(self) -> FitResult:
        """Train ``cfg.steps`` steps (from a restored checkpoint's on), logging and evaluating; the callbacks'
        hooks around it. Time in the hooks after a step, and in evaluation, is not training time."""
        cfg, hooks = self.cfg, self.callbacks
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        loop, first = self.start_loop()
        step_fn = Stepper(self.train_model, self.model, self.optimizer, self.device, cfg.grad_clip,
                          self.aux_weights, self.task.logits, cfg.z_loss, qk_clip=self.qk_clip)  # fmt: skip
        if hooks.uses("on_backward_end"):
            step_fn.before_step = lambda: hooks.call("on_backward_end", loop, loop.step)
        hooks.call("on_run_start", loop, first)
        step_hooks = hooks.uses("on_step_end")
        self.train_model.train()
        batches = self.batches()
        if first == 1:
            self.evaluate_initial(loop)
        started = time.perf_counter()
        for step in range(first, cfg.steps + 1):
            loop.step = step
            lr = lr_at(self.schedule, step - 1, cfg)
            for group in self.optimizer.param_groups:
                group["lr"] = lr * group.get("lr_ratio", 1.0)  # x 1.0: the same float
            step_fn.future_weight = self.objective.weight_at(step - 1, cfg.steps)
            loss, aux = step_fn(next(batches))
            self.add_step(loop, loss, aux, step_fn.grad_norm)
            if step == first:
                self.mark_warm(loop, started)
            evaluate = step == cfg.steps or (cfg.eval_every > 0 and step % cfg.eval_every == 0)
            if step % cfg.log_every == 0 or step == 1 or evaluate:
                started = self.log_step(loop, lr, started)  # the one host sync
                if loop.status != "ok":
                    break
            if evaluate or step_hooks:  # evaluation and the hooks after a step are not training time
                paused = time.perf_counter()
                if evaluate:
                    loop.final_val = self.evaluate_and_log(loop, step)
                if step_hooks:
                    self.train_time_now = loop.train_time + paused - started
                    hooks.call("on_step_end", loop, step)
                started += time.perf_counter() - paused
        result = self.result(loop)
        hooks.call("on_run_end", loop, result)
        return result

    def add_step(
        self, loop: LoopState, loss: torch.Tensor, aux: dict[str, torch.Tensor], grad_norm: torch.Tensor | None
    ) -> None:
        """Add a step's loss, auxiliary losses and gradient norm to the sums since the last log step (on the device)."""
        for name, value in aux.items():
            loop.aux_sums[name] = loop.aux_sums[name] + value
        loop.loss_sum += loss
        if grad_norm is not None and loop.grad_sum is not None and loop.grad_max is not None:
            loop.grad_sum = loop.grad_sum + grad_norm
            loop.grad_max = torch.maximum(loop.grad_max, grad_norm)
        if grad_norm is None:
            grad_norm = torch.full((), math.nan, device=loss.device)
        loop.pending.append((loss.detach(), grad_norm))  # no kernel per step: stacked at the log step
        loop.n_summed += 1

    def mark_warm(self, loop: LoopState, started: float) -> None:
        """Note the training time at the end of this process's first step (waiting for the device once): the
        steps after it are the steady ones, without compile and kernel warm-up."""
        float(loop.loss_sum)  # type: ignore[arg-type]  # the step's work done on the device
        loop.warm = (loop.step, loop.train_time + time.perf_counter() - started)

    def evaluate_initial(self, loop: LoopState) -> None:
        """The validation metrics of the initial weights: a ``val`` record at step 0 and ``loop.initial``
        (no random draw and no weight change: the run trains as it would without)."""
        loop.initial = self.evaluate_and_log(loop, 0)

    def evaluate_and_log(self, loop: LoopState, step: int) -> dict[str, float | None]:
        """Evaluate (:meth:`evaluate`), emit a ``val`` record at ``step``, tell the callbacks; the metrics."""
        metrics = self.evaluate()
        self.emit({"kind": "val", "step": step, "tokens": step * self.tokens_per_step, **metrics})
        self.callbacks.call("on_evaluation_end", loop, metrics)
        return metrics

    def log_step(self, loop: LoopState, lr: float, started: float) -> float:
        """Log the mean loss since the last log step (and the auxiliary losses'), and check for divergence.
        Returns the new start of the training time (what logging took counts as training)."""
        mean = self.mean_over_ranks(loop.loss_sum / loop.n_summed)
        loop.last_loss = mean.item()
        now = time.perf_counter()
        rate = loop.n_summed * self.tokens_per_step / max(now - started, 1e-9)
        loop.train_time += now - started
        aux = {}
        if loop.aux_sums:
            means = self.mean_over_ranks(torch.stack(list(loop.aux_sums.values())) / loop.n_summed)
            aux = {f"aux_{name}": value for name, value in zip(loop.aux_sums, means.tolist(), strict=True)}
            loop.aux_sums = dict.fromkeys(loop.aux_sums, torch.zeros((), device=self.device))
            loop.last_aux = aux
        step = loop.step
        grads = self.grad_norms(loop)
        loop.logged_steps = self.steps_since_log(loop)
        self.emit(
            {"kind": "train", "step": step, "tokens": step * self.tokens_per_step, "loss": loop.last_loss, "lr": lr,
             "tokens_per_s": rate, **grads, **aux}
        )  # fmt: skip
        loop.loss_sum.zero_()
        loop.n_summed = 0
        loop.reference = loop.last_loss if loop.reference is None else loop.reference
        limit = self.cfg.diverge_factor
        if not math.isfinite(loop.last_loss) or loop.last_loss > limit * loop.reference:
            loop.status = "diverged"
            first = loop.reference
            loop.reason = f"loss {loop.last_loss:.4g} at step {step} (first loss {first:.4g}, limit x{limit:g})"
        return now

    def steps_since_log(self, loop: LoopState) -> list[list[float | None]]:
        """``[step, loss, grad_norm]`` of each step since the last log step (the loss averaged over ranks; None:
        unknown), read in one transfer; the pending values start again."""
        if not loop.pending:
            return []
        values = self.mean_over_ranks(pending_values(loop.pending)).tolist()  # [steps, 2]: loss, grad norm
        loop.pending = []
        first = loop.step - len(values) + 1
        return [[first + i, *(x if math.isfinite(x) else None for x in row)] for i, row in enumerate(values)]

    def grad_norms(self, loop: LoopState) -> dict[str, float | None]:
        """The mean and the largest gradient norm (before clipping) of the steps since the last log step (the
        same on every rank: the gradients are averaged before); the sums start again. NaN: unknown."""
        assert loop.grad_sum is not None and loop.grad_max is not None
        mean, top = torch.stack([loop.grad_sum / loop.n_summed, loop.grad_max]).tolist()
        loop.grad_sum, loop.grad_max = torch.zeros_like(loop.grad_sum), torch.zeros_like(loop.grad_max)
        return {
            "grad_norm": mean if math.isfinite(mean) else None,
            "grad_norm_max": top if math.isfinite(top) else None,
        }

    def mean_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` averaged over every rank (itself in one process)."""
        if self.world > 1:
            dist.all_reduce(value)
            value = value / self.world
        return value

    def result(self, loop: LoopState) -> FitResult:
        tokens = loop.step * self.tokens_per_step
        return FitResult(
            status=loop.status,
            steps=loop.step,
            tokens=tokens,
            train_time_s=loop.train_time,
            tokens_per_s=tokens / max(loop.train_time, 1e-9),
            final={"train_loss": loop.last_loss, **loop.last_aux, **loop.final_val},
            reason=loop.reason,
            initial=loop.initial,
            **steady(loop),
        )

    def evaluate(self) -> dict[str, float | None]:
        """Every validation metric at each evaluated length (zoo.lab.training.evaluation)."""
        return self.evaluator.evaluate()

    @property
    def val_sets(self) -> dict[int, list[Batch]]:
        return self.evaluator.val_sets

    @property
    def eval_errors(self) -> dict[str, str]:
        """Per evaluated length a part could not run at, why (the last evaluation's)."""
        return self.evaluator.eval_errors

    @property
    def routing(self) -> dict[str, list[float]]:
        """Each routing part's fraction of validation tokens per expert (the last evaluation's)."""
        return self.evaluator.routing

    def peak_memory(self) -> dict[str, Any]:
        """Peak memory in MiB: CUDA allocations on GPU, else the process's peak resident set."""
        if self.device.type == "cuda":
            return {"peak_memory_mib": torch.cuda.max_memory_allocated(self.device) / 2**20, "kind": "cuda_allocated"}
        return {"peak_memory_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "kind": "process_rss"}


def steady(loop: LoopState) -> dict[str, Any]:
    """The loop's steps after its warm-up mark (:meth:`Trainer.mark_warm`) and their training time."""
    if loop.warm is None:
        return {}
    step, seconds = loop.warm
    return {"steady_steps": loop.step - step, "steady_time_s": max(loop.train_time - seconds, 0.0)}


def pending_values(pending: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The steps' (loss, gradient norm) pairs as one float32 tensor [steps, 2]."""
    losses, norms = zip(*pending, strict=True)
    return torch.stack([torch.stack(losses).float(), torch.stack(norms).float()], dim=1)
