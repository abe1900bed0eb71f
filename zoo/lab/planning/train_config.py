"""The ``train`` section as a typed :class:`TrainConfig`, and the run config's top-level keys checked
(:func:`check_run_config`) before any tensor work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from zoo.core.errors import ConfigError
from zoo.core.options import check_type
from zoo.lab.keys import RUN_KEYS
from zoo.lab.recipe import lr_at
from zoo.lab.recipe.schedules import Cosine

#: ``train.save``: what a finished run keeps (final weights as model.safetensors, or nothing).
SAVE = ("final", "none")


#: ``train`` keys that must be >= 0 (0: off, where it turns something off).
NON_NEGATIVE = ("warmup_steps", "eval_every", "weight_decay", "grad_clip", "checkpoint_every", "z_loss", "probe_every")


#: ``train.budget``: what sets a run's steps instead of ``train.steps`` (at most one of them).
BUDGETS = ("tokens", "flops")


@dataclass(frozen=True)
class TrainConfig:
    """The ``train`` section. ``eval_every=0`` evaluates only at the end; ``grad_clip=0`` turns clipping off."""

    steps: int = 500
    batch_size: int = 16
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    log_every: int = 10
    eval_every: int = 100
    eval_batches: int = 8
    diverge_factor: float = 4.0
    save: str = "final"
    checkpoint_every: int = 100
    keep_checkpoints: int = 2  # 2: a checkpoint that fails its check has an older one to fall back to
    activation_checkpointing: bool = False
    budget_tokens: float | None = None  # train.budget.tokens: steps = tokens / tokens per step
    budget_flops: float | None = None  # train.budget.flops: steps = flops / (flops per token x tokens per step)
    #: Weights of auxiliary losses by name (zoo.core.auxiliary), over the parts' defaults.
    aux_weights: dict[str, float] = field(default_factory=dict)
    z_loss: float = 0.0  # weight of the mean squared log-partition of the logits (0: none)
    probe_every: int = 0  # steps between probe records (zoo.lab.training.probes; 0: none)
    tail_ema: float = 0.0  # decay of the tail EMA of the weights (zoo.lab.recipe.tail_ema; 0: none)
    tail_ema_from: int = 1  # the first step the tail EMA averages

    @classmethod
    def from_config(cls, raw: dict[str, Any] | None) -> TrainConfig:
        raw = dict(raw or {})
        budget = raw.pop("budget", None) or {}
        raw.pop("branch", None)  # train.branch: checked by the plan (zoo.lab.planning.branch)
        names = [f.name for f in fields(cls) if not f.name.startswith("budget_")]
        for key in raw:
            if key not in names:
                raise ConfigError(
                    f"train.{key}", raw[key], f"unknown key; allowed: {', '.join([*names, 'budget', 'branch'])}"
                )
        hints = {"int": int, "float": float, "str": str, "bool": bool}
        values = {
            f.name: check_type(f"train.{f.name}", raw[f.name], hints[f.type])
            for f in fields(cls)
            if f.name in raw and f.name != "aux_weights"
        }
        if not isinstance(budget, dict):
            raise ConfigError("train.budget", budget, "a mapping: {tokens: N} or {flops: F}")
        for key, value in budget.items():
            if key not in BUDGETS:
                raise ConfigError(f"train.budget.{key}", value, f"unknown key; allowed: {', '.join(BUDGETS)}")
            if value is not None:
                number = check_type(f"train.budget.{key}", value, int | float)
                if isinstance(number, bool) or not number > 0 or not math.isfinite(number):
                    raise ConfigError(f"train.budget.{key}", value, "must be a positive number (or null)")
                values[f"budget_{key}"] = float(number)
        if len([k for k in values if k.startswith("budget_")]) > 1:
            raise ConfigError("train.budget", budget, "one of tokens or flops, not both")
        aux = raw.get("aux_weights") or {}
        if not isinstance(aux, dict):
            raise ConfigError("train.aux_weights", aux, "a mapping of auxiliary loss name to weight")
        values["aux_weights"] = {str(k): check_type(f"train.aux_weights.{k}", v, float) for k, v in aux.items()}
        cfg = cls(**values)
        for name in ("steps", "batch_size", "log_every", "eval_batches"):
            if getattr(cfg, name) < 1:
                raise ConfigError(f"train.{name}", getattr(cfg, name), "must be a positive integer")
        for name in NON_NEGATIVE:
            if getattr(cfg, name) < 0:
                raise ConfigError(f"train.{name}", getattr(cfg, name), "must be >= 0")
        if not cfg.lr > 0 or not math.isfinite(cfg.lr):
            raise ConfigError("train.lr", cfg.lr, "must be a positive number")
        if not 0 <= cfg.min_lr_ratio <= 1:
            raise ConfigError("train.min_lr_ratio", cfg.min_lr_ratio, "must be in [0, 1]")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(cfg, name) < 1:
                raise ConfigError(f"train.{name}", getattr(cfg, name), "must be in [0, 1)")
        if not cfg.diverge_factor > 1:
            raise ConfigError("train.diverge_factor", cfg.diverge_factor, "must be > 1")
        if not 0 <= cfg.tail_ema < 1:
            raise ConfigError("train.tail_ema", cfg.tail_ema, "must be in [0, 1): the EMA's decay per step (0: none)")
        if cfg.tail_ema_from < 1:
            raise ConfigError("train.tail_ema_from", cfg.tail_ema_from, "must be a step >= 1")
        if cfg.save not in SAVE:
            raise ConfigError("train.save", cfg.save, " or ".join(SAVE))
        if cfg.keep_checkpoints < 1:
            raise ConfigError("train.keep_checkpoints", cfg.keep_checkpoints, "must be a positive integer")
        return cfg

    def with_budget(self, tokens_per_step: int, flops_per_token: int) -> tuple[TrainConfig, dict[str, Any] | None]:
        """This config with ``steps`` set from the budget (the most whole steps within it, at least 1),
        and what the summary records of it; unchanged (and None) without a budget."""
        if self.budget_tokens is None and self.budget_flops is None:
            return self, None
        tokens = self.budget_tokens if self.budget_tokens is not None else self.budget_flops / flops_per_token
        steps = max(1, int(tokens // tokens_per_step))
        kind = "tokens" if self.budget_tokens is not None else "flops"
        info = {"kind": kind, "value": getattr(self, f"budget_{kind}"), "steps": steps,
                "tokens_per_step": tokens_per_step, "flops_per_token": flops_per_token}  # fmt: skip
        return replace(self, steps=steps), info

    def lr_at(self, step: int) -> float:
        """The default schedule's rate at 0-based ``step`` (``schedule=cosine``: linear warmup to ``lr``,
        cosine down to ``lr * min_lr_ratio``); a run's own schedule is its recipe's."""
        return lr_at(Cosine(), step, self)


def data_seed(raw: dict[str, Any]) -> int:
    """The seed of a run's data order: ``data_seed``, or ``seed`` when it is null (every run before the key)."""
    data = raw.get("data_seed")
    return int(raw.get("seed", 0) if data is None else data)


