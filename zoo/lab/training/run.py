"""One run from its config to its folder: the lock, a finished run skipped and another config refused
(before anything is written), the plan, a branch's or a checkpoint's start, the loop, and the run's record
(summary.json, :class:`zoo.lab.records.summary.RunRecord`) written as it goes. A failed run is recorded,
never raised: a sweep carries on (one ``zoo-train`` run's config error is raised, nothing written)."""

from __future__ import annotations

import functools
import json
import logging
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from zoo.core.errors import ConfigError, IncompatibleParts
from zoo.lab.cores import dist_env, load_average, machine_load, submitit_tasks
from zoo.lab.data.tokenizer import copy_to_run
from zoo.lab.files import shown, write_atomic
from zoo.lab.planning.branch import identity, load_branch, resolve_branch, same_start, source_metrics
from zoo.lab.planning.options import tune_options
from zoo.lab.planning.plan import RunPlan, plan_run
from zoo.lab.planning.run_model import with_task_vocab
from zoo.lab.planning.train_config import TrainConfig, data_seed
from zoo.lab.records import checkpoint as ckpt
from zoo.lab.records import checkpoint_writers as writers
from zoo.lab.records.config import config_differences, config_hash, differences_text
from zoo.lab.records.lock import RunLock, holder
from zoo.lab.records.metrics import METRICS, MetricsLog, keep_metrics_until
from zoo.lab.records.resume import Refused, check_same_data, find_checkpoint, resumed_text
from zoo.lab.records.summary import RunRecord, read_record, write_record
from zoo.lab.records.trackers import Tracker, open_tracker
from zoo.lab.studies.tune import choose_lr
from zoo.lab.studies.variants import unused_axes
from zoo.lab.tasks import Task
from zoo.lab.tasks.base import absolute_paths
from zoo.lab.throughput import MEASURED, throughput
from zoo.lab.training.callbacks import RunContext
from zoo.lab.training.loop_callbacks import check_callbacks, run_callbacks
from zoo.lab.training.processes import (
    default_threads,
    join_processes,
    now,
    ranks_in_sync,
    take_device,
    versions,
)
from zoo.lab.training.trainer import FitResult, Trainer

log = logging.getLogger("zoo.lab.training.run")


def locked(function: Callable[..., RunRecord]) -> Callable[..., RunRecord]:
    """Run under the run folder's lock (zoo/lab/records/lock.py), held by the process that writes it (rank 0): a
    folder another process holds is left untouched (``status`` ``locked``, nothing written)."""

    @functools.wraps(function)
    def under_lock(cfg: Any, out_dir: Path | None, **kwargs: Any) -> RunRecord:
        lock = RunLock(out_dir) if out_dir is not None and dist_env()[0] == 0 else None
        if lock is not None and not lock.acquire():
            return held_elsewhere(out_dir, multirun=kwargs.get("multirun", False))  # type: ignore[arg-type]
        try:
            return function(cfg, out_dir, **kwargs)
        finally:
            if lock is not None:
                lock.release()

    return under_lock


def held_elsewhere(out_dir: Path, *, multirun: bool) -> RunRecord:
    """What a run does when another process trains its folder: a sweep skips it (and waits for it before its
    report, :class:`zoo.lab.records.lock.WaitForRuns`); a single run says so and fails."""
    error = f"another process trains this run folder ({holder(out_dir)}); nothing was written to it"
    world = dist_env()[1]
    if multirun and world == 1:
        log.info("skip %s: %s; the sweep waits for it before its report", shown(out_dir), error)
    else:
        log.error("%s: %s. Wait for it to end (run again then to resume or skip it), or choose another %s",
                  shown(out_dir), error, "hydra.sweep.dir" if multirun else "hydra.run.dir")  # fmt: skip
        if world > 1:
            raise SystemExit(1)  # every process of this run stops (torchrun ends the other ranks)
    return RunRecord(status="locked", error=error, run_dir=str(out_dir))


def run(cfg: DictConfig | dict[str, Any], out_dir: Path | None, **options: Any) -> dict[str, Any]:
    """Train one configuration (:func:`run_record`, the same options); the run's record as summary.json holds it
    (:meth:`RunRecord.to_json`)."""
    return run_record(cfg, out_dir, **options).to_json()


