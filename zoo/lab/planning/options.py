"""The sections that steer a sweep rather than a run, checked: ``report`` (baseline, correction, test,
interaction: against the swept axes by :func:`check_interaction`), ``tune`` (the learning rates and seeds a
tuning sweep tries) and ``ladder`` (its budgets).
"""

from __future__ import annotations

import math
from typing import Any

from zoo.core.errors import ConfigError
from zoo.lab.keys import ELSEWHERE

#: Where a sweep's tuning runs go, beside its runs: ``<sweep dir>/tune/``.
TUNE_DIR = "tune"

#: The ``report`` section's keys (``target``, ``margin``, ``target_ema``: :func:`target_options`).
REPORT_KEYS = ("baseline", "correction", "test", "interaction", "gates", "target", "margin", "target_ema")


def unknown_key(section: str, key: str, value: Any, allowed: tuple[str, ...]) -> ConfigError:
    """``<section>.<key>=<value>: unknown key; allowed: ...`` (and where its setting is, for a key looked for
    under another name: :data:`zoo.lab.keys.ELSEWHERE`)."""
    where = ELSEWHERE.get(f"{section}.{key}")
    hint = f"{where}; " if where else ""
    return ConfigError(f"{section}.{key}", value, f"unknown key; {hint}allowed: {', '.join(allowed)}")


def report_options(raw: Any) -> tuple[dict[str, str] | None, str, str]:
    """The ``report`` section (``baseline``, ``correction``, ``test``) checked:
    ``({axis: value} or None, correction, test)``.

    ``baseline`` is a mapping (``{mlp: gelu}``) or a string ``"mlp=gelu,pos=none"``; null: the first
    value of each swept axis. ``test`` is one of :data:`zoo.lab.planning.options.TESTS` (null: auto).
    """
    raw = dict(raw or {})
    for key in raw:
        if key not in REPORT_KEYS:
            raise unknown_key("report", key, raw[key], REPORT_KEYS)
    correction = str(raw.get("correction") or "none")
    if correction not in CORRECTIONS:
        raise ConfigError("report.correction", correction, " or ".join(CORRECTIONS))
    test = raw.get("test") or "auto"
    if test not in TESTS:
        raise ConfigError("report.test", test, f"one of {', '.join(TESTS)} (auto: permutation for a bounded metric)")
    target_options(raw)
    return report_baseline(raw.get("baseline")), correction, str(test)


def target_options(raw: Any) -> dict[str, float] | None:
    """``report.target`` (a value of the report's metric), ``report.margin`` (at least 0; default 0) and
    ``report.target_ema`` (in [0, 1); default 0: no smoothing) checked: None without a target."""
    raw = dict(raw or {})
    target, margin, ema = raw.get("target"), raw.get("margin"), raw.get("target_ema")
    for key, value, ok, allowed in (
        ("target", target, lambda v: True, "a value of the report's metric, e.g. 3.28 (null: no target)"),
        ("margin", margin, lambda v: v >= 0, "a number at least 0 (null: 0)"),
        ("target_ema", ema, lambda v: 0 <= v < 1, "a number in [0, 1): the EMA's weight on the past (null: 0)"),
    ):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
            raise ConfigError(f"report.{key}", value, allowed)
    if target is None:
        return None
    return {"target": float(target), "margin": float(margin or 0), "target_ema": float(ema or 0)}


def report_baseline(baseline: Any) -> dict[str, str] | None:
    """``report.baseline`` checked: ``{axis: value}``, or None for the first value of each swept axis (the first
    variant of a sweep of named variants); a name alone (``rope``) is the named variant ``{variant: rope}``."""
    if baseline is None or baseline == {}:
        return None
    if isinstance(baseline, str) and "=" not in baseline:
        return {"variant": baseline}  # a named variant (zoo.lab.planning.named)
    if isinstance(baseline, str):
        items = [item.partition("=") for item in baseline.split(",") if item]
        if not items or any(not sep or not k or not v for k, sep, v in items):
            raise ConfigError("report.baseline", baseline, "axis=value pairs (mlp=gelu,pos=none) or a mapping")
        return {k.strip(): v.strip() for k, _, v in items}
    if isinstance(baseline, dict):
        return {str(k): str(v) for k, v in baseline.items()}
    raise ConfigError("report.baseline", baseline, "a mapping {axis: value}, axis=value pairs, or null")


