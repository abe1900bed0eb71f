"""``summary.json``: a run's record (status, config, choices, final metrics), written atomically and read
back checked field by field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUMMARY = "summary.json"


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
