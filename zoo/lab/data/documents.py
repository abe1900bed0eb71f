"""Documents from local files, by format: plain text, JSONL, Parquet and a saved ``datasets`` folder, each
record's text field checked (a lone surrogate or a missing field is named with its file and line)."""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zoo.core.errors import ConfigError, install_extra
from zoo.lab.data.sources import walk

#: A UTF-16 surrogate: JSON's ``\ud800``-``\udfff`` escapes decode to one when not paired, and UTF-8 has none.
SURROGATE = re.compile("[\ud800-\udfff]")


def is_dataset_folder(path: Path) -> bool:
    """A folder written by Hugging Face ``datasets``' ``save_to_disk`` (a Dataset or a DatasetDict)."""
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    )


def source_files(inputs: Sequence[str], pattern: str) -> list[Path]:
    """The input sources: each file given, each ``datasets`` folder whole, and each other folder's files
    matching ``pattern`` (sorted)."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_file() or (path.is_dir() and is_dataset_folder(path)):
            files.append(path)
        elif path.is_dir():
            files += [path / rel for rel in sorted(walk(path, pattern))]
        else:
            raise ConfigError("INPUT", item, "no such file or folder; give text, .jsonl or .parquet files or folders")
    return files


def optional(module: str, extra: str, what: str) -> Any:
    """``module`` imported, or a ConfigError saying which extra to install for ``what``."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError("INPUT", what, f"the {module} library: {install_extra(extra)}") from None


def text_column(values: Sequence[Any], source: str, field: str) -> list[str]:
    """A column's strings as documents (empty ones dropped); a non-string is a ConfigError naming the row."""
    for row, value in enumerate(values):
        if not isinstance(value, str):
            shown = value if len(repr(value)) <= 40 else repr(value)[:40] + "..."
            raise ConfigError(f"{source}: row {row} {field!r}", shown, "a string (--text-field)")
    return [v for v in values if v]


def read_parquet(path: Path, field: str) -> list[str]:
    """A Parquet file's ``field`` column (pyarrow)."""
    parquet = optional("pyarrow.parquet", "parquet", str(path))
    names = parquet.ParquetFile(path).schema_arrow.names
    if field not in names:
        raise ConfigError(f"{path}: --text-field", field, f"one of its columns: {', '.join(names)}")
    return text_column(parquet.read_table(path, columns=[field]).column(field).to_pylist(), str(path), field)


def read_dataset(path: Path, field: str) -> list[str]:
    """A ``save_to_disk`` folder's ``field`` column, read offline; a DatasetDict's splits one after the other
    (in ``dataset_dict.json``'s order)."""
    datasets = optional("datasets", "datasets", str(path))
    loaded = datasets.load_from_disk(str(path))
    parts = [(str(path), loaded)] if isinstance(loaded, datasets.Dataset) else list(loaded.items())
    docs: list[str] = []
    for name, part in parts:
        if field not in part.column_names:
            columns = ", ".join(part.column_names)
            raise ConfigError(f"{path} ({name}): --text-field", field, f"one of its columns: {columns}")
        docs += text_column(list(part[field]), f"{path} ({name})", field)
    return docs


def lone_surrogate(path: Path, n: int, field: str, value: str) -> ConfigError | None:
    """The error for a ``field`` string holding a lone surrogate (``"\\ud800"`` in the JSON), which is no
    Unicode text: UTF-8 cannot encode it. None for valid text."""
    found = SURROGATE.search(value)
    if found is None:
        return None
    at = found.start()
    return ConfigError(
        f"{path}:{n}",
        value[max(0, at - 20) : at + 20],
        f"not valid Unicode: a lone surrogate \\u{ord(found.group()):04x} (character {at} of {field!r}); allowed: "
        "any Unicode text, a \\ud800-\\udbff escape only as a surrogate pair's first half, a \\udc00-\\udfff next",
    )


def read_jsonl(path: Path, text: str, field: str) -> list[str]:
    """The ``field`` strings of a JSONL file's lines; a line that is no JSON object with a ``field`` string
    of valid Unicode is a ConfigError naming the file and the line."""
    docs = []
    for n, line in enumerate(text.split("\n"), 1):  # not splitlines: JSON strings may hold \u2028, \x85
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise ConfigError(f"{path}:{n}", line[:40], f"a JSON object with a {field!r} string") from None
        if not isinstance(record, dict) or not isinstance(record.get(field), str):
            raise ConfigError(f"{path}:{n}", line[:40], f"a JSON object with a {field!r} string")
        if "\\u" in line and (error := lone_surrogate(path, n, field, record[field])):  # only escapes make them
            raise error
        docs.append(record[field])
    return docs


def read_documents(path: Path, field: str = "text", strict: bool = True) -> list[str] | None:
    """A text file as one document; the ``field`` strings of a ``.jsonl`` or ``.parquet`` file or a
    ``datasets`` folder; binaries (NUL bytes) as none; a file that is not UTF-8 is an error (``strict``:
    a file named as INPUT), else None (a folder's file, skipped)."""
    if path.is_dir():
        return read_dataset(path, field)
    if path.suffix == ".parquet":
        return read_parquet(path, field)
    raw = path.read_bytes()
    if b"\0" in raw:
        return []
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if not strict:
            return None
        raise ConfigError("INPUT", str(path), f"UTF-8 text ({e})") from None
    if path.suffix != ".jsonl":
        return [text] if text else []
    return read_jsonl(path, text, field)