@locked
def run_record(
    cfg: DictConfig | dict[str, Any],
    out_dir: Path | None,
    *,
    overrides: Sequence[str] = (),
    choices: dict[str, Any] | None = None,
    parallel_jobs: int = 1,
    resume: bool = True,
    multirun: bool = False,
    job: int | None = None,
    tune_dir: Path | None = None,
    on_write: Callable[[], None] | None = None,
    raise_config_errors: bool = False,
) -> RunRecord:
    """Train one configuration; rank 0 writes ``metrics.jsonl`` and ``summary.json`` into ``out_dir``.

    Never raises for a bad config or a failing run: the record says ``failed`` with the error; with
    ``raise_config_errors`` (one ``zoo-train`` run), a config refused before the model is built raises its
    ConfigError instead, nothing written to ``out_dir`` by the run.
    With ``resume``, a folder whose summary already says ``ok`` for the same config is left as it is (a tuned
    run's is known by its recorded rate, before its tuning is read); a folder that holds a finished run (or
    the weights or checkpoints of one) of another config is refused, nothing written (status ``refused``). A
    run that fails before it writes its own record never writes a folder holding a finished run, of any
    config (:func:`kept_as_it_was`). ``on_write``: called once before the first write to ``out_dir``.
    Returns the run's record (a skipped run's: the one its folder holds).
    """
    rank, world, _ = dist_env()
    writes = rank == 0 and out_dir is not None
    started = time.perf_counter()
    # job: Hydra's job number in a sweep (job 0 holds the first value of every swept key)
    record = RunRecord(run_dir=str(out_dir) if out_dir else None, choices=dict(choices or {}),
                       overrides=list(overrides), started=now(), versions=versions(), job=job)  # fmt: skip
    claim = Claim(on_write)
    try:
        prior = read_record(out_dir) if writes and resume and world == 1 else None  # type: ignore[arg-type]
        raw = resolved(cfg, record, tune_dir, prior)
        if writes:
            answer = done_or_refused(out_dir, raw, record, resume=resume, world=world)  # type: ignore[arg-type]
            if answer is not None:
                return answer
        plan = planned(raw, record, multirun=multirun)  # a bad config fails here, before the run writes anything
        train(raw, plan, record, out_dir if writes else None, parallel_jobs=parallel_jobs, multirun=multirun,
              resume=resume, claim=claim)  # fmt: skip
    except Refused as why:
        return refuse(out_dir, str(why), world)  # type: ignore[arg-type]
    except ConfigError as error:
        if raise_config_errors and record.parameters is None:
            raise  # one run's config refused before its model: the command says it and exits
        incompatible = isinstance(error, IncompatibleParts)  # a grid's refused combination: recorded with its reason
        record.status = "incompatible" if incompatible else "failed"
        record.error = f"{'IncompatibleParts' if incompatible else 'ConfigError'}: {error}"
    except Exception as error:
        record.status, record.error = "failed", f"{type(error).__name__}: {error}"
        record.traceback = traceback.format_exc()
    record.wall_time_s = time.perf_counter() - started
    record.finished = now()
    return ended(record, out_dir if writes else None, claimed=claim.made, world=world)


class Claim:
    """Called by a run just before it first writes its folder (``on_write`` then called): from then on the
    folder is the run's own, and its failure is recorded there (:func:`ended`)."""

    def __init__(self, on_write: Callable[[], None] | None) -> None:
        self.made, self.on_write = False, on_write

    def __call__(self) -> None:
        self.made = True
        if self.on_write is not None:
            self.on_write()


def ended(record: RunRecord, out_dir: Path | None, *, claimed: bool, world: int) -> RunRecord:
    """The ended run's record, written to ``out_dir`` (None: this rank writes nothing) and logged; unless the
    run failed before it claimed a folder that holds a finished run (:func:`kept_as_it_was`): refused then."""
    if out_dir is not None and not claimed and (held := kept_as_it_was(out_dir, record)) is not None:
        return refuse(out_dir, held, world, advice="")
    if out_dir is not None:
        write_record(out_dir, record)
    if dist_env()[0] == 0:
        log_end(record, out_dir, out_dir is not None)
    return record


def kept_as_it_was(out_dir: Path, record: RunRecord) -> str | None:
    """Why a run that failed before writing its own record (``record``) leaves ``out_dir`` as it is: the folder
    holds a finished run, or the weights or checkpoints of one, of whatever config (None: it may write)."""
    held = held_work(out_dir, read_record(out_dir))
    if held is None:
        return None
    return f"holds {held}, left as it was: this run failed before it trained ({record.error})"


