"""Named variants: a sweep's ``variants`` (``{name: [override, ...]}``) or its ``ablate`` section (hold one out or
add one over ``ablate.features``) as the jobs it launches: each variant x the sweep's other swept keys (the seeds),
nothing else. Each job carries ``variant=<name>``, a runtime key: the name is in no run's hash or folder name, so a
variant whose overrides equal a grid run's trains into that run's folder, and a finished one is skipped. Variants
of the same seed share ``data_seed`` (the seed's, unless the sweep sets it), so they see the same batches.

Every mistake is a ConfigError naming the variant (``variants.<name>``) or feature (``ablate.features.<name>``)
before any run: a section that is not a mapping of lists, an override without a key, two features whose
overrides set the same key, two variants of the same overrides (one folder), a variant setting a seed or a key
the sweep also sweeps.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

from zoo.core.errors import ConfigError
from zoo.core.registry import AXES
from zoo.lab.keys import NOT_AXES, run_folder_name

#: The class name of zoo's sweeper (zoo.lab.planning.sweeper), whose jobs :func:`sweep_job_lists` lists.
SWEEPER_NAME = "VariantSweeper"
#: A run's variant name: a runtime key (zoo.lab.keys.RUNTIME), the report's row label.
VARIANT = "variant"
#: The sweep's named variants, a mapping or null.
VARIANTS = "variants"
#: ``ablate=<mode>``: the sign its variant names take (``-gate``: the recipe without the gate; ``+hyper``: with).
ABLATIONS = {"hold_one_out": "-", "add_one": "+"}
#: The variant an ablation starts from (the recipe, or the baseline), first: the report's default baseline.
BASE = "base"
#: What a variant's or feature's name may hold (it names the report's rows and plots' curves).
NAME = re.compile(r"[A-Za-z0-9_.+-]+")


def override_key(override: str) -> str:
    """``block.attn.gate=none`` -> ``block.attn.gate``; ``+x=1``, ``~x`` -> ``x``; an axis's group choice
    (``attn=gqa``) read as its node (``block.attn``), so it collides with that node's keys."""
    key = override.partition("=")[0].lstrip("+~")
    return f"block.{key}" if key.partition(".")[0] in AXES else key


def collide(a: str, b: str) -> bool:
    """Whether two keys set the same node: equal, or one inside the other."""
    return a == b or a.startswith(f"{b}.") or b.startswith(f"{a}.")


def override_list(field: str, value: Any) -> list[str]:
    """A list of ``key=value`` (or ``~key``) overrides; a single string reads as a list of one."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ConfigError(field, value, "a list of overrides [key=value, ...]")
    for item in items:
        if not isinstance(item, str) or not (("=" in item and item.partition("=")[0].lstrip("+~")) or
                                             item.startswith("~")):  # fmt: skip
            raise ConfigError(field, item, "an override key=value (or ~key)")
    return [str(item) for item in items]


def checked_name(field: str, name: Any) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigError(field, name, "a name of letters, digits and _ . + -")
    return name


def checked_variants(raw: Any, fields: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """``variants`` checked: ``{name: [override, ...]}``, none setting a seed, no two of the same overrides (they
    would share every run folder). ``fields``: each name's field in errors (default ``variants.<name>``)."""
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(VARIANTS, raw, "a mapping {name: [override, ...]}, e.g. {base: [], rope: [pos=rotary]}")
    named: dict[str, list[str]] = {}
    folders: dict[str, str] = {}
    for name, overrides in raw.items():
        field = (fields or {}).get(name, f"{VARIANTS}.{name}")
        checked_name(field, name)
        if not isinstance(overrides, (list, tuple)):
            raise ConfigError(field, overrides, "a list of overrides [key=value, ...] ([] for the sweep's config)")
        named[name] = override_list(field, overrides)
        for override in named[name]:
            if override_key(override) in NOT_AXES:
                raise ConfigError(field, override, "no seed: every variant runs on the sweep's seeds, data-matched")
        folder = run_folder_name(sorted(named[name]))
        if folder in folders:
            raise ConfigError(field, named[name], f"overrides of its own: {folders[folder]}'s are the same")
        folders[folder] = name
    return named


