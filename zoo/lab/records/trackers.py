"""Experiment trackers (``logger=tensorboard|mlflow|wandb``), each through its own library.

A tracker is one class registered in :data:`TRACKERS` (its options: the keyword-only arguments of
its constructor, checked like a part's; its run-level logging and its report-level logging:
methods) and one option file ``conf/logger/<name>.yaml``. A plugin registers one the same way,
from a module of the ``zoo.parts`` entry-point group.

A run sends its tracker every metrics record (the ``train`` and ``val`` lines of metrics.jsonl, at
their step), its choices and flattened config as hyperparameters (TensorBoard's HParams, MLflow
params, wandb config) and, when it ends, its final metrics (``final/<name>``) and status. At the end
of a sweep, the report's plots go to the tracker as images or artifacts (:class:`TrackerCallback`).

Everything stays on this machine by default, under the sweep folder (a single run's own folder):
TensorBoard event files in ``tensorboard/<run>``, an MLflow file store in ``mlruns/`` (experiment:
the sweep folder's name), wandb offline runs in ``wandb/``. Only rank 0 tracks. A tracker whose
library is missing is a ConfigError naming the extra to install, raised before any training.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from zoo.core.errors import ConfigError
from zoo.core.options import resolve_options
from zoo.core.registry import Registry
from zoo.lab.records.config import flatten
from zoo.lab.records.report_files import PLOTS

log = logging.getLogger("zoo.lab.records.trackers")

INSTALL = 'pip install -e ".[trackers]"'

#: Trackers by name (``logger=<name>``): the same registry (names, did-you-mean errors, ``zoo-parts``
#: listing, plugins) and option checking as the block's parts.
TRACKERS = Registry("logger", where="logger")


class Tracker:
    """Tracks nothing. A subclass sends to its library: it takes its options as keyword-only
    constructor arguments after ``root`` (the sweep folder, or a single run's own) and overrides
    what it tracks; :attr:`library` names the module it needs (checked before any training).
    ``Tracker()``: tracks nothing, for the ranks that do not track."""

    #: The module the tracker's library provides; None: nothing to install.
    library: ClassVar[str | None] = None

    def __init__(self, root: Path | str = ".") -> None:
        self.root = Path(root)

    def start(self, name: str, summary: dict[str, Any]) -> None:
        """A run called ``name`` begins (``summary``: its choices, config and run folder)."""

    def log(self, record: dict[str, Any]) -> None:
        """One metrics record (as written to metrics.jsonl)."""

    def finish(self, summary: dict[str, Any]) -> None:
        """The run ended: its final metrics and status."""

    def log_report(self, plots: list[Path]) -> None:
        """The sweep ended: its report's plots (and report.md, report.csv beside them in :attr:`root`)."""


TRACKERS.register("none")(Tracker)


def check_logger(cfg: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``logger`` section with defaults filled in; a ConfigError for an unknown name, key or type,
    or for a tracker whose library is not installed."""
    raw = dict(cfg or {"name": "none"})
    name = raw.pop("name", "none")
    tracker = TRACKERS.get(name)
    options = resolve_options(tracker, raw, "logger")
    library = tracker.cls.library
    if library is not None and importlib.util.find_spec(library) is None:
        raise ConfigError("logger", name, f"needs the {library} package: {INSTALL}")
    return {"name": name, **options}


def build_tracker(cfg: dict[str, Any], root: Path) -> Tracker:
    """The tracker a checked ``logger`` section names, with its options, for the folder ``root``."""
    options = {k: v for k, v in cfg.items() if k != "name"}
    return TRACKERS.get(cfg["name"]).cls(Path(root), **options)


def open_tracker(cfg: dict[str, Any], root: Path, name: str, summary: dict[str, Any]) -> Tracker:
    """The tracker of a checked ``logger`` section for one run; ``root``: the sweep (or run) folder."""
    tracker = build_tracker(cfg, root)
    tracker.start(name, summary)
    return tracker


def log_report(cfg: dict[str, Any], root: Path) -> None:
    """Send the report's plots in ``root`` (if any) to the tracker of a checked ``logger`` section."""
    plots = [Path(root) / p for p in PLOTS if (Path(root) / p).exists()]
    if plots:
        build_tracker(cfg, root).log_report(plots)


def plain_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """``{"block": {"d_model": 64}}`` -> ``{"block.d_model": 64}`` (:func:`zoo.lab.records.config.flatten`), with
    what a tracker's parameters cannot hold (lists, None, an empty section) as JSON text."""
    plain = (bool, int, float, str)
    return {key: value if isinstance(value, plain) else json.dumps(value) for key, value in flatten(config).items()}


def numeric(record: Mapping[str, Any]) -> dict[str, float]:
    """A metrics record's values worth plotting: ``train`` records' loss as ``train_loss``; a ``probe``
    record's every number under ``probe/``, lists by index and mappings by key (``probe/attn_logit_max/0``,
    ``probe/grad_norm/total``; zoo.lab.training.probes), its None values (a layer without logits) left out."""
    if record.get("kind") == "probe":
        return {f"probe/{k}": v for k, v in flat_numbers(record).items() if k not in ("step", "tokens")}
    prefix = "train_" if record.get("kind") == "train" else ""
    out = {}
    for key, value in record.items():
        if key in ("kind", "step") or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        out[f"{prefix}{key}" if key == "loss" else key] = float(value)
    return out


def flat_numbers(value: Any, prefix: str = "") -> dict[str, float]:
    """Every number in nested lists and mappings, by ``/``-joined path."""
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return {prefix: float(value)} if ok else {}
    return {
        k: v for key, item in items for k, v in flat_numbers(item, f"{prefix}/{key}" if prefix else str(key)).items()
    }


def hparams(summary: dict[str, Any]) -> dict[str, Any]:
    """A run's hyperparameters: its choices (``choice.attn=gqa``), then its flattened config."""
    choices = {f"choice.{k}": str(v) for k, v in (summary.get("choices") or {}).items()}
    return choices | plain_params(summary.get("config") or {})


def finals(summary: dict[str, Any]) -> dict[str, float]:
    values = {f"final/{k}": v for k, v in (summary.get("final") or {}).items() if isinstance(v, (int, float))}
    return values | {"final/steps": summary.get("steps") or 0}


@TRACKERS.register("tensorboard")
class TensorBoard(Tracker):
    """TensorBoard: scalars, HParams and the report's plots as images, in event files."""

    library = "tensorboard"

    def __init__(self, root: Path, *, dir: str | None = None) -> None:
        super().__init__(root)
        self.folder = Path(dir or self.root / "tensorboard")

    def start(self, name: str, summary: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(self.folder / name))

    def log(self, record: dict[str, Any]) -> None:
        for key, value in numeric(record).items():
            self.writer.add_scalar(key, value, record["step"])

    def finish(self, summary: dict[str, Any]) -> None:
        # HParams: the run's settings beside its final metrics, in this run's own folder (run_name=".").
        self.writer.add_hparams(hparams(summary), finals(summary), run_name=".")
        self.writer.close()

    def log_report(self, plots: list[Path]) -> None:
        """Images of a ``report`` run."""
        from matplotlib.image import imread
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(self.folder / "report"))
        for plot in plots:
            writer.add_image(f"report/{plot.stem}", imread(plot)[..., :3], dataformats="HWC")
        writer.close()


@TRACKERS.register("mlflow")
class MLflow(Tracker):
    """MLflow: params, metric histories and the report as artifacts, in a file store unless told."""

    library = "mlflow"

    def __init__(self, root: Path, *, tracking_uri: str | None = None, experiment: str | None = None) -> None:
        import mlflow

        super().__init__(root)
        self.client = mlflow.MlflowClient(file_store(tracking_uri, self.root))
        self.experiment = experiment_id(self.client, experiment or self.root.name)

    def start(self, name: str, summary: dict[str, Any]) -> None:
        run_dir = summary.get("run_dir") or name
        # A resumed run continues its MLflow run (found by its folder), as it continues metrics.jsonl.
        found = self.client.search_runs(
            [self.experiment], filter_string=f"tags.`zoo.run_dir` = '{run_dir}'", max_results=1
        )
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        self.run_id = self.client.create_run(self.experiment, run_name=name, tags={"zoo.run_dir": run_dir}).info.run_id
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in hparams(summary).items()]
        for start in range(0, len(items), 100):  # the API's batch limit
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def log(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        stamp = 0
        metrics = [Metric(k, v, stamp, record["step"]) for k, v in numeric(record).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, summary: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(k, float(v), 0, summary.get("steps") or 0) for k, v in finals(summary).items()]
        self.client.log_batch(self.run_id, metrics=metrics)
        self.client.set_tag(self.run_id, "zoo.status", summary.get("status"))
        self.client.set_terminated(self.run_id, "FINISHED" if summary.get("status") == "ok" else "FAILED")

    def log_report(self, plots: list[Path]) -> None:
        """Artifacts of a ``report`` run: the plots, report.md and report.csv."""
        run = self.client.create_run(self.experiment, run_name="report")
        tables = [self.root / f for f in ("report.md", "report.csv") if (self.root / f).exists()]
        for path in [*plots, *tables]:
            self.client.log_artifact(run.info.run_id, str(path))
        self.client.set_terminated(run.info.run_id)


def file_store(uri: str | None, root: Path) -> str:
    """``logger.tracking_uri``, or a file store under ``root``. MLflow 3 keeps its file store in
    "maintenance mode" behind MLFLOW_ALLOW_FILE_STORE; it is what mlflow-skinny can write (a database
    store needs SQLAlchemy), so zoo opts in for file stores."""
    uri = uri or (Path(root).resolve() / "mlruns").as_uri()
    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return uri


def experiment_id(client: Any, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:  # another job of the sweep created it first
        return client.get_experiment_by_name(name).experiment_id


@TRACKERS.register("wandb")
class Wandb(Tracker):
    """Weights & Biases: history, config, summary and the report's plots, offline unless told."""

    library = "wandb"

    def __init__(
        self,
        root: Path,
        *,
        mode: str = "offline",
        project: str = "zoo",
        entity: str | None = None,
        dir: str | None = None,
    ) -> None:
        super().__init__(root)
        self.mode, self.project, self.entity = mode, project, entity
        self.folder = Path(dir or self.root)

    def init(self, name: str, **kwargs: Any) -> Any:
        """A wandb run called ``name`` of this sweep (its group: the sweep folder's name)."""
        import wandb

        self.folder.mkdir(parents=True, exist_ok=True)
        return wandb.init(
            project=self.project, entity=self.entity, mode=self.mode, dir=str(self.folder), name=name,
            group=self.root.name, reinit="create_new", **kwargs,
        )  # fmt: skip

    def start(self, name: str, summary: dict[str, Any]) -> None:
        self.run = self.init(name, config=hparams(summary))

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(numeric(record), step=record["step"])

    def finish(self, summary: dict[str, Any]) -> None:
        self.run.summary.update(finals(summary) | {"status": summary.get("status")})
        self.run.finish(exit_code=0 if summary.get("status") == "ok" else 1)

    def log_report(self, plots: list[Path]) -> None:
        """Images of a ``report`` run."""
        import wandb

        run = self.init("report", job_type="report")
        run.log({f"report/{p.stem}": wandb.Image(str(p)) for p in plots})
        run.finish()


class TrackerCallback(Callback):
    """Hydra callback: after the report (configured before it), send its plots to the sweep's tracker."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        section = OmegaConf.to_container(config.get("logger") or {"name": "none"}, resolve=True)
        try:
            cfg = check_logger(section)  # type: ignore[arg-type]
            log_report(cfg, Path(config.hydra.sweep.dir))
        except Exception as error:  # noqa: BLE001 (a tracker problem never fails a finished sweep)
            log.warning("logging the report's plots to %s failed: %s", section.get("name"), error)  # type: ignore[union-attr]