def resolved(
    cfg: DictConfig | dict[str, Any], record: RunRecord, tune_dir: Path | None, prior: RunRecord | None = None
) -> dict[str, Any]:
    """The run's config as it computes (tuned, its branch resolved), recorded in ``record`` with its hash;
    ``prior``: the record its folder holds (a finished tuned run's rate is taken from it, :func:`tuned`)."""
    raw = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    assert isinstance(raw, dict)
    raw = tuned(with_task_vocab(raw), record, tune_dir, prior)  # model.vocab_size null: the task's, recorded
    raw = resolve_branch(raw)  # train.branch from a sweep folder, or at its decay: one run, one step
    record.config, record.config_hash, record.unused_axes = raw, config_hash(raw), unused_axes(raw)
    record.choices = {k: v for k, v in (record.choices or {}).items() if k not in record.unused_axes}
    return raw


def done_or_refused(
    out_dir: Path, raw: dict[str, Any], record: RunRecord, *, resume: bool, world: int
) -> RunRecord | None:
    """Before anything is written: the folder's record when it holds this config's finished run (skipped),
    a ``refused`` record when it holds another's (nothing written), else None (the run may write)."""
    prior = read_record(out_dir)
    start = identity(raw)  # a branch's start (its parent run read once), None for a run from step 0
    if prior is not None and start is not None and prior.config_hash == config_hash(raw, branch_path=True):
        record.config_hash = prior.config_hash  # recorded before branches were named by their start
    same = prior is not None and prior.config_hash == record.config_hash and same_start(prior.branch, start)
    if resume and world == 1 and same and prior.status == "ok":  # type: ignore[union-attr]
        if record.tune is not None and record.tune != prior.tune:  # type: ignore[union-attr]
            prior.tune = record.tune  # type: ignore[union-attr]  # a wider grid kept its rate: the report reads it
            write_record(out_dir, prior)  # type: ignore[arg-type]
            prior = read_record(out_dir)  # as a skipped run returns it: the summary's (rates as strings)
        log.info("skip %s: already ok (%s)", shown(out_dir), metric_text(prior))  # type: ignore[arg-type]
        return prior
    refused = refusal(out_dir, prior, raw, start) if resume and not same else None
    return refuse(out_dir, refused, world) if refused is not None else None


def refusal(out_dir: Path, prior: RunRecord | None, raw: dict[str, Any], start: dict[str, Any] | None) -> str | None:
    """Why ``out_dir``, holding ``prior`` of another config or branch start, may not be written by this run
    (None: it may): it holds a finished run, or the weights or checkpoints of one."""
    if prior is None or prior.config is None:
        return None
    what = held_work(out_dir, prior)
    if what is None:
        return None  # a failed or killed run with nothing to resume: trained anew
    differ = config_differences(prior.config, raw)
    if differ or same_start(prior.branch, start):  # the same start: what differs is the config
        return f"holds {what} of another config ({differences_text(differ, 8) or 'its config hash differs'})"
    return f"holds {what} branched from another start ({prior.branch}, not {start})"


def held_work(out_dir: Path, prior: RunRecord | None) -> str | None:
    """What ``out_dir`` holds that only the run that trained it may write: ``a finished run (status ok)`` (or
    diverged), ``a resumable run`` (the weights or checkpoints of one); None for nothing of the kind."""
    if prior is not None and prior.status in ("ok", "diverged"):
        return f"a finished run (status {prior.status})"
    return "a resumable run" if (out_dir / ckpt.WEIGHTS).exists() or ckpt.checkpoints(out_dir) else None


#: What a refused run's message advises after "Nothing in it was changed".
CHOOSE_ANOTHER = ": choose another run folder, or remove it to train anew"


def refuse(out_dir: Path, why: str, world: int, advice: str = CHOOSE_ANOTHER) -> RunRecord:
    """Refuse to write ``out_dir``: say why on stderr (the folder's log file is the run's, left as it is)."""
    error = f"{shown(out_dir)} {why}. Nothing in it was changed{advice}"
    print(f"zoo-train: refused: {error}", file=sys.stderr, flush=True)
    if world > 1:
        raise SystemExit(1)  # every process of this run stops
    return RunRecord(status="refused", error=error, run_dir=str(out_dir))


