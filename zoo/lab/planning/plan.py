"""The run config checked in one pass, before any tensor work, and what it resolved to.

:func:`plan_run` checks each section once, each by its owner (the run keys and ``train`` here, the
logger by :mod:`zoo.lab.records.trackers`, ``optim`` and ``schedule`` by :mod:`zoo.lab.recipe`, ``report`` by
:mod:`zoo.lab.studies.variants`, the block by :mod:`zoo.assembly`, the mesh by :mod:`zoo.lab.training.scale`, the task's
options by its registry), and returns a frozen :class:`RunPlan`: the run builds from it and resolves
nothing again. ``tune`` is checked once before, by :func:`zoo.lab.training.run.run` (its rate changes ``train.lr``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from zoo.assembly.compose import resolve_composed
from zoo.assembly.init import BUILT, init_options
from zoo.assembly.mup import MuP
from zoo.assembly.spec import BlockSpec
from zoo.core.errors import ConfigError
from zoo.lab.planning.branch import Branch, check_branch
from zoo.lab.planning.mesh import ProcessMesh
from zoo.lab.planning.options import report_interaction, report_options
from zoo.lab.planning.run_model import RunModel, with_task_vocab
from zoo.lab.planning.train_config import TrainConfig, check_run_config
from zoo.lab.recipe import Recipe, check_recipe
from zoo.lab.recipe.group_rates import check_on_meta
from zoo.lab.recipe.param import check_param
from zoo.lab.recipe.qk_clip import check_on_meta as check_qk_clip
from zoo.lab.records.trackers import check_logger
from zoo.lab.tasks import Task
from zoo.lab.tasks.base import task_options
from zoo.models.config import block_section, model_options, stack_specs
from zoo.parts.flex import NO_CPU_BACKWARD
from zoo.parts.positions import LearnedPosition


@dataclass(frozen=True)
class RunPlan:
    """A checked run config: ``train`` and ``device`` (run keys), ``logger`` (its options, defaults
    filled in), ``mesh`` (the process mesh, checked against the model), ``model`` (the model
    section's options), ``specs`` (one resolved block spec per layer), the task's class and options, and
    ``recipe`` (the ``optim`` and ``schedule`` sections, checked), ``branch`` (``train.branch``: the checkpoint
    of another run this one starts from, checked against it; None for a run from step 0), ``mup``
    (``param=mup``: every parameter's μP scaling, zoo.assembly.mup; None under ``param=standard``)."""

    train: TrainConfig
    device: torch.device
    logger: dict[str, Any]
    mesh: ProcessMesh
    model: dict[str, Any]
    specs: tuple[BlockSpec, ...]
    task_cls: type[Task]
    task_options: dict[str, Any]
    recipe: Recipe = field(default_factory=Recipe)
    branch: Branch | None = None
    mup: MuP | None = None

    def build_task(self) -> Task:
        """The task (a corpus task reads its data here)."""
        return self.task_cls(**self.task_options)

    @property
    def run_model(self) -> RunModel:
        """What builds the run's model (zoo.lab.planning.run_model: the one builder of a run's model)."""
        return RunModel(self.task_cls, self.specs, self.mup)


def plan_run(
    raw: Mapping[str, Any],
    choices: Mapping[str, Any],
    overrides: Sequence[str] = (),
    *,
    world: int = 1,
    torchrun_sweep: bool = False,
    here: bool = True,
) -> RunPlan:
    """Check ``raw`` (a resolved run config) section by section; the first mistake raises ConfigError.
    ``choices`` and ``overrides`` name the option file that set a bad part; ``torchrun_sweep``: this
    is a sweep launched under torchrun (refused); ``here``: the run trains on this machine (its device is
    checked against it: not so for a sweep's job checked where it is launched, to train on another)."""
    train_cfg, device = check_run_config(raw, here=here)
    logger = check_logger(raw.get("logger"))  # a tracker that is not installed fails here, before any work
    report_options(raw.get("report"))  # a bad report.baseline or report.correction fails before training
    report_interaction((raw.get("report") or {}).get("interaction"))
    # Fail on the block before reading data (a part's name naming the option file that set it).
    resolve_composed(raw.get("block") or {}, choices, overrides)
    if torchrun_sweep:
        raise ConfigError(
            "hydra.mode",
            "MULTIRUN",
            "torchrun trains one configuration; launch sweeps without it (or on submitit with "
            "hydra.launcher.tasks_per_node: one process per task for each run)",
        )
    mesh = ProcessMesh.from_config(raw.get("parallel"), world)  # the mesh's keys against the world size
    compile = raw.get("compile", False)
    recipe = check_recipe(raw, train_cfg, sharded=mesh.sharded, tp=mesh.tp, compile=compile)  # optim=, schedule=
    branch = check_branch(dict(raw), train_cfg, recipe, world=world)  # train.branch: against its source run
    options = model_options(with_task_vocab(raw))  # model.vocab_size null: the task's (zoo.lab.planning.run_model)
    specs = stack_specs(block_section(raw), options)
    task_cls, task_opts = task_options(raw.get("task"))
    seq_len = task_cls.planned_seq_len(task_opts)
    lengths = [seq_len * f for f in task_opts.get("eval_lengths", (1,))] if seq_len is not None else []
    mesh.check_model(specs, options["vocab_size"], lengths)  # parts' plans, divisibility, sequence parallel
    check_sharded(mesh, train_cfg, options)
    check_positions_fit(specs, task_opts.get("seq_len"))
    check_flex_trains(specs, device)
    custom_model = task_cls.builds_own_model()
    check_objective(recipe, custom_model=custom_model, mesh=mesh, seq_len=seq_len)
    param = check_param(
        raw, optimizer=recipe.optim["name"], dp_shard=mesh.dp_shard, tp=mesh.tp, custom_model=custom_model
    )
    check_on_meta(lambda: RunModel(task_cls, tuple(specs), param).build(raw), recipe.optim["lr_ratios"])
    check_qk_clip(lambda: RunModel(task_cls, tuple(specs), param).build(raw), recipe.optim["qk_clip"])
    if task_opts.get("doc_mask"):
        check_documents(lambda: RunModel(task_cls, tuple(specs), param).build(raw))
    check_init(raw.get("init"), mup=param is not None, custom_model=custom_model)
    return RunPlan(train_cfg, device, logger, mesh, options, tuple(specs), task_cls, task_opts, recipe, branch, param)


def check_documents(build: Any) -> None:
    """``task.doc_mask=true``: the run's model, built on the meta device, must keep documents apart (every layer's
    mixer states its reset, zoo.models.language.LanguageModel.check_documents); a model that takes no document ids
    (an encoder-decoder) is refused by name."""
    with torch.device("meta"):
        model = build()
    check = getattr(model, "check_documents", None)
    if check is None:
        raise ConfigError("task.doc_mask", True, f"false: the task's {type(model).__name__} takes no document ids")
    check()


def check_sharded(mesh: ProcessMesh, train_cfg: Any, options: Mapping[str, Any]) -> None:
    """What a sharded run (FSDP2 or tensor parallelism) cannot do, refused by key: model options with no
    tensor-parallel plan, probes and a tail EMA (both read whole weights), evaluation batches the ranks cannot share."""
    for key in ("value_embeddings", "smear", "backout", "ngram"):  # no plan (smear's, backout's scalars, the n-gram
        if mesh.tp > 1 and options[key]:  # table and its scales: each rank's tokens')
            off = "null" if key == "ngram" else "false"
            why = f"{off} under parallel.tp={mesh.tp}: no tensor-parallel plan"
            raise ConfigError(f"model.{key}", options[key], why)
    if not mesh.sharded:
        return
    if train_cfg.probe_every:
        raise ConfigError("train.probe_every", train_cfg.probe_every,
                          "0 under FSDP2 or tensor parallelism (probes read whole weights)")  # fmt: skip
    if train_cfg.tail_ema:
        raise ConfigError("train.tail_ema", train_cfg.tail_ema, "0 under FSDP2 or tensor parallelism (the average "
                          "is kept of whole weights, not of shards)")  # fmt: skip
    if train_cfg.eval_batches % mesh.dp:
        why = f"must be a multiple of the data-parallel ways {mesh.dp} under FSDP2 or tensor parallelism"
        raise ConfigError("train.eval_batches", train_cfg.eval_batches, f"{why} (every rank runs as many forwards)")


def check_init(section: Any, *, mup: bool, custom_model: bool) -> None:
    """``init``'s options (zoo.assembly.init), and the runs it cannot combine with: μP draws GPT-2's stds at the
    base width and scales them by role (``olmo`` and ``mitchell`` set stds of their own); an encoder-decoder keeps
    GPT-2's."""
    options = init_options(section)
    if mup and options["name"] in ("olmo", "mitchell"):
        raise ConfigError("init.name", options["name"], "param=mup scales GPT-2's stds by role from the base width: "
                          "use init=gpt2 (its init.std is the base width's) or init=zero_out")  # fmt: skip
    if custom_model and options != BUILT:
        raise ConfigError("init.name", options["name"], "the task builds its own model (an encoder-decoder), "
                          "initialized as GPT-2's: init covers the decoder-only language model")  # fmt: skip


def check_objective(recipe: Recipe, *, custom_model: bool, mesh: ProcessMesh, seq_len: int | None) -> None:
    """An objective with extra heads (``objective=mtp``) on a decoder-only language model, on one process or
    under DDP, predicting fewer tokens past the next than the trained length holds."""
    extra, name = recipe.objective_entry().extra, recipe.objective["name"]
    if not extra:
        return
    if custom_model:
        raise ConfigError("objective.name", name, "the task builds its own model (an encoder-decoder); "
                          "multi-token prediction covers the decoder-only language model")  # fmt: skip
    if mesh.sharded:
        key, value = ("parallel.tp", mesh.tp) if mesh.tp > 1 else ("parallel.dp_shard", mesh.dp_shard)
        raise ConfigError(key, value, f"objective={name} runs on one process or under DDP (dp_shard=1, tp=1): "
                          "its extra heads have no tensor-parallel plan nor FSDP2 wrapping")  # fmt: skip
    if seq_len is not None and extra >= seq_len:
        raise ConfigError("objective.k", extra, f"must be below task.seq_len={seq_len} (depth j scores seq_len - j "
                          "positions)")  # fmt: skip


def check_positions_fit(specs: Sequence[BlockSpec], seq_len: int | None) -> None:
    """A learned position table at least ``task.seq_len`` long, from the config alone (before the task
    reads its data); a task without a ``seq_len`` option is not checked here."""
    max_len = specs[0].dims.max_len
    if (
        seq_len is None
        or max_len is None
        or not issubclass(specs[0]["pos"].part.cls, LearnedPosition)
        or max_len >= seq_len
    ):
        return
    raise ConfigError(
        "block.max_len",
        max_len,
        f"below task.seq_len={seq_len}: learned positions need block.max_len >= task.seq_len; "
        f"set block.max_len={seq_len} or lower task.seq_len",
    )


def check_flex_trains(specs: Sequence[BlockSpec], device: torch.device) -> None:
    """``block.attn.backend=flex`` trains on CUDA only: torch's FlexAttention has no backward on the CPU. Refused
    from the config, before any tensor work (the forward refuses too, for a model trained outside a run)."""
    if device.type == "cpu" and any(spec["attn"].options.get("backend") == "flex" for spec in specs):
        raise ConfigError("block.attn.backend", "flex", NO_CPU_BACKWARD)
