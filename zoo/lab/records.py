"""What a run leaves on disk: ``metrics.jsonl`` (appended as it trains) and ``summary.json``.

``summary.json`` is written atomically (:func:`write_atomic`: a temp file in the same folder, fsynced,
then ``os.replace``), so a reader (the report, a resumed sweep) sees either the old summary or the new
one, never half. Every file zoo writes whole goes through :func:`write_atomic`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

SUMMARY = "summary.json"
METRICS = "metrics.jsonl"

#: Keys of the run config that change how fast a run goes or what it leaves on disk (or how the report reads
#: it), not what it computes.
RUNTIME_KEYS = ("threads", "progress", "logger", "report", "tune", "compile", "parallel")
#: The same inside the ``train`` section (saving, checkpointing and probing never change a number: a run with
#: ``probe_every`` set is the same experiment, its checkpoints resume either way, and a finished run is done).
RUNTIME_TRAIN_KEYS = ("save", "checkpoint_every", "keep_checkpoints", "activation_checkpointing", "probe_every")
#: ``train`` keys added after runs were recorded, left out of the hash at the value that changes nothing
#: (so an older run folder of the same config is still skipped as done, and its checkpoints resume).
NEUTRAL_TRAIN_KEYS: dict[str, Any] = {"z_loss": 0.0, "branch": {"from": None, "step": None}}
#: Sections added likewise, left out when they equal the default (zoo.lab.recipe.is_default).
RECIPE_KEYS = ("optim", "schedule")
#: ``param`` (zoo.lab.param), left out likewise at ``param=standard``.
PARAM_KEY = "param"


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` whole or not at all: a temp file beside it, fsynced, renamed over
    ``path``, then the folder fsynced (the rename survives a crash). A kill leaves ``.<name>.<random>.tmp``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 is for the temp file, not what it becomes
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Make the renames inside ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` (:func:`write_atomic`)."""
    write_atomic(path, json.dumps(clean(data), indent=2, sort_keys=False) + "\n")


def clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become None (JSON has no NaN), containers recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's summary, or None when there is none (never started, or killed before the first write)."""
    try:
        return json.loads((run_dir / SUMMARY).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


#: The JSON type of each summary field a reader relies on (when present and not null).
SUMMARY_FIELDS = {"status": str, "overrides": list, "choices": dict, "config": dict, "parameters": dict,
                  "metric": dict, "final": dict, "tune": dict, "budget": dict, "resumed_from": list}  # fmt: skip


def summary_problem(data: Any) -> str | None:
    """Why ``data`` (a parsed summary.json) is not a run's summary, or None when its fields have their types."""
    if not isinstance(data, dict):
        return f"not a JSON object (a {type(data).__name__})"
    if not isinstance(data.get("status"), str):
        return f"status={data.get('status')!r}: not a string"
    for key, kind in SUMMARY_FIELDS.items():
        if data.get(key) is not None and not isinstance(data[key], kind):
            return f"{key}: a {type(data[key]).__name__}, not a {'JSON object' if kind is dict else 'list'}"
    if not all(isinstance(o, str) for o in data.get("overrides") or []):
        return "overrides: not a list of strings"
    final = data.get("final") or {}
    bad = next((k for k, v in final.items() if v is not None and not isinstance(v, (int, float))), None)
    if bad is not None:
        return f"final.{bad}={final[bad]!r}: not a number"
    if not isinstance((data.get("metric") or {}).get("name", ""), str):
        return "metric.name: not a string"
    return None


def read_summary_checked(run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(summary, None)``, or ``(None, why it cannot be read)``: missing, unreadable, not JSON, or not shaped
    like a summary (:func:`summary_problem`)."""
    try:
        data = json.loads((run_dir / SUMMARY).read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return None, f"no {SUMMARY}"
    except UnicodeDecodeError:
        return None, f"{SUMMARY} is not UTF-8 text"
    except json.JSONDecodeError as error:
        what = error.msg.removesuffix(" at")  # "Unterminated string starting at": the position follows
        return None, f"{SUMMARY} is not valid JSON ({what} at line {error.lineno} column {error.colno})"
    except OSError as error:
        return None, f"{SUMMARY} cannot be read ({error.strerror or error})"
    problem = summary_problem(data)
    return (None, f"{SUMMARY}: {problem}") if problem else (data, None)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of ``metrics.jsonl``; a line cut short by a kill is skipped."""
    records = []
    try:
        lines = (run_dir / METRICS).read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def semantic_config(config: dict[str, Any], *, branch_path: bool = False) -> dict[str, Any]:
    """What a run computes: its resolved config less the runtime-only keys, and less the keys added since
    at their neutral values (:data:`NEUTRAL_TRAIN_KEYS`, the default recipe, ``param=standard``).

    A branch's source is not named by its path (``train.branch.from``, left out): the branch records the
    source's config hash, step and checkpoint checksum instead (zoo.lab.branch), so a source and its branches
    moved together are the same runs. ``branch_path``: keep the path, as hashes recorded before did."""
    from zoo.lab import param
    from zoo.lab.recipe import is_default

    semantic = {k: v for k, v in config.items() if k not in RUNTIME_KEYS}
    for key in RECIPE_KEYS:
        if key in semantic and is_default(key, semantic[key]):
            del semantic[key]
    if PARAM_KEY in semantic and param.is_default(semantic[PARAM_KEY]):
        del semantic[PARAM_KEY]
    branch = (semantic.get("train") or {}).get("branch") if isinstance(semantic.get("train"), dict) else None
    if isinstance(branch, dict) and not branch_path:
        semantic["train"] = {**semantic["train"], "branch": {**branch, "from": None}}
    if isinstance(semantic.get("train"), dict):
        semantic["train"] = {
            k: v
            for k, v in semantic["train"].items()
            if k not in RUNTIME_TRAIN_KEYS and not (k in NEUTRAL_TRAIN_KEYS and v == NEUTRAL_TRAIN_KEYS[k])
        }
    return semantic


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 0.1}}`` -> ``{"train.lr": 0.1}`` (lists are values)."""
    if not isinstance(node, Mapping):
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def config_differences(theirs: dict[str, Any], mine: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The dotted keys where two run configs compute differently (:func:`semantic_config`), each with
    (theirs, mine); ``"unset"`` for a key one of them does not have."""
    a, b = flatten(semantic_config(theirs)), flatten(semantic_config(mine))
    keys = sorted(set(a) | set(b))
    return {k: (a.get(k, "unset"), b.get(k, "unset")) for k in keys if a.get(k, "unset") != b.get(k, "unset")}


def differences_text(differ: Mapping[str, tuple[Any, Any]], most: int) -> str:
    """``train.lr: 0.003 there, 0.01 here; ...``: the first ``most`` of :func:`config_differences`."""
    shown = "; ".join(f"{k}: {theirs!r} there, {mine!r} here" for k, (theirs, mine) in list(differ.items())[:most])
    return shown + (f" and {len(differ) - most} more" if len(differ) > most else "")


def config_hash(config: dict[str, Any], *, branch_path: bool = False) -> str:
    """A short hash of what a run computes (:func:`semantic_config`; ``branch_path``: as recorded before
    branches were named by their source's identity)."""
    text = json.dumps(clean(semantic_config(config, branch_path=branch_path)), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def keep_metrics_until(run_dir: Path, step: int) -> None:
    """Rewrite ``metrics.jsonl`` (atomically) with only its records up to ``step``: a run resumed from
    the checkpoint after ``step`` continues the curve from there (lines cut short by a kill are dropped)."""
    kept = [r for r in read_metrics(run_dir) if r.get("step", 0) <= step]
    write_atomic(run_dir / METRICS, "".join(json.dumps(r) + "\n" for r in kept))


class MetricsLog:
    """Appends one JSON object per line to ``metrics.jsonl``, flushed per record.

    Opened with "w": a re-run starts its curve afresh; ``append`` continues it (a resumed run,
    after :func:`keep_metrics_until`). ``None`` as the path writes nothing (ranks other than 0 under DDP).
    """

    def __init__(self, path: Path | None, append: bool = False) -> None:
        self._file: IO[str] | None = open(path, "a" if append else "w") if path is not None else None  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(clean(record)) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
