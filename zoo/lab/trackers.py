"""Experiment trackers (``logger=tensorboard|mlflow|wandb``), each through its own library.

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
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from zoo.core.errors import ConfigError

log = logging.getLogger("zoo.lab.trackers")

INSTALL = 'pip install -e ".[trackers]"'
#: logger name -> (the module it needs, the logger's options and their defaults).
LOGGERS: dict[str, tuple[str | None, dict[str, Any]]] = {
    "none": (None, {}),
    "tensorboard": ("tensorboard", {"dir": None}),
    "mlflow": ("mlflow", {"tracking_uri": None, "experiment": None}),
    "wandb": ("wandb", {"mode": "offline", "project": "zoo", "entity": None, "dir": None}),
}
PLOTS = ("curves.png", "final.png")


def check_logger(cfg: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``logger`` section with defaults filled in; a ConfigError for an unknown name or key, or
    for a tracker whose library is not installed."""
    raw = dict(cfg or {"name": "none"})
    name = raw.pop("name", "none")
    if name not in LOGGERS:
        raise ConfigError("logger", name, f"one of {', '.join(LOGGERS)}")
    module, defaults = LOGGERS[name]
    for key in raw:
        if key not in defaults:
            allowed = f"not an option of logger {name!r}; options: {', '.join(defaults) or 'none'}"
            raise ConfigError(f"logger.{key}", raw[key], allowed)
    if module is not None and importlib.util.find_spec(module) is None:
        raise ConfigError("logger", name, f"needs the {module} package: {INSTALL}")
    return {"name": name, **defaults, **raw}


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"block": {"d_model": 64}}`` -> ``{"block.d_model": 64}``; lists and None become strings."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out |= flatten(value, f"{name}.")
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = json.dumps(value)
    return out


def numeric(record: Mapping[str, Any]) -> dict[str, float]:
    """A metrics record's values worth plotting: ``train`` records' loss as ``train_loss``."""
    prefix = "train_" if record.get("kind") == "train" else ""
    out = {}
    for key, value in record.items():
        if key in ("kind", "step") or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        out[f"{prefix}{key}" if key == "loss" else key] = float(value)
    return out


class Tracker:
    """``logger=none``: tracks nothing. Subclasses send to their library."""

    def log(self, record: dict[str, Any]) -> None:
        """One metrics record (as written to metrics.jsonl)."""

    def finish(self, summary: dict[str, Any]) -> None:
        """The run ended: its final metrics and status."""


def hparams(summary: dict[str, Any]) -> dict[str, Any]:
    """A run's hyperparameters: its choices (``choice.attn=gqa``), then its flattened config."""
    choices = {f"choice.{k}": str(v) for k, v in (summary.get("choices") or {}).items()}
    return choices | flatten(summary.get("config") or {})


def finals(summary: dict[str, Any]) -> dict[str, float]:
    values = {f"final/{k}": v for k, v in (summary.get("final") or {}).items() if isinstance(v, (int, float))}
    return values | {"final/steps": summary.get("steps") or 0}


class TensorBoard(Tracker):
    def __init__(self, cfg: dict[str, Any], root: Path, name: str, summary: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.folder = Path(cfg["dir"] or root / "tensorboard") / name
        self.writer = SummaryWriter(str(self.folder))
        self.summary = summary

    def log(self, record: dict[str, Any]) -> None:
        for key, value in numeric(record).items():
            self.writer.add_scalar(key, value, record["step"])

    def finish(self, summary: dict[str, Any]) -> None:
        # HParams: the run's settings beside its final metrics, in this run's own folder (run_name=".").
        self.writer.add_hparams(hparams(summary), finals(summary), run_name=".")
        self.writer.close()


class MLflow(Tracker):
    def __init__(self, cfg: dict[str, Any], root: Path, name: str, summary: dict[str, Any]) -> None:
        import mlflow

        self.client = mlflow.MlflowClient(tracking_uri(cfg, root))
        experiment = experiment_id(self.client, cfg["experiment"] or root.name)
        run_dir = summary.get("run_dir") or name
        # A resumed run continues its MLflow run (found by its folder), as it continues metrics.jsonl.
        found = self.client.search_runs([experiment], filter_string=f"tags.`zoo.run_dir` = '{run_dir}'", max_results=1)
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            run = self.client.create_run(experiment, run_name=name, tags={"zoo.run_dir": run_dir})
            self.run_id = run.info.run_id
            params = hparams(summary)
            from mlflow.entities import Param

            items = [Param(k, str(v)[:6000]) for k, v in params.items()]
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


def tracking_uri(cfg: dict[str, Any], root: Path) -> str:
    """``logger.tracking_uri``, or a file store under ``root``. MLflow 3 keeps its file store in
    "maintenance mode" behind MLFLOW_ALLOW_FILE_STORE; it is what mlflow-skinny can write (a database
    store needs SQLAlchemy), so zoo opts in for file stores."""
    uri = cfg["tracking_uri"] or (Path(root).resolve() / "mlruns").as_uri()
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


class Wandb(Tracker):
    def __init__(self, cfg: dict[str, Any], root: Path, name: str, summary: dict[str, Any]) -> None:
        import wandb

        folder = Path(cfg["dir"] or root)
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=cfg["project"],
            entity=cfg["entity"],
            mode=cfg["mode"],
            dir=str(folder),
            name=name,
            group=root.name,
            config=hparams(summary),
            reinit="create_new",
        )

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(numeric(record), step=record["step"])

    def finish(self, summary: dict[str, Any]) -> None:
        self.run.summary.update(finals(summary) | {"status": summary.get("status")})
        self.run.finish(exit_code=0 if summary.get("status") == "ok" else 1)


TRACKERS: dict[str, type[Tracker]] = {"tensorboard": TensorBoard, "mlflow": MLflow, "wandb": Wandb}


def open_tracker(cfg: dict[str, Any], root: Path, name: str, summary: dict[str, Any]) -> Tracker:
    """The tracker of a checked ``logger`` section for one run; ``root``: the sweep (or run) folder."""
    if cfg["name"] == "none":
        return Tracker()
    return TRACKERS[cfg["name"]](cfg, Path(root), name, summary)


# -- the report's plots, at the end of a sweep ----------------------------------------------------


def log_report(cfg: dict[str, Any], root: Path) -> None:
    """Send the report's plots in ``root`` to the tracker (images in TensorBoard; artifacts of a
    ``report`` run in MLflow; images of a ``report`` run in wandb)."""
    plots = [root / p for p in PLOTS if (root / p).exists()]
    if cfg["name"] == "none" or not plots:
        return
    if cfg["name"] == "tensorboard":
        from matplotlib.image import imread
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(Path(cfg["dir"] or root / "tensorboard") / "report"))
        for plot in plots:
            writer.add_image(f"report/{plot.stem}", imread(plot)[..., :3], dataformats="HWC")
        writer.close()
    elif cfg["name"] == "mlflow":
        import mlflow

        client = mlflow.MlflowClient(tracking_uri(cfg, root))
        run = client.create_run(experiment_id(client, cfg["experiment"] or root.name), run_name="report")
        for plot in [*plots, *(root / f for f in ("report.md", "report.csv") if (root / f).exists())]:
            client.log_artifact(run.info.run_id, str(plot))
        client.set_terminated(run.info.run_id)
    else:
        import wandb

        run = wandb.init(
            project=cfg["project"], entity=cfg["entity"], mode=cfg["mode"], dir=str(Path(cfg["dir"] or root)),
            name="report", group=root.name, job_type="report", reinit="create_new",
        )  # fmt: skip
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