#: ``report.correction``: none (each interval at 95%) or holm (family-wise over a report's comparisons).
CORRECTIONS = ("none", "holm")


#: ``report.test``: the interval over the per-seed differences (auto: permutation for a bounded metric, else t).
TESTS = ("auto", "t", "permutation", "bootstrap")


def tune_options(raw: Any) -> tuple[list[float] | None, list[int]]:
    """The ``tune`` section checked: (rates or None, tune seeds)."""
    raw = dict(raw or {})
    for key in raw:
        if key not in ("lr", "seeds", "width"):
            raise unknown_key("tune", key, raw[key], ("lr", "seeds", "width"))
    width = raw.get("width")
    if width is not None and (isinstance(width, bool) or not isinstance(width, int) or width <= 0):
        raise ConfigError("tune.width", width, "a positive block.d_model to tune at (null: each run's own)")
    rates, seeds = raw.get("lr"), raw.get("seeds", [0])
    if rates is not None:
        if isinstance(rates, (int, float)):
            rates = [rates]
        if not isinstance(rates, (list, tuple)) or not rates:
            raise ConfigError("tune.lr", rates, "a non-empty list of learning rates, e.g. [1e-3,3e-3,1e-2]")
        for rate in rates:
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0 or not math.isfinite(rate):
                raise ConfigError("tune.lr", rates, f"every rate a positive number ({rate!r} is not)")
        rates = [float(r) for r in rates]
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = [seeds]
    if not isinstance(seeds, (list, tuple)) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise ConfigError("tune.seeds", seeds, "a non-empty list of integer seeds, e.g. [0]")
    return rates, list(seeds)


def ladder_options(raw: Any, steps: int) -> tuple[list[int], float]:
    """The ``ladder`` section checked against the runs' ``train.steps``: (the shorter budgets, sorted; the
    extrapolation factor). No budgets: not a ladder."""
    raw = dict(raw or {})
    for key in raw:
        if key not in ("steps", "extrapolate"):
            raise unknown_key("ladder", key, raw[key], ("steps", "extrapolate"))
    budgets, far = raw.get("steps"), raw.get("extrapolate", 10)
    if isinstance(far, bool) or not isinstance(far, (int, float)) or not far >= 1:
        raise ConfigError("ladder.extrapolate", far, "a number at least 1 (times the largest compute trained)")
    if budgets is None:
        return [], float(far)
    if isinstance(budgets, int) and not isinstance(budgets, bool):
        budgets = [budgets]
    ok = isinstance(budgets, (list, tuple)) and all(isinstance(b, int) and not isinstance(b, bool) for b in budgets)
    if not ok or not all(0 < b < steps for b in budgets) or len(set(budgets)) != len(budgets):
        raise ConfigError("ladder.steps", budgets, f"distinct step counts below train.steps={steps}, e.g. [300,600]")
    if len(budgets) < 2:
        raise ConfigError("ladder.steps", budgets, "at least 2 shorter budgets: with train.steps, the 3 a fit needs")
    return sorted(budgets), float(far)


def report_interaction(raw: Any) -> list[tuple[str, str]] | None:
    """``report.interaction`` checked: the pairs of axes whose interaction the report states beyond a
    two-axis sweep's (``[optim, mlp]``, ``"optim,mlp"`` or a list of pairs); None: a two-axis sweep's own."""
    if raw is None or raw == []:
        return None
    listed = [part.strip() for part in raw.split(",")] if isinstance(raw, str) else raw
    pairs = listed if listed and all(isinstance(p, (list, tuple)) for p in listed) else [listed]
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(isinstance(a, str) and a for a in pair):
            raise ConfigError("report.interaction", raw, "two swept axes, [optim, mlp], or a list of such pairs")
        if pair[0] == pair[1]:
            raise ConfigError("report.interaction", raw, f"two different swept axes ({pair[0]!r} is named twice)")
    return [(str(a), str(b)) for a, b in pairs]


def check_interaction(named: list[tuple[str, str]], axes: list[str]) -> list[tuple[str, str]]:
    """``named`` (:func:`report_interaction`'s pairs), each axis one that ``axes`` (the swept axes) holds: a
    ConfigError names the first that is not, and the swept axes."""
    for pair in named:
        for axis in pair:
            if axis not in axes:
                swept = ", ".join(axes) or "none"
                shown = ",".join(pair)
                raise ConfigError("report.interaction", shown, f"{axis!r} is not a swept axis; swept: {swept}")
    return named