def ablation_variants(ablate: Mapping[str, Any]) -> dict[str, list[str]]:
    """``ablate``'s variants: ``base`` (the recipe), then one per feature, named ``-<feature>`` (hold one out: the
    recipe with the override that removes it) or ``+<feature>`` (add one: with the override that adds it)."""
    mode = ablate.get("name")
    sign = ABLATIONS[mode]
    features = ablate.get("features")
    if not isinstance(features, Mapping) or not features:
        raise ConfigError("ablate.features", features, f"a mapping {{feature: override(s)}} for ablate={mode}")
    recipe = override_list("ablate.recipe", ablate.get("recipe") or [])
    changes = {checked_name(f"ablate.features.{name}", name): override_list(f"ablate.features.{name}", value)
               for name, value in features.items()}  # fmt: skip
    for (a, first), (b, second) in itertools.combinations(changes.items(), 2):
        for x, y in itertools.product(first, second):
            if collide(override_key(x), override_key(y)):
                raise ConfigError(f"ablate.features.{b}", y, f"a key no other feature sets: {a} sets it ({x})")
    variants = {BASE: recipe}
    for name, change in changes.items():
        keys = [override_key(o) for o in change]
        variants[f"{sign}{name}"] = [*(o for o in recipe if not any(collide(override_key(o), k) for k in keys)),
                                     *change]  # fmt: skip
    fields = {f"{sign}{name}": f"ablate.features.{name}" for name in changes}
    return checked_variants(variants, {BASE: "ablate.recipe", **fields})


def named_variants(variants: Any, ablate: Any) -> dict[str, list[str]] | None:
    """The sweep's named variants, checked, from its ``variants`` or ``ablate`` section; None for a grid."""
    mode = (ablate or {}).get("name") or "none"
    if mode == "none":
        if (ablate or {}).get("features"):
            raise ConfigError("ablate", mode, f"{' or '.join(ABLATIONS)} to expand ablate.features into variants")
        return None if variants is None else checked_variants(variants)
    if mode not in ABLATIONS:
        raise ConfigError("ablate", mode, f"none, {', '.join(ABLATIONS)}")
    if variants is not None:
        raise ConfigError(VARIANTS, variants, f"null with ablate={mode}: the ablation names its variants")
    return ablation_variants(ablate)


def config_variants(config: DictConfig) -> dict[str, list[str]] | None:
    """:func:`named_variants` of a composed sweep config."""
    section = {k: OmegaConf.to_container(config[k], resolve=True) if isinstance(config.get(k), DictConfig)
               else config.get(k) for k in (VARIANTS, "ablate")}  # fmt: skip
    return named_variants(section[VARIANTS], section["ablate"])


def named_jobs(named: Mapping[str, Sequence[str]], overrides: Sequence[Override]) -> list[list[str]]:
    """Each variant x the product of the sweep's swept values (``overrides``: its sweep file's ``params`` and
    command line, parsed), variants outermost: a job is the sweep's other overrides (a fixed one of a key the
    variant sets left out), the variant's, and ``variant=<name>``. A key's last override wins, as in Hydra's basic
    sweeper (the command line's ``seed=0`` over the sweep file's ``seed: 0,1,2``). A variant setting a swept key
    is refused."""
    last = {o.get_key_element(): o for o in overrides}
    swept = {key: list(o.sweep_string_iterator()) for key, o in last.items() if o.is_sweep_override()}
    fixed = [f"{key}={o.get_value_element_as_str()}" for key, o in last.items() if not o.is_sweep_override()]
    for name, change in named.items():
        for override in change:
            hit = next((k for k in swept if collide(override_key(k), override_key(override))), None)
            if hit is not None:
                values = ",".join(swept[hit])
                why = f"a key the sweep does not also sweep ({hit}={values}): a variant of each value instead"
                raise ConfigError(f"{VARIANTS}.{name}", override, why)
    grid = [[f"{key}={value}" for key, value in zip(swept, values, strict=True)]
            for values in itertools.product(*swept.values())]  # fmt: skip
    jobs = []
    for name, change in named.items():
        keys = [override_key(o) for o in change]
        kept = [o for o in fixed if o.partition("=")[0] != VARIANT and
                not any(collide(override_key(o), k) for k in keys)]  # fmt: skip
        jobs += [[*kept, *point, *change, f"{VARIANT}={name}"] for point in grid]
    return jobs


def variant_folders(jobs: Sequence[Sequence[str]]) -> dict[str, str]:
    """``{run folder name: variant name}`` for each named job: the folder its overrides name
    (zoo.lab.keys.run_folder_name), or the one a ``hydra.sweep.subdir=`` override sends it to."""
    out = {}
    for job in jobs:
        names = [o.partition("=")[2] for o in job if o.startswith(f"{VARIANT}=")]
        sent = [o.partition("=")[2].strip("'") for o in job if o.startswith("hydra.sweep.subdir=")]
        if names:
            out[sent[-1] if sent else run_folder_name(job)] = names[-1]
    return out


def sweep_job_lists(config: Any, overrides: list[Override]) -> list[list[str]]:
    """A sweep's jobs in launch order: its named variants' (:func:`named_jobs`), else Hydra's product."""
    named = config_variants(config)
    if named is None:
        return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
    return named_jobs(named, overrides)
