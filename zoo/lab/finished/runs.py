"""Using a finished run: load its model (:func:`load_run`), re-evaluate it on its own data at any length
(:func:`evaluate_run`), export it (:func:`to_hf`). The command lines over them are in
:mod:`zoo.lab.commands` (``zoo-generate``, ``zoo-eval``, ``zoo-lm-eval``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from zoo.core.errors import ConfigError
from zoo.core.registry import UnknownName, installed_plugins
from zoo.lab.data.tokenizer import BYTE_TASKS, Codec, run_codec
from zoo.lab.planning.run_model import build_run_model, is_language_model
from zoo.lab.planning.train_config import TrainConfig
from zoo.lab.records import checkpoint as ckpt
from zoo.lab.records.summary import SUMMARY, RunRecord, read_record_checked
from zoo.lab.tasks import Task, build_task
from zoo.lab.tasks.base import task_options
from zoo.lab.training.evaluation import Evaluator
from zoo.models import hf

log = logging.getLogger("zoo.lab.finished.runs")


class LoadedRun(NamedTuple):
    """A trained model (in eval mode: a LanguageModel, or a Seq2SeqModel for an encoder-decoder task) and
    the resolved config that built it (summary.json's)."""

    model: nn.Module
    config: dict[str, Any]


def run_folder(path: str | Path) -> Path:
    """The run folder of a run folder or of one of its ``checkpoints/step_<N>`` folders."""
    path = Path(path)
    return path.parent.parent if path.parent.name == ckpt.CHECKPOINTS else path


def run_record(path: str | Path) -> RunRecord:
    """The record of the run at ``path`` (a run folder or one of its checkpoints), with its config; else a
    ConfigError naming the folder and why its summary.json does not read (not JSON, a field not of its type)."""
    run_dir = run_folder(path)
    record, problem = read_record_checked(run_dir)
    if problem == f"no {SUMMARY}":
        raise ConfigError("run", str(run_dir), f"a run folder with a {SUMMARY} (zoo-train writes one)")
    if record is None:
        raise ConfigError("run", str(run_dir), f"{problem}: a {SUMMARY} as zoo-train writes it")
    if record.config is None:
        raise ConfigError("run", str(run_dir), f"{SUMMARY} records no config (status {record.status!r})")
    return record


def load_codec(path: str | Path) -> Codec:
    """How the run at ``path`` turns text into token ids and back: UTF-8 for bytes, its verified
    tokenizer.json for a tokens run that has one, else token ids (:mod:`zoo.lab.data.tokenizer`)."""
    record = run_record(path)
    return run_codec(run_folder(path), (record.config or {})["task"]["name"], record.data or {})


def load_run(path: str | Path, device: str | torch.device = "cpu") -> LoadedRun:
    """The trained model of a run folder (its ``model.safetensors``), or of one of its checkpoints
    (``<run>/checkpoints/step_<N>``), rebuilt from the config in the run's ``summary.json``.

    The weights are checked against the ``manifest.json`` beside them first: a file that is truncated or
    altered raises :class:`zoo.lab.records.checkpoint.IntegrityError` (a ConfigError) naming it and what is wrong.
    Weights written before manifests load with a warning. Nothing read is a pickle."""
    path, run_dir = Path(path), run_folder(path)
    weights = path / ckpt.WEIGHTS
    record = run_record(run_dir)
    config = record.config or {}
    if not weights.exists():
        latest = ckpt.latest_checkpoint(run_dir)
        hint = f"; its latest checkpoint is {latest}" if latest is not None else ""
        allowed = f"has no {ckpt.WEIGHTS} (status {record.status!r}; train.save=final keeps it){hint}"
        raise ConfigError("run", str(path), allowed)
    with plugins_named(record):
        model = build_run_model(config).to(device)  # every axis applied: task's model kind, μP, ...
    meta = ckpt.load_weights(model, weights, unverified_ok=True)  # format 1: no manifest, a warning
    if meta.get("config_hash") not in (None, record.config_hash):
        raise ConfigError(
            "run", str(path), f"weights of config {meta['config_hash']}, summary.json of {record.config_hash}"
        )
    return LoadedRun(model.eval(), config)


def missing_plugins(record: RunRecord) -> list[str]:
    """The plugins the run trained with (summary.json's ``versions.plugins``) that are not installed here as they
    were: ``zoo-dyt 0.1.0 (not installed)``, ``zoo-dyt 0.1.0 (installed: 0.2.0)``."""
    recorded, here = (record.versions or {}).get("plugins") or {}, installed_plugins()
    return [
        f"{name} {version} ({'not installed' if name not in here else f'installed: {here[name]}'})"
        for name, version in recorded.items()
        if here.get(name) != version
    ]


@contextlib.contextmanager
def plugins_named(record: RunRecord) -> Iterator[None]:
    """An unknown part (or task) name raised inside, with the plugins the run trained with that are missing here."""
    try:
        yield
    except UnknownName as error:
        missing = missing_plugins(record)
        if not missing:
            raise
        trained = f"; the run trained with plugin {', '.join(missing)} (summary.json's versions.plugins): install it"
        raise UnknownName(error.field, error.value, error.allowed + trained) from None


def to_hf(model_or_run: nn.Module | str | Path, out_dir: str | Path, family: str | None = None) -> Path:
    """Write a ``transformers`` checkpoint of a zoo model or a run folder (see :func:`zoo.models.hf.to_hf`;
    ``family``: the transformers family to write, by name, else the one that holds the model)."""
    model = model_or_run if isinstance(model_or_run, nn.Module) else load_run(model_or_run).model
    is_language_model(model, "to_hf", ": transformers' causal LM classes are decoder-only")
    return hf.to_hf(model, out_dir, family)  # type: ignore[arg-type]


# -- text and tokens ------------------------------------------------------------------------------


def text_to_tokens(prompt: str, config: dict[str, Any]) -> list[int]:
    """A prompt as token ids by the run's task alone: UTF-8 bytes for a byte-level task, else ids
    separated by spaces (:func:`load_codec` also reads a run's tokenizer)."""
    return Codec("bytes" if config["task"]["name"] in BYTE_TASKS else "ids").encode(prompt)


def tokens_to_text(ids: Sequence[int], config: dict[str, Any]) -> str:
    """Token ids as text by the run's task alone: UTF-8 (undecodable bytes replaced) for a byte-level
    task, else the ids separated by spaces."""
    return Codec("bytes" if config["task"]["name"] in BYTE_TASKS else "ids").decode(ids)


# -- evaluation -----------------------------------------------------------------------------------


def run_task_config(path: str | Path, data: str | None = None) -> dict[str, Any]:
    """The run's ``task`` section as it read its data: its file options as recorded absolute when it started
    (``data.paths``), or ``task.path`` = ``data`` when given. A run recorded before absolute paths reads its
    relative ones from the working folder, with a warning."""
    record = run_record(path)
    task_cfg = dict((record.config or {})["task"])
    recorded = (record.data or {}).get("paths")
    if data is not None:
        if "path" not in task_options(task_cfg)[0].path_options:
            raise ConfigError("--data", data, f"only a task that reads files takes it (task {task_cfg.get('name')!r})")
        task_cfg["path"] = data
    elif recorded is not None:
        task_cfg.update(recorded)
    elif any(isinstance(task_cfg.get(k), str) for k in task_options(task_cfg)[0].path_options):
        log.warning("%s: recorded no absolute data path (an older run): reading task.path from %s", path, Path.cwd())
    return task_cfg


def run_task(task_cfg: dict[str, Any], *, given: bool) -> Task:
    """The run's task on its data; where the data is not at the path the run recorded (deleted, or moved), an
    error that names both ways to give it: ``--data`` (moved) or ``zoo-prepare`` (gone)."""
    try:
        return build_task(task_cfg)
    except ConfigError as error:
        if given or error.field != "task.path":
            raise
        moved = "; or, if the run's data moved, give its new place with --data PATH"
        raise ConfigError(error.field, error.value, error.allowed + moved) from None


def check_data(path: str | Path, task: Task, task_cfg: dict[str, Any]) -> None:
    """Refuse data whose sha256 differs from the one the run recorded, naming both (generated data has none)."""
    recorded = (run_record(path).data or {}).get("sha256")
    if recorded is None:
        return
    found = task.info().get("sha256")
    if found != recorded:
        where = task_cfg.get("path") or "the data read"
        raise ConfigError(
            "data.sha256", found, f"the run's recorded {recorded} ({where} differs from the data the run trained "
            "on): give the run's data with --data",
        )  # fmt: skip


def evaluate_run(
    path: str | Path,
    lengths: Sequence[int] | None = None,
    device: str = "cpu",
    batches: int | None = None,
    data: str | None = None,
) -> tuple[dict[str, float | None], dict[str, str], Task]:
    """The run's validation metrics at ``lengths`` (multiples of its trained length; default: the
    run's own ``task.eval_lengths``), computed as training computes them; per-length errors; and the
    task evaluated on (its metric names and lengths, for a table). The data is the run's (recorded
    absolute, or ``data``), checked against its recorded sha256 first."""
    task_cfg = run_task_config(path, data)
    if lengths is not None:
        task_cfg["eval_lengths"] = list(lengths)
    with plugins_named(run_record(path)):
        task = run_task(task_cfg, given=data is not None)
    check_data(path, task, task_cfg)
    model, config = load_run(path, device)
    train = TrainConfig.from_config(config.get("train"))
    if config.get("threads"):
        torch.set_num_threads(config["threads"])
    evaluator = Evaluator(model, task, train.batch_size, batches or train.eval_batches, device=torch.device(device))
    return evaluator.evaluate(), evaluator.eval_errors, task  # as training evaluates, with no optimizer built