def tuned(
    raw: dict[str, Any], record: RunRecord, tune_dir: Path | None, prior: RunRecord | None = None
) -> dict[str, Any]:
    """``raw`` with ``tune.lr``'s choice (this variant's best rate from the tuning runs, recorded in
    ``record.tune``) as ``train.lr``; ``raw`` itself without ``tune.lr``. The one check of ``tune``. A finished
    run in the folder (``prior``) tuned over the same rates and seeds gives its rate without the tuning runs
    being read: the run is then known as done (or as another config) whatever the tuning runs now hold."""
    rates, seeds = tune_options(raw.get("tune"))
    if rates is None:
        return raw
    if tune_dir is None:
        raise ConfigError("tune.lr", raw["tune"]["lr"], "tunes a sweep: zoo-sweep NAME or zoo-train -m")
    record.tune = finished_tuning(prior, rates, seeds) or choose_lr(raw, tune_dir)
    return {**raw, "train": {**(raw.get("train") or {}), "lr": record.tune["lr"]}}


def finished_tuning(prior: RunRecord | None, rates: list[float], seeds: list[int]) -> dict[str, Any] | None:
    """``prior``'s tuning record when it is a finished run tuned over ``rates`` on ``seeds``, else None."""
    tune = prior.tune if prior is not None and prior.status == "ok" else None
    if not tune or tune.get("lr") is None or list(tune.get("seeds") or ()) != list(seeds):
        return None
    searched = {float(rate) for rate in tune.get("searched") or {}}
    return dict(tune) if searched == set(rates) else None


def log_end(record: RunRecord, out_dir: Path | None, writes: bool) -> None:
    """The run's last log line: its error, or its status and headline metric."""
    if record.status == "failed":
        where = " (traceback in summary.json)" if record.traceback is not None and writes else ""
        log.error("%s failed: %s%s", shown(out_dir), record.error, where)
    else:
        log.info("%s %s: %s", shown(out_dir), record.status, metric_text(record))


def build_task(plan: RunPlan) -> Task:
    """The plan's task, refused when its vocabulary does not fit the model's embedding."""
    task = plan.build_task()
    vocab = plan.model["vocab_size"]
    if task.vocab_size > vocab:
        raise ConfigError("model.vocab_size", vocab, f"at least task {task.name!r}'s vocabulary ({task.vocab_size})")
    return task


def planned(raw: dict[str, Any], record: RunRecord, *, multirun: bool) -> tuple[RunPlan, list[tuple[str, dict]]]:
    """The run's config checked before anything is written or built (ConfigError names the first mistake): its
    plan (:func:`zoo.lab.planning.plan.plan_run`) and the loop's callbacks named in ``callbacks``."""
    world = dist_env()[1]
    torchrun_sweep = world > 1 and multirun and submitit_tasks() == 1
    plan = plan_run(raw, record.choices or {}, record.overrides or [], world=world, torchrun_sweep=torchrun_sweep)
    return plan, check_callbacks(raw.get("callbacks"))  # a plugin's name and options, before any tensor work


