"""``summary.json``: a run's record (:class:`RunRecord`: status, config, choices, final metrics), written
atomically and read back checked field by field.

Schema: :data:`SCHEMA` is written in the record's ``schema`` field; a summary.json without one is schema 1
(written before the field existed, with the same fields otherwise), and reads the same way. A field this
code does not know (a newer writer's) is kept in :attr:`RunRecord.extra` and written back unchanged. A
summary of a newer schema (written by a newer zoo) reads the same way, each known field checked for its
type, with a warning naming it, once per folder and process: :func:`read_record_checked` decides that for
every reader (the report, zoo-eval, zoo-generate, ``zoo.load_run``, resume, branches).
"""

from __future__ import annotations

import json
import logging
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from zoo.lab.files import write_json_atomic
from zoo.lab.records.settings import config_value

SUMMARY = "summary.json"

log = logging.getLogger("zoo.lab.records.summary")

#: The layout version a run writes in its summary's ``schema`` field (none: schema 1).
SCHEMA = 3


@dataclass
class RunRecord:
    """A run's ``summary.json``, one field per key, in the order written. None: not recorded (left out of
    the JSON), but for ``error`` (null: no error, always written) and ``reason`` (null: did not diverge,
    written with the loop's result, ``steps``). The nested sections (config, metric, final, data, ...) are
    the JSON objects as written: ``config`` is the resolved config the config hash is of."""

    status: str = "running"  # running | ok | diverged | incompatible | failed (locked, refused: never written)
    error: str | None = None
    run_dir: str | None = None
    choices: dict[str, Any] | None = None  # the group choices (attn=gqa, ...)
    overrides: list[str] | None = None  # the command line's key=value overrides
    started: str | None = None  # ISO time, UTC
    versions: dict[str, Any] | None = None  # python, torch, zoo, hydra, platform, plugins (zoo.parts providers), cpu
    job: int | None = None  # Hydra's job number in a sweep
    tune: dict[str, Any] | None = None  # tune.lr's choice: lr, metric, mode, searched, seeds
    config: dict[str, Any] | None = None  # the resolved config
    config_hash: str | None = None
    unused_axes: list[str] | None = None
    branch: dict[str, Any] | None = None  # train.branch: from, config_hash, step, checksum
    budget: dict[str, Any] | None = None  # train.budget: kind, value, steps
    parameters: dict[str, Any] | None = None  # by component, and the total
    active_parameters: float | None = None
    flops_per_token: float | None = None
    data: dict[str, Any] | None = None  # the task's data: source, sizes, sha256, paths, tokenizer
    device: str | None = None
    threads: int | None = None
    world_size: int | None = None
    metric: dict[str, Any] | None = None  # the headline: name, mode (min or max), value
    resume_skipped: dict[str, Any] | None = None  # checkpoint -> why it failed its check
    resumed_from: list[int] | None = None  # the steps the run resumed from
    steps: int | None = None
    tokens: int | None = None
    train_time_s: float | None = None
    tokens_per_s: float | None = None
    load: dict[str, Any] | None = None  # load average at the loop's start and end; the process's and machine's cores
    final: dict[str, Any] | None = None  # train loss and every validation metric (numbers or null)
    reason: str | None = None  # why it diverged
    initial: dict[str, Any] | None = None  # validation of the initial weights
    spikes: dict[str, Any] | None = None  # count, steps
    flops: float | None = None  # training FLOPs spent
    flops_per_second: float | None = None  # model FLOPs per second over the steady steps (no warm-up, no evaluation)
    mfu: float | None = None  # flops_per_second over the devices' dense bf16 peak (null on a CPU: mfu_reason)
    mfu_peak: dict[str, Any] | None = None  # the peak used: device, flops_per_second (per device)
    mfu_reason: str | None = None  # why mfu is null
    ranks_in_sync: bool | None = None
    parallel: dict[str, Any] | None = None  # dp_replicate, dp_shard, tp
    peak_memory_mib: float | None = None
    kind: str | None = None  # of peak memory: cuda_allocated | process_rss
    eval_errors: dict[str, Any] | None = None
    routing: dict[str, Any] | None = None  # fraction of routed tokens per expert, per routing part
    traceback: str | None = None
    wall_time_s: float | None = None
    finished: str | None = None
    schema: int = SCHEMA  # the layout it was read in (1: no schema field); written: this code's, or a newer one
    extra: dict[str, Any] = field(default_factory=dict)  # fields this code does not know, kept as read

    @classmethod
    def from_json(cls, data: Any) -> RunRecord:
        """The record of a parsed summary.json (schema 1 or later); a :class:`RecordError` naming the field
        that does not have its type."""
        problem = record_problem(data)
        if problem is not None:
            raise RecordError(problem)
        known = {k: v for k, v in data.items() if k in KINDS}
        return cls(**known, schema=data.get("schema", 1), extra={k: v for k, v in data.items() if k not in FIELDS})

    def to_json(self) -> dict[str, Any]:
        """The JSON object written: ``schema`` first, then each field recorded, then the unknown ones."""
        out: dict[str, Any] = {"schema": max(self.schema, SCHEMA)}
        for name in KINDS:
            value = getattr(self, name)
            if value is not None or name == "error" or (name == "reason" and self.steps is not None) or (
                name == "mfu" and self.mfu_reason is not None
            ):
                out[name] = value
        return out | {k: v for k, v in self.extra.items() if k not in out}

    def value(self, key: str) -> Any:
        """The value of the field named ``key``, a known one or one kept in :attr:`extra` (None: not recorded)."""
        return getattr(self, key) if key in KINDS else self.extra.get(key)

    def final_value(self, name: str) -> Any:
        """The final value of metric ``name`` as recorded (None: not recorded, or not finite)."""
        return (self.final or {}).get(name)

    def config_value(self, key: str) -> Any:
        """The config's value at the dotted ``key`` (``train.steps``); None when it has none."""
        return config_value(self.config, key)


