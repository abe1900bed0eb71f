"""``param=standard|mup``: how the model is parametrized as width grows (docs/mup.md).

``standard`` (the default) is zoo's init and rates as they are. ``mup`` with ``param.base_width``: the
maximal update parametrization (zoo.assembly.mup), equal to the standard one at ``block.d_model =
param.base_width``, so rates tuned there carry over to other widths. :func:`check_param` checks the
section and every combination it cannot run before any tensor work (the model's roles are found on the
meta device); :func:`parametrize` applies it to the built model.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from zoo.assembly import mup
from zoo.core.errors import ConfigError
from zoo.core.options import check_type
from zoo.lab.keys import PARAM_VALUES

#: ``param.name``: the parametrizations.
PARAMS = PARAM_VALUES
#: The section's keys and defaults (``standard`` reads none of them).
DEFAULTS: dict[str, Any] = {"name": "standard", "base_width": None}


def param_options(raw: Any) -> dict[str, Any]:
    """The ``param`` section with its defaults, names and types checked."""
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw or {}, Mapping):
        raise ConfigError("param", raw, f"a mapping with a name: one of {', '.join(PARAMS)}")
    options = {**DEFAULTS, **dict(raw or {})}
    for key in options:
        if key not in DEFAULTS:
            raise ConfigError(f"param.{key}", options[key], f"unknown key; allowed: {', '.join(DEFAULTS)}")
    if options["name"] not in PARAMS:
        raise ConfigError("param.name", options["name"], " or ".join(PARAMS))
    base = check_type("param.base_width", options["base_width"], int | None)
    if options["name"] == "mup" and (base is None or isinstance(base, bool) or base < 1):
        raise ConfigError("param.base_width", base, "param=mup needs a positive base width (a block.d_model)")
    if options["name"] == "standard" and base is not None:
        raise ConfigError("param.base_width", base, "only param=mup reads it; leave it null under param=standard")
    return options


def is_default(section: Any) -> bool:
    """Whether a ``param`` section is the standard parametrization (left out of the config hash)."""
    try:
        return param_options(section) == DEFAULTS
    except ConfigError:
        return False


def with_width(raw: Mapping[str, Any], width: int) -> dict[str, Any]:
    """The run config with ``block.d_model`` set to ``width``."""
    changed = copy.deepcopy(dict(raw))
    changed["block"] = {**(changed.get("block") or {}), "d_model": width}
    return changed


def check_param(
    raw: Mapping[str, Any], *, optimizer: str, dp_shard: int, tp: int, custom_model: bool
) -> mup.MuP | None:
    """The ``param`` section checked against the run; under ``mup`` every parameter's scaling (found on
    the meta device) or a ConfigError naming what it cannot run with. None under ``standard``."""
    options = param_options(raw.get("param"))
    if options["name"] == "standard":
        return None
    if optimizer not in mup.LR_RULES:
        raise ConfigError(
            "optim.name", optimizer, f"param=mup has rate rules for {', '.join(mup.LR_RULES)} (docs/mup.md); "
            "Muon's orthogonalized update and Adafactor's relative step need rules of their own",
        )  # fmt: skip
    if dp_shard > 1 or tp > 1:
        key, value = ("parallel.tp", tp) if tp > 1 else ("parallel.dp_shard", dp_shard)
        raise ConfigError(key, value, "param=mup runs on one process or under DDP (dp_shard=1, tp=1)")
    if custom_model:
        raise ConfigError("param.name", "mup", "the task builds its own model (an encoder-decoder); μP covers "
                          "the decoder-only language model")  # fmt: skip
    block = raw.get("block") or {}
    pos = block.get("pos") or {}
    if (pos.get("name") if isinstance(pos, Mapping) else pos) == "sinusoidal":
        raise ConfigError(
            "block.pos", "sinusoidal", "scales the token embedding by sqrt(d_model) in the forward, which "
            "μP's input rule does not cover: use learned, rotary, alibi or none",
        )  # fmt: skip
    return infer_for(raw, options["base_width"])


def infer_for(raw: Mapping[str, Any], base_width: int) -> mup.MuP:
    """:func:`zoo.assembly.mup.infer` for the run's language model, a bad base width named."""
    from zoo.models.language import build_model

    build: Callable[[int], nn.Module] = lambda width: build_model(with_width(raw, width))  # noqa: E731
    width = (raw.get("block") or {}).get("d_model", 256)
    try:
        return mup.infer(build, width, base_width)
    except ConfigError as error:
        raise ConfigError("param.base_width", base_width, f"builds no model: {error}") from None
    except ValueError as error:
        raise ConfigError("param.name", "mup", str(error)) from None


def parametrize(model: nn.Module, plan_mup: mup.MuP | None) -> nn.Module:
    """``model`` under the run's parametrization (unchanged under ``standard``)."""
    if plan_mup is not None:
        mup.apply(model, plan_mup)
    return model