def check_run_config(raw: dict[str, Any], *, here: bool = True) -> tuple[TrainConfig, torch.device]:
    """Validate the run-level keys (``seed``, ``device``, ``threads``, ``train``); no tensor work. ``here``: the
    run trains on this machine, whose CUDA a ``cuda`` device needs."""
    for key in raw:
        if key not in RUN_KEYS:
            raise ConfigError(key, raw[key], f"unknown top-level key; allowed: {', '.join(sorted(RUN_KEYS))}")
    check_type("seed", raw.get("seed", 0), int)
    check_type("data_seed", raw.get("data_seed"), int | None)
    check_type("threads", raw.get("threads"), int | None)
    check_type("progress", raw.get("progress"), bool | None)
    check_type("compile", raw.get("compile", False), bool)
    if raw.get("threads") is not None and raw["threads"] < 1:
        raise ConfigError(
            "threads", raw["threads"], "must be a positive integer (or null: every core this job may use)"
        )
    return TrainConfig.from_config(raw.get("train")), checked_device(raw.get("device", "cpu"), here=here)


def checked_device(device: object, *, here: bool = True, cpu: str = "device=cpu") -> torch.device:
    """``device`` (cpu, cuda or cuda:<index>) as a torch.device, or a ConfigError naming it; ``here``: used on this
    machine, whose CUDA a ``cuda`` device needs (``cpu``: how the error spells the way back)."""
    device = check_type("device", device, str)
    try:
        dev = torch.device(device)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ConfigError("device", device, "cpu, cuda or cuda:<index>")
    if here and dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, f"CUDA is not available on this machine; use {cpu}")
    return dev