class RecordError(ValueError):
    """A summary.json whose fields do not have their types: the message names the field."""


#: Field name -> (its JSON type, the type of a list's items or None), from :class:`RunRecord`'s annotations.
KINDS: dict[str, tuple[type, type | None]] = {}
#: Every key of a record's JSON object that is one of its fields.
FIELDS = {f.name for f in fields(RunRecord) if f.name != "extra"}


def field_kinds() -> dict[str, tuple[type, type | None]]:
    """Each written field's JSON type, read off its annotation (``dict[str, Any] | None`` -> dict)."""
    hints = typing.get_type_hints(RunRecord)
    kinds = {}
    for f in fields(RunRecord):
        if f.name in ("schema", "extra"):
            continue
        hint = next(a for a in typing.get_args(hints[f.name]) or (hints[f.name],) if a is not type(None))
        items = typing.get_args(hint)
        kinds[f.name] = (typing.get_origin(hint) or hint, items[0] if typing.get_origin(hint) is list else None)
    return kinds


KINDS.update(field_kinds())

#: How a problem names each JSON type.
KIND_NAMES = {dict: "a JSON object", list: "a list", str: "a string", int: "an integer", float: "a number",
              bool: "true or false"}  # fmt: skip


def has_kind(value: Any, kind: type) -> bool:
    """Whether a JSON value is of ``kind``: numbers are ints or floats, never booleans."""
    if kind in (int, float):
        return isinstance(value, int if kind is int else (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


def record_problem(data: Any) -> str | None:
    """Why ``data`` (a parsed summary.json) is not a run's record, or None when its fields have their types."""
    if not isinstance(data, dict):
        return f"not a JSON object (a {type(data).__name__})"
    if not isinstance(data.get("status"), str):
        return f"status={data.get('status')!r}: not a string"
    if "schema" in data and not has_kind(data["schema"], int):
        return f"schema={data['schema']!r}: not an integer"
    for key, (kind, items) in KINDS.items():
        value = data.get(key)
        if value is None:
            continue
        if not has_kind(value, kind):
            return f"{key}: a {type(value).__name__}, not {KIND_NAMES[kind]}"
        if items is not None and not all(has_kind(item, items) for item in value):
            return f"{key}: not a list of {KIND_NAMES[items].split(' ', 1)[1]}s"
    final = data.get("final") or {}
    bad = next((k for k, v in final.items() if v is not None and not isinstance(v, (int, float))), None)
    if bad is not None:
        return f"final.{bad}={final[bad]!r}: not a number"
    if not isinstance((data.get("metric") or {}).get("name", ""), str):
        return "metric.name: not a string"
    return None


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's summary.json as parsed, unchecked, or None when there is none (:func:`read_record` reads it
    as a record)."""
    try:
        return json.loads((run_dir / SUMMARY).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def read_record_checked(run_dir: Path) -> tuple[RunRecord | None, str | None]:
    """``(record, None)``, or ``(None, why it cannot be read)``: missing, unreadable, not JSON, or a field not
    of its type (:func:`record_problem`)."""
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
    try:
        record = RunRecord.from_json(data)
    except RecordError as error:
        return None, f"{SUMMARY}: {error}"
    if record.schema > SCHEMA:
        warn_newer(run_dir, record.schema)
    return record, None


#: The run folders whose summary.json was found written by a newer zoo (each warned of once a process).
NEWER: set[Path] = set()


def warn_newer(run_dir: Path, schema: int) -> None:
    """Warn, once a process for ``run_dir``, that its summary.json has a newer layout than this zoo writes."""
    where = Path(run_dir).resolve()
    if where in NEWER:
        return
    NEWER.add(where)
    log.warning(
        "%s: schema %d, written by a newer zoo (this one writes schema %d): read with the fields this zoo knows, "
        "the others kept as they are; upgrade zoo to read it as it was written", Path(run_dir) / SUMMARY, schema,
        SCHEMA,
    )  # fmt: skip


def read_record(run_dir: Path) -> RunRecord | None:
    """The run's record, or None when it has none that reads (never started, killed before the first write,
    or not a record: :func:`read_record_checked` says why)."""
    return read_record_checked(run_dir)[0]


def write_record(run_dir: Path, record: RunRecord) -> None:
    """Write ``record`` as ``run_dir/summary.json``, atomically (NaN and infinities as null)."""
    write_json_atomic(run_dir / SUMMARY, record.to_json())