def train(
    raw: dict[str, Any],
    checked: tuple[RunPlan, list[tuple[str, dict]]],
    record: RunRecord,
    out_dir: Path | None,
    *,
    parallel_jobs: int,
    multirun: bool,
    resume: bool = True,
    claim: Callable[[], None] | None = None,
) -> None:
    """Build and train from the checked config (:func:`planned`), filling ``record`` in; ``out_dir`` None
    writes nothing (other ranks). With ``resume``, a checkpoint in ``out_dir`` (of this config) is continued;
    without, it is deleted. ``claim``: called just before the run first writes ``out_dir``.
    """
    rank, world, local_rank = dist_env()
    plan, named_callbacks = checked
    if plan.branch is not None:
        record.branch = plan.branch.record()  # train.branch: the run and checkpoint this one starts from
    threads = raw.get("threads") or default_threads(parallel_jobs)
    torch.set_num_threads(threads)
    device = take_device(plan.device, world, local_rank)
    task = build_task(plan)
    seed = raw.get("seed", 0)
    torch.manual_seed(seed)  # the same initial model on every rank
    model = plan.run_model.build(raw)  # the one builder of a run's model (zoo.lab.planning.run_model)
    torch.manual_seed(seed + 1_000_003 * rank)  # dropout and anything else random: per rank
    train_cfg = describe(record, plan, task, model, world)
    record.device, record.threads, record.world_size = str(device), threads, world
    record.metric = {"name": task.metric, "mode": task.mode(), "value": None}
    resume_from, metrics, tracker = open_records(out_dir, record, task, plan, resume=resume, multirun=multirun,
                                                 claim=claim)  # fmt: skip
    writer: Any = None
    if out_dir is not None and train_cfg.checkpoint_every > 0:
        writer = writers.CheckpointWriter(
            out_dir, config_hash=record.config_hash, world_size=world, keep=train_cfg.keep_checkpoints
        )
    mesh = None
    if world > 1:
        resume_from, mesh, writer = join_processes(plan, train_cfg, device, out_dir, resume_from, record, writer)
    context = RunContext(train_cfg, raw, rank=rank, world=world, out_dir=out_dir, metrics=metrics, tracker=tracker,
                         save_checkpoint=writer)  # fmt: skip
    try:
        trainer = Trainer(
            model, task, train_cfg, device=device,
            data_seed=data_seed(raw) * 65_537 + plan.mesh.dp_rank(rank),  # tensor-parallel ranks share batches
            rank=rank, world=world, callbacks=run_callbacks(context, named_callbacks),
            compile=raw.get("compile", False), parallel=plan.mesh, mesh=mesh, recipe=plan.recipe,
        )  # fmt: skip
        result = fit(trainer, plan, train_cfg, out_dir, resume_from, record, writer)
    finally:
        metrics.close()
        tracker.finish(record.to_json())  # status ok or diverged; running: the run raised
        if writer is not None:
            writer.close()
        if world > 1:
            dist.destroy_process_group()
    record_outcome(record, trainer, result, task.metric)


def record_outcome(record: RunRecord, trainer: Trainer, result: FitResult, metric: str) -> None:
    """The run's memory, its metric's final value, and what the last evaluation noticed, into ``record``."""
    memory = trainer.peak_memory()
    record.peak_memory_mib, record.kind = memory["peak_memory_mib"], memory["kind"]
    assert record.metric is not None
    record.metric["value"] = result.final.get(metric) if result.status == "ok" else None
    if trainer.eval_errors:
        record.eval_errors = trainer.eval_errors
    if trainer.routing:
        record.routing = trainer.routing  # fraction of routed tokens per expert, per routing part


def describe(record: RunRecord, plan: RunPlan, task: Task, model: Any, world: int) -> TrainConfig:
    """Record the model and data in ``record``; the train config with its steps set by ``train.budget``."""
    flops_per_token = model.flops_per_token(task.seq_len)
    train_cfg, budget = plan.train.with_budget(plan.train.batch_size * task.seq_len * world, flops_per_token)
    if budget is not None:
        record.budget = budget  # train.budget set the steps
    record.parameters, record.active_parameters = model.parameter_counts(), model.num_active_parameters()
    record.flops_per_token, record.data = flops_per_token, task.info()
    paths = absolute_paths({"name": task.name, **plan.task_options})
    if paths:
        record.data["paths"] = paths  # where evaluation finds the data from any folder (zoo-eval)
    return train_cfg


def open_records(
    out_dir: Path | None,
    record: RunRecord,
    task: Task,
    plan: RunPlan,
    *,
    resume: bool,
    multirun: bool,
    claim: Callable[[], None] | None = None,
) -> tuple[Path | None, MetricsLog, Tracker]:
    """Rank 0 (``out_dir`` set): ``claim`` called before anything is written, the checkpoint to resume from,
    the record written (``running``), the metrics log (cut back to that checkpoint) and the tracker run; other
    ranks: None and no-op writers."""
    world, data = record.world_size or 1, record.data or {}
    if out_dir is not None and claim is not None:
        claim()  # the folder is this run's from here on (a stale checkpoint file is its first write)
    resume_from = find_checkpoint(out_dir, record, world, resume) if out_dir is not None else None
    if resume_from is not None:
        check_same_data(out_dir, record)  # type: ignore[arg-type]
    if out_dir is not None:
        write_record(out_dir, record)  # status "running": a killed run is re-run on resume
        ckpt.remove_weights(out_dir)  # weights on disk are always this config's
        copy_to_run(out_dir, data)  # the text's tokenizer travels with the run folder
    if dist_env()[0] == 0:
        choices = ", ".join(f"{k}={v}" for k, v in (record.choices or {}).items() if v is not None)
        counts = record.parameters or {}
        total = f"{counts['total']:,}" + (f" ({counts['ngram']:,} of them n-gram tables)" if "ngram" in counts else "")
        data_hash = data.get("sha256", "generated")[:12]
        log.info(
            "%s: %s parameters, %s, data %s (%s)", shown(out_dir), total, choices or "defaults", task.name, data_hash
        )
    if resume_from is not None and out_dir is not None:
        keep_metrics_until(out_dir, ckpt.read_state(resume_from)["step"])  # the curve continues after it
    elif plan.branch is not None and out_dir is not None:  # a branch's curve begins with its parent's
        write_atomic(out_dir / METRICS, "".join(json.dumps(r) + "\n" for r in source_metrics(plan.branch)))
    append = resume_from is not None or plan.branch is not None
    metrics = MetricsLog(out_dir / METRICS if out_dir is not None else None, append=append)
    tracker = Tracker()
    if out_dir is not None:  # rank 0: one tracker run per run folder, beside the sweep's others
        tracker = open_tracker(plan.logger, out_dir.parent if multirun else out_dir, out_dir.name, record.to_json())
    return resume_from, metrics, tracker


