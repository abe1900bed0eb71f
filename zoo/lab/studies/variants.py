"""A sweep's runs grouped into variants: the data the report's tables and plots are drawn from.

A *run* is a folder with a ``summary.json``; a *variant* is the runs that share every swept value
but the seed; a :class:`Report` holds them sorted best first by the headline metric.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zoo.parts  # noqa: F401  (registers the built-in parts: AXES is read by name)
from zoo.core.errors import ConfigError
from zoo.core.interface import hook
from zoo.core.registry import AXES
from zoo.lab.keys import NOT_AXES
from zoo.lab.planning.named import VARIANT
from zoo.lab.planning.options import (
    TUNE_DIR,
    check_interaction,
    report_interaction,
    report_options,
    target_options,
)
from zoo.lab.records.metrics import METRICS
from zoo.lab.records.settings import UNSET, parse_overrides
from zoo.lab.records.summary import SUMMARY, read_record_checked
from zoo.lab.studies.interactions import Interaction, axis_interactions
from zoo.lab.studies.named import first_named, name_runs, set_by_variants
from zoo.lab.studies.peaks import Peak, variant_peaks
from zoo.lab.studies.runset import Run, Variant
from zoo.lab.studies.sensitivity import LrStudy, lr_study
from zoo.lab.studies.stats import Comparison, apply_holm, chosen_test, compare, difference_range
from zoo.lab.studies.target import target_study

log = logging.getLogger("zoo.lab.studies.variants")


def unused_axes(config: dict[str, Any]) -> list[str]:
    """The axes a run's config chooses but does not use: ``norm`` when every placement of the model
    (the block's and each per-layer one, from ``model.layers`` and ``model.pattern``) is norm-free
    (``uses_norm`` and ``final_norm`` False). A placement that is not registered counts as using
    everything (the run reports its error)."""
    block, model = config.get("block") or {}, config.get("model") or {}
    layers = [*(model.get("layers") or {}).values(), *(model.get("pattern") or [])]
    nodes = [block.get("placement"), *(layer.get("placement") for layer in layers if isinstance(layer, dict))]
    names = [node.get("name") if isinstance(node, dict) else node for node in nodes if node is not None]
    placements = AXES["placement"]
    if not names or any(name not in placements for name in names):
        return []
    classes = [placements.get(name).cls for name in names]
    return [] if any(hook(cls, "uses_norm") or hook(cls, "final_norm") for cls in classes) else ["norm"]


@dataclass
class Report:
    """A sweep's runs grouped into variants, sorted best first by ``metric``."""

    root: Path
    axes: list[str]
    variants: list[Variant]
    metric: str
    mode: str
    extra: list[str]  # other validation metrics shown beside the headline (e.g. other lengths)
    baseline: tuple[str, ...] = ()  # the key of the variant every other is compared with
    correction: str = "none"  # none | holm (family-wise over the comparisons)
    test: str = "t"  # the interval over the per-seed differences: t | permutation | bootstrap (report.test resolved)
    test_option: str = "auto"  # report.test as given
    dropped: list[Dropped] = field(default_factory=list)  # run folders left out: their summary could not be read
    comparisons: dict[tuple[str, ...], Comparison] = field(default_factory=dict)  # variant key -> vs baseline
    effects: list[Effect] = field(default_factory=list)  # per axis value, pooled over the other axes
    interactions: list[Interaction] = field(default_factory=list)  # two axes' difference of differences
    lr: LrStudy | None = None  # the tuning runs (tune.lr, <root>/tune) across the rate grid, with the sensitivity
    peaks: dict[tuple[str, ...], dict[str, Peak]] = field(default_factory=dict)  # variant key -> probe key -> peak
    ladder: Any = None  # a ladder sweep's fit (ladder.steps; zoo.lab.studies.ladder.study.LadderStudy), None otherwise
    ladder_left_out: list[int] = field(default_factory=list)  # budgets in the folder the ladder was not asked for
    folded: dict[str, str] = field(default_factory=dict)  # an option some parts do not have -> the axis it joins
    gates: dict[tuple[str, ...], list[Any]] = field(default_factory=dict)  # variant key -> report.gates' answers
    target: Any = None  # report.target's answer per variant (zoo.lab.studies.target.TargetStudy), None without one

    @property
    def runs(self) -> list[Run]:
        return [r for v in self.variants for r in v.runs]

    def label(self, variant: Variant | tuple[str, ...]) -> str:
        """``mlp=swiglu pos=rotary``; a named variant by its name (``-gate``, ``rope d_model=64``)."""
        key = variant.key if isinstance(variant, Variant) else variant
        return " ".join(v if a == VARIANT else f"{a}={v}" for a, v in zip(self.axes, key, strict=True)) or "default"

    @property
    def baseline_label(self) -> str:
        return self.label(self.baseline)

    def variant(self, key: tuple[str, ...]) -> Variant | None:
        return next((v for v in self.variants if v.key == key), None)


@dataclass
class Dropped:
    """A run folder the report could not read, and why (left out of every table and statistic)."""

    path: Path
    reason: str


@dataclass
class Effect:
    """One axis value against the axis's baseline value, paired by seed and the other axes' values."""

    axis: str
    value: str
    baseline: str
    comparison: Comparison


def scan(root: Path) -> tuple[list[Run], list[Dropped]]:
    """Every run under ``root`` whose summary reads and checks (:func:`read_record_checked`), in folder order;
    and every run folder (one with a summary.json, a metrics.jsonl or Hydra's .hydra/) whose summary does not."""
    runs, dropped = [], []
    folders = {p.parent for name in (SUMMARY, METRICS, ".hydra/overrides.yaml") for p in root.rglob(name)}
    folders = {f.parent if f.name == ".hydra" else f for f in folders}
    for folder in sorted(folders):
        parts = folder.relative_to(root).parts
        if parts and parts[0] == "tune" and len(parts) > 1:
            continue  # tune.lr's runs (zoo/lab/studies/tune.py): a sweep of their own, reported in root/tune
        record, reason = read_record_checked(folder)
        if record is not None:
            runs.append(Run(folder, record, parse_overrides(record.overrides or [])))
        else:
            dropped.append(Dropped(folder, str(reason)))
    return runs, dropped


def scan_named(root: Path) -> tuple[list[Run], list[Dropped], dict[str, list[str]]]:
    """:func:`scan`'s runs, each named by its variant in a sweep of named variants (zoo.lab.studies.named), and its
    dropped folders with the runs that are none of the sweep's variants; and the variants ({} for a grid)."""
    runs, dropped = scan(root)
    named, unnamed = name_runs(root, runs)
    dropped += [Dropped(r.path, f"not one of the sweep's named variants ({', '.join(named)})") for r in unnamed]
    return [r for r in runs if r not in unnamed], dropped, named


def collect(root: Path) -> list[Run]:
    """Every run under ``root`` that has a summary that reads, in folder order (:func:`scan` also says which not)."""
    return scan(root)[0]


def runs_report_options(runs: Sequence[Run]) -> tuple[dict[str, str] | None, str, str]:
    """The ``report`` section the runs were launched with (the most common one)."""
    seen = Counter(repr(r.record.config.get("report")) for r in runs if r.record.config)
    if not seen:
        return None, "none", "auto"
    chosen = seen.most_common(1)[0][0]
    for r in runs:
        section = (r.record.config or {}).get("report")
        if repr(section) == chosen:
            return report_options(section)
    return None, "none", "auto"


def first_values(runs: Sequence[Run], axes: Sequence[str]) -> dict[str, str]:
    """Each axis's first value in the sweep: that of the first job Hydra launched (job 0 is the first
    value of every swept key), else of the earliest run; among the runs that finished ok, if any did
    (a baseline without a result compares nothing)."""

    def launched(run: Run) -> tuple[int, str, str]:
        job = run.record.job
        return (job if job is not None else 1 << 30, run.record.started or "", str(run.path))

    first = min([r for r in runs if r.status == "ok"] or runs, key=launched)
    return {a: first.value(a) for a in axes}


def choose_baseline(runs: Sequence[Run], axes: Sequence[str], given: dict[str, str] | None) -> tuple[str, ...]:
    """The baseline variant's key: ``given`` values; the axes it leaves out completed from the runs that match
    it (the first launched of them), so ``schedule=cosine`` picks the cosine runs' own ``train.branch.step``
    (``unset``) rather than the sweep's first value; from every run when no run matches all of ``given``."""
    given = given or {}
    for axis, value in given.items():
        if axis not in axes:
            swept = "; ".join(f"{a}: {', '.join(sorted({r.value(a) for r in runs}))}" for a in axes) or "none"
            raise ConfigError("report.baseline", f"{axis}={value}", f"{axis} is not a swept axis; swept: {swept}")
        seen = sorted({r.value(axis) for r in runs})
        if value not in seen:
            raise ConfigError("report.baseline", f"{axis}={value}", f"one of {axis}'s values: {', '.join(seen)}")
    matching = [r for r in runs if all(r.value(a) == v for a, v in given.items())]
    values = {**first_values(matching or runs, axes), **given}
    return tuple(values[a] for a in axes)


def axis_effects(
    runs: Sequence[Run], axes: Sequence[str], baseline: tuple[str, ...], metric: str, mode: str, test: str = "t"
) -> list[Effect]:
    """For a sweep of several axes: each axis value against the axis's baseline value, pooled over the
    other axes (pairs: the same seed and the same values of every other axis), blocked by seed: each
    seed's differences are averaged over the other axes, and the interval is over those seed means (the
    runs of one seed share weights and data, so its pairs are not independent of each other)."""
    effects = []
    if len(axes) < 2:
        return effects
    for i, axis in enumerate(axes):
        groups: dict[str, dict[Any, float]] = {}
        for run in runs:
            value = run.record.final_value(metric) if run.status == "ok" else None
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            others = tuple(run.value(a) for j, a in enumerate(axes) if j != i)
            groups.setdefault(run.value(axis), {})[(run.seed, others)] = float(value)
        base = groups.get(baseline[i], {})
        for value in sorted(groups, key=lambda v: [r.value(axis) for r in runs].index(v)):
            if value != baseline[i]:
                c = compare(groups[value], base, mode, test=test, bounds=difference_range(metric), unit=seed_of)
                effects.append(Effect(axis, value, baseline[i], c))
    return effects


def compare_variants(
    variants: Sequence[Variant], base: Variant | None, base_key: tuple[str, ...], metric: str, mode: str, test: str
) -> dict[tuple[str, ...], Comparison]:
    """Each variant but the baseline against it, paired by seed, under ``test``, clipped to the metric's range."""
    base_values = base.by_seed(metric) if base is not None else {}
    bounds = difference_range(metric)
    return {v.key: compare(v.by_seed(metric), base_values, mode, test=test, bounds=bounds)
            for v in variants if v.key != base_key}  # fmt: skip


def seed_of(key: Any) -> Any:
    """The seed of an effect's pairing key ``(seed, other axes' values)``: its independent unit."""
    return key[0]


def build_report(
    root: Path,
    baseline: dict[str, str] | None = None,
    correction: str | None = None,
    test: str | None = None,
    interaction: list[tuple[str, str]] | None = None,
    ladder: list[int] | None = None,
    target: dict[str, float] | None = None,
) -> Report:
    """The runs under ``root`` grouped into variants and compared with the baseline.

    ``baseline``, ``correction``, ``test`` and ``interaction`` default to the runs' own ``report`` section, and
    that to the first value of each swept axis, no correction, ``auto`` and a two-axis sweep's own pair;
    ``ladder`` (a ladder's shorter budgets, ``ladder.steps``) to the runs' own. Run folders whose summary
    cannot be read are listed in ``Report.dropped``. ``target`` (:func:`target_options`'s) defaults to the runs'
    own ``report.target``.
    """
    runs, dropped, named = scan_named(root)
    if not runs:
        why = "".join(f"; {d.path}: {d.reason}" for d in dropped)
        raise FileNotFoundError(f"no {'readable ' if dropped else ''}{SUMMARY} under {root}: is this a sweep or run "
                                f"folder?{why}")  # fmt: skip
    axes, folds = report_axes(runs, named)
    groups: dict[tuple[str, ...], Variant] = {}
    for run in runs:
        key = tuple(run.value(a) for a in axes)
        variant = groups.setdefault(key, Variant(key))
        if run.record.unused_axes and any(r.seed == run.seed and r.status == run.status for r in variant.runs):
            continue  # the same run again, differing only on an axis it does not use: counted once
        variant.runs.append(run)
    metric, mode = headline(runs)
    family = metric.rsplit("_", 1)[0] if metric.endswith("x") and metric[-2:-1].isdigit() else metric
    finals = sorted({k for r in runs for k in (r.record.final or {})})
    extra = [k for k in finals if k != metric and (k == family or k.startswith(f"{family}_"))]

    def order(variant: Variant) -> tuple[int, float]:
        mean, _ = variant.mean_std(metric)
        if mean is None:
            return (1, 0.0)
        return (0, mean if mode == "min" else -mean)

    variants = sorted(groups.values(), key=order)
    launched_baseline, launched_correction, launched_test = runs_report_options(runs)
    given = baseline if baseline is not None else launched_baseline or first_named(named, runs)
    correction = correction or launched_correction
    test_option = test or launched_test
    report_options({"correction": correction, "test": test_option})
    method = chosen_test(test_option, metric)
    base_key = choose_baseline(runs, axes, given)
    comparisons = compare_variants(variants, groups.get(base_key), base_key, metric, mode, method)
    effects = axis_effects(runs, axes, base_key, metric, mode, method)
    interactions = axis_interactions(runs, axes, base_key, metric, method, named_interaction(interaction, runs, axes))
    if correction == "holm":
        apply_holm(list(comparisons.values()), mode)
        apply_holm([e.comparison for e in effects], mode)
        apply_holm([i.comparison for i in interactions], "min")
    report = Report(root, axes, variants, metric, mode, extra, base_key, correction, method, test_option, dropped,
                    comparisons, effects, interactions, folded=folds)  # fmt: skip
    return with_studies(report, ladder, target)


def report_axes(runs: Sequence[Run], named: dict[str, list[str]] | None = None) -> tuple[list[str], dict[str, str]]:
    """The keys the runs' overrides give more than one value (but the seeds and the sweep file): block axes first,
    in the block's order, then the rest by name; less the options folded into their part's axis, which are
    returned beside them (:func:`part_options`, each run told by :func:`fold`). A sweep of ``named`` variants:
    ``variant`` first, and no key a variant sets (its name stands for them)."""
    first = [VARIANT, *AXES, "preset", "task"] if named else [*AXES, "preset", "task"]
    keys = sorted(
        {k for r in runs for k in r.overrides if not (named and set_by_variants(k, named))} - NOT_AXES,
        key=lambda k: (k not in first, first.index(k) if k in first else 0, k),
    )
    axes = [k for k in keys if len({r.value(k) for r in runs}) > 1]
    folds = part_options(runs, axes)
    fold(runs, folds)
    return [a for a in axes if a not in folds], folds


def part_options(runs: Sequence[Run], axes: Sequence[str]) -> dict[str, str]:
    """``{option: axis}`` for each swept option of an axis's part (``block.residual.sinkhorn_iters`` of
    ``residual``) that some runs do not have (``unset``: their part has no such option): read as part of the
    axis's value (:func:`fold`), not as an axis of its own whose pooled rows would compare runs it does not tell
    apart."""
    parts = {option: axis for option in axes for axis in axes if option.startswith((f"block.{axis}.", f"{axis}."))}
    return {option: axis for option, axis in parts.items() if any(r.value(option) == UNSET for r in runs)}


def fold(runs: Sequence[Run], folds: dict[str, str]) -> None:
    """Each run reads the options of ``folds`` (:func:`part_options`) beside its value of their axis."""
    by_axis: dict[str, list[str]] = {}
    for option, axis in folds.items():
        by_axis.setdefault(axis, []).append(option)
    for run in runs:
        run.folded = by_axis


def headline(runs: Sequence[Run]) -> tuple[str, str]:
    """The metric most runs name as their headline, and its mode (min or max)."""
    metrics = Counter(r.record.metric.get("name") for r in runs if r.record.metric)
    metric = metrics.most_common(1)[0][0] if metrics else "val_loss"
    modes = [r.record.metric.get("mode") for r in runs if r.record.metric and r.record.metric.get("name") == metric]
    return metric, modes[0] if modes else "min"


def named_interaction(
    given: list[tuple[str, str]] | None, runs: Sequence[Run], axes: Sequence[str]
) -> list[tuple[str, str]] | None:
    """The interactions a report states beyond a two-axis sweep's own: ``given`` (``zoo-report --interaction``,
    the sweep's ``report.interaction``), refused (ConfigError naming the swept axes) unless each of its axes is
    swept; else the runs' own ``report.interaction``, left out with a warning where its axes are not swept."""
    if given is not None:
        return check_interaction(given, list(axes))
    launched = launched_interaction(runs)
    try:
        return check_interaction(launched, list(axes)) if launched else None
    except ConfigError as error:
        log.warning("the runs' report.interaction left out of the report: %s", error)
        return None


def launched_interaction(runs: Sequence[Run]) -> list[tuple[str, str]] | None:
    """``report.interaction`` as the runs were launched with it (the first run that names one)."""
    for run in runs:
        named = ((run.record.config or {}).get("report") or {}).get("interaction")
        if named:
            return report_interaction(named)
    return None


def with_studies(report: Report, ladder: list[int] | None = None, target: dict[str, float] | None = None) -> Report:
    """``report`` with its ``lr``, the sweep's tuning runs (``<root>/tune``, zoo/lab/studies/tune.py) per variant across
    the rate grid with the learning-rate sensitivity (zoo/lab/studies/sensitivity.py), None without any; its
    ``peaks``, the probes' largest values over training (zoo/lab/studies/peaks.py), empty without probes; and a
    ladder sweep's fit on the budgets ``ladder`` (:func:`ladder_of`)."""
    tune = report.root / TUNE_DIR
    runs = scan(tune)[0] if tune.is_dir() else []
    fold(runs, report.folded)
    compared = (report.variants, report.baseline, report.test)
    report.lr = lr_study(*compared, report.axes, report.metric, report.mode, runs) if runs else None
    report.peaks = variant_peaks(*compared)
    report.ladder = ladder_of(report, ladder)
    options = target if target is not None else launched_target(report.runs)
    report.target = target_study(report.variants, report.metric, report.mode, options) if options else None
    return report


def launched_target(runs: Sequence[Run]) -> dict[str, float] | None:
    """``report.target`` as the runs were launched with it (the first run that names one), checked."""
    for run in runs:
        options = target_options((run.record.config or {}).get("report"))
        if options is not None:
            return options
    return None


def ladder_of(report: Report, budgets: list[int] | None = None) -> Any:
    """A ladder sweep's fit (its runs recorded ``ladder.steps``), None for any other sweep: on the runs of the
    shorter ``budgets`` (default: the runs' recorded ``ladder.steps``) and of the longest (the runs that are no
    branch), the others' budgets named in ``report.ladder_left_out``."""
    section = next((s for r in report.runs if (s := (r.record.config or {}).get("ladder")) and s.get("steps")), None)
    if section is None:
        return None
    from zoo.lab.studies.ladder.study import ladder_study  # numpy and scipy.optimize: only a ladder's report needs them

    baseline = dict(zip(report.axes, report.baseline, strict=True))
    far = float(section.get("extrapolate") or 10)
    longest = {steps_of(r) for r in report.runs if not r.record.branch}
    asked = {*(section["steps"] if budgets is None else budgets), *longest}
    report.ladder_left_out = sorted({steps_of(r) for r in report.runs} - asked)
    tune = collect(report.root / "tune") if (report.root / "tune").is_dir() else []  # tune.lr's runs and decays
    tune = [r for r in tune if steps_of(r) in asked]
    fold(tune, report.folded)
    return ladder_study([r for r in report.runs if steps_of(r) in asked], report.axes, baseline, report.metric,
                        report.mode, report.test, far, tune_runs=tune)  # fmt: skip


def steps_of(run: Run) -> int:
    """A run's budget: its ``train.steps`` (0 when it records none)."""
    return int(run.record.config_value("train.steps") or 0)
