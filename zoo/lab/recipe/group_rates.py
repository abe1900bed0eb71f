"""``optim.lr_ratios={key: ratio}``: per-group learning rates over any optimizer. A key is a named group or a
glob over parameter names (fnmatch: ``blocks.*.attn.*``); every parameter it matches trains at ``ratio x`` the
rate its optimizer gives it (its group's ``lr_ratio``, and μP's multiplier, times ``ratio``). A group's weight
decay is kept, so the decay per step (rate x decay) scales with the ratio, as a torch param group's does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fnmatch import fnmatchcase
from typing import Any

import torch
from torch import nn

from zoo.core.errors import ConfigError

KEY = "optim.lr_ratios"


def _globs(*patterns: str) -> Callable[[str, nn.Module], set[str]]:
    return lambda name, model: {n for n, _ in model.named_parameters() if any(fnmatchcase(n, p) for p in patterns)}


def _matrices(name: str, model: nn.Module) -> set[str]:
    from zoo.lab.recipe.muon import treatments

    meta = any(p.is_meta for p in model.parameters())
    return {n for n, how in treatments(model, check=not meta).items() if how.kind != "adamw"}


#: The named groups (nanochat's, from the model's parameter names and Muon's hidden matrices).
GROUPS: dict[str, Callable[[str, nn.Module], set[str]]] = {
    "embeddings": _globs("embed.*", "pos_embed.*"),
    "value_embeddings": _globs("value_embeds.*"),
    "ngram": _globs("ngram.*"),
    "head": _globs("head.*"),
    "residual_scalars": _globs("*.residual.*"),
    "matrices": _matrices,
}


def check_ratios(ratios: Any) -> dict[str, float]:
    """``optim.lr_ratios``'s shape: a mapping of keys to positive numbers (a ConfigError naming the key)."""
    if not isinstance(ratios, Mapping):
        raise ConfigError(KEY, ratios, "a mapping {group or glob over parameter names: ratio}")
    for key, ratio in ratios.items():
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not ratio > 0:
            raise ConfigError(f"{KEY}.{key}", ratio, "must be a number > 0 (the group's rate over its optimizer's)")
    return {str(key): float(ratio) for key, ratio in ratios.items()}


def matched(model: nn.Module, ratios: Mapping[str, float]) -> dict[str, float]:
    """Each parameter name any key matches -> its ratio; a ConfigError for a key that matches nothing or a
    parameter two keys match. Tied parameters count once (their first name)."""
    found: dict[str, tuple[str, float]] = {}
    for key, ratio in ratios.items():
        names = GROUPS[key](key, model) if key in GROUPS else _globs(key)(key, model)
        if not names:
            tied = " (the head is the embedding while model.tie_embeddings=true)" if key == "head" else ""
            allowed = f"a named group ({', '.join(GROUPS)}) or a glob over parameter names, e.g. blocks.*.attn.*"
            raise ConfigError(f"{KEY}.{key}", ratio, f"matches no parameter of this model{tied}; {allowed}")
        for name in names:
            if name in found:
                raise ConfigError(f"{KEY}.{key}", ratio, f"matches {name}, which {found[name][0]!r} matches too; "
                                  "each parameter takes one ratio")  # fmt: skip
            found[name] = (key, ratio)
    return {name: ratio for name, (_, ratio) in found.items()}


def ratios_by_id(model: nn.Module, ratios: Mapping[str, float]) -> dict[int, float]:
    """:func:`matched` as id(parameter) -> ratio, what :func:`zoo.lab.recipe.build.scaled_groups` splits by."""
    params = dict(model.named_parameters())
    return {id(params[name]): ratio for name, ratio in matched(model, ratios).items()}


def check_on_meta(build: Callable[[], nn.Module], ratios: Mapping[str, float]) -> None:
    """Every key matched against the run's model built on the meta device (no tensor work)."""
    if ratios:
        with torch.device("meta"):
            matched(build(), ratios)