def fit(
    trainer: Trainer,
    plan: RunPlan,
    train_cfg: TrainConfig,
    out_dir: Path | None,
    resume_from: Path | None,
    record: RunRecord,
    writer: Any,
) -> FitResult:
    """Resume (from ``resume_from``), train, and save the final weights; ``record`` records the result."""
    model, rank, world, sharded = trainer.model, trainer.rank, trainer.world, plan.mesh.sharded
    record.resumed_from = []
    if resume_from is None and plan.branch is not None:  # a branch's first process: the checkpoint it branches from
        trainer.restore(load_branch(plan.branch, model, trainer.optimizer, world=world), resumed=False)
        if rank == 0:
            log.info("%s: branched from %s", shown(out_dir), plan.branch.folder)
    if resume_from is not None:
        state = ckpt.load_checkpoint(
            resume_from, model, trainer.optimizer, config_hash=record.config_hash, world_size=world
        )
        trainer.restore(state)
        record.resumed_from = [*state.resumed_from, state.step]  # a branch's start is record.branch["step"]
        if rank == 0:
            log.info("%s: resumed from %s", shown(out_dir), resumed_text(resume_from, record))
    load = load_average()
    result = trainer.fit()
    record.load = machine_load(load)  # the machine's load beside the loop's time
    if writer is not None:
        writer.close()  # the last checkpoint is on disk before the run says it is done
    whole = writers.full_state_dict(model) if sharded and train_cfg.save == "final" else None  # every rank
    if out_dir is not None and train_cfg.save == "final":
        meta = {"config_hash": record.config_hash, "step": str(result.steps)}
        ckpt.save_weights(model, out_dir / ckpt.WEIGHTS, meta, state=whole)  # one-process layout
    record.status, record.steps, record.tokens = result.status, result.steps, result.tokens
    record.train_time_s, record.tokens_per_s, record.reason = result.train_time_s, result.tokens_per_s, result.reason
    record.final, record.initial, record.spikes = dict(result.final), dict(result.initial), dict(result.spikes)
    record.flops = result.tokens * (record.flops_per_token or 0)  # training FLOPs spent
    steady = result.steady_steps * trainer.tokens_per_step * (record.flops_per_token or 0)  # model FLOPs, no warm-up
    measured = throughput(steady, result.steady_time_s, trainer.device, world)
    record.flops_per_second, record.mfu, record.mfu_peak, record.mfu_reason = (measured.get(k) for k in MEASURED)
    if world > 1 and not sharded:
        record.ranks_in_sync = ranks_in_sync(model)
    mesh = plan.mesh
    record.parallel = {"dp_replicate": mesh.dp_replicate, "dp_shard": mesh.dp_shard, "tp": mesh.tp}
    return result


def metric_text(record: RunRecord) -> str:
    """``val_bpb=2.3120, 41,000 tokens/s, 25.1 s`` (or the divergence reason)."""
    if record.status == "diverged":
        return record.reason or "diverged"
    if record.status == "incompatible":
        return str(record.error)
    metric = record.metric or {}
    value = metric.get("value")
    shown = f"{metric.get('name')}={value:.4f}" if isinstance(value, float) else f"{metric.get('name')}=n/a"
    return f"{shown}, {record.tokens_per_s or 0:,.0f} tokens/s, {record.wall_time_s or 0:.1f} s"
