"""Every option of every registered part (the residual's and the objective's too), every block setting and every
model option, against every transformers family: a model that changes one of them from the family's base either
exports with the same logits and comes back with them, or is refused naming a setting it changed, before anything
is written. The options are read from the registries, so an option added later is walked the day it is added."""

from __future__ import annotations

import functools
import typing
from typing import Any, Literal

import pytest
import torch

from zoo import build_model
from zoo.assembly.spec import resolve_block
from zoo.core.dims import BlockDims, block_fields
from zoo.core.errors import ConfigError
from zoo.core.options import option_defaults, option_types
from zoo.core.registry import AXES
from zoo.models.config import MODEL_DEFAULTS
from zoo.models.hf import FAMILIES, family_for, from_hf, to_hf_model
from zoo.models.hf.family import model_settings
from zoo.models.objectives import OBJECTIVES, objective_entry

pytest.importorskip("transformers")  # installed by .ci/run (the hf extra)

#: Each family's base: a small model it holds (learned positions sized, so pos=learned builds on every base).
BASES: dict[str, dict[str, Any]] = {
    "llama": {"d_model": 32, "n_heads": 4, "bias": False, "max_len": 16, "placement": "pre", "norm": "rmsnorm",
              "attn": "gqa", "pos": "rotary", "mlp": "swiglu"},
    "gpt2": {"d_model": 32, "n_heads": 4, "bias": True, "max_len": 16, "placement": "pre", "norm": "layernorm",
             "attn": "mha", "pos": "learned", "mlp": "gelu"},
    "smollm3": {"d_model": 32, "n_heads": 4, "bias": False, "max_len": 16, "placement": "pre", "norm": "rmsnorm",
                "attn": "gqa", "pos": "rotary", "mlp": "swiglu"},
    "gpt_oss": {"d_model": 32, "n_heads": 4, "bias": True, "max_len": 16, "placement": "pre", "norm": "rmsnorm",
                "attn": {"name": "gqa", "sink": "learned"}, "pos": "rotary",
                "mlp": {"name": "moe", "n_experts": 4, "expert": "clamped_swiglu", "router_bias": True}},
    "deepseek_v3": {"d_model": 32, "n_heads": 4, "d_ff": 16, "bias": False, "max_len": 16, "placement": "pre",
                    "norm": "rmsnorm", "attn": {"name": "mla", "kv_rank": 16, "q_rank": 12, "rope_dim": 4},
                    "pos": "rotary", "mlp": {"name": "moe", "n_experts": 4, "n_shared": 1, "routing": "sigmoid",
                                             "balance": "bias", "n_groups": 2, "routed_scaling_factor": 2.5}},
    "gemma3": {"d_model": 32, "n_heads": 4, "bias": False, "max_len": 16, "placement": "sandwich",
               "norm": {"name": "rmsnorm", "zero_centred": True}, "attn": {"name": "gqa", "qk_norm": "rmsnorm"},
               "pos": "rotary", "mlp": {"name": "geglu", "approximate": "tanh"}},
    "olmo_hybrid": {"d_model": 32, "n_heads": 4, "bias": False, "max_len": 16, "placement": "reordered",
                    "norm": "rmsnorm", "attn": {"name": "mha", "qk_norm": "rmsnorm", "qk_norm_scope": "all_heads"},
                    "pos": "none", "mlp": "swiglu"},
    "qwen3_next": {"d_model": 32, "n_heads": 4, "d_ff": 16, "bias": False, "max_len": 16, "placement": "pre",
                   "norm": {"name": "rmsnorm", "zero_centred": True},
                   "attn": {"name": "gqa", "head_dim": 16, "qk_norm": "rmsnorm", "gate": "elementwise"},
                   "pos": {"name": "rotary", "rotary_fraction": 0.5},
                   "mlp": {"name": "moe", "n_experts": 4, "n_shared": 1, "shared_gate": True}},
}  # fmt: skip
MODEL = {"n_layers": 2, "vocab_size": 64}
#: A family's model settings its base needs beside MODEL's (SmolLM3's NoPE layer, Gemma 3's scaled embedding).
#: (A hybrid's pattern: the block above on its layers unless an entry overrides it.)
BASE_MODELS: dict[str, dict[str, Any]] = {
    "smollm3": {"pattern": [{}, {"pos": "none"}]},
    "gemma3": {"scale_embedding": True},
    "olmo_hybrid": {"pattern": [{"placement": "pre", "pos": "none", "attn": {
        "name": "gated_deltanet", "d_key": 6, "head_dim": 12, "allow_neg_eigval": True}}, {}]},
    "qwen3_next": {"pattern": [{"pos": "none", "attn": {"name": "gated_deltanet", "n_key_heads": 2, "head_dim": 16,
                                                        "norm_eps": 1e-6}}, {}]},
}  # fmt: skip
#: Values for settings whose type alone does not say what to try (a canon site string, sizes).
SAMPLES: dict[str, list[Any]] = {
    "block.canon": ["ac", "abcd"], "block.out_conv": ["attn", "attn,mlp"], "block.max_len": [None, 64],
    "block.dropout": [0.1], "block.d_ff": [40],
    "block.n_heads": [2], "block.d_model": [48],
}  # fmt: skip
#: Model keys that are sizes or per-layer overrides (walked by the pattern case), not options.
MODEL_SIZES = ("vocab_size", "n_layers", "layers", "pattern")
IDS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))


def candidates(annotation: Any, default: Any) -> list[Any]:
    """Values to try for an option of this type: every choice of a Literal or a bool; numbers around the default
    (far enough that a wrong mapping shows in the logits); every registered part name for a string (one that
    names a part elsewhere, as ``qk_norm`` names a norm)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Literal:
        return list(args)
    types = set(args) or {annotation}
    values: list[Any] = [default]
    if bool in types:
        return [False, True]
    if type(None) in types and default is not None:
        values.append(None)
    if int in types:
        values += [1, 2, 3] if default is None else [default + 1, max(default // 2, 1), 2 * default]
    if float in types:
        values += [0.5, 2.0, 30.0] if default is None else [default * 0.5, default * 1000]
    if str in types:
        values += ["none", *(name for registry in AXES.values() for name in registry.names())]
    return list(dict.fromkeys(values))


def valid(axis: str, node: dict[str, Any]) -> bool:
    """Whether the part's own checks accept ``node`` (no tensor work)."""
    try:
        objective_entry(node) if axis == "objective" else resolve_block({**BASES["llama"], axis: node})
    except ConfigError:
        return False
    return True


def part_cases() -> list[tuple[str, dict[str, Any]]]:
    """(id, change) for each registered part on each axis, alone, with each option value, and with each contract
    variant of its axis that it takes; the objective's entries and options alike. An option value the part refuses
    alone (``bias_rate`` without ``balance=bias``) is tried on top of the first variant that lets it build."""
    cases = []
    for axis, registry in {**AXES, "objective": OBJECTIVES}.items():
        variants = {name: v for other in registry.parts() for name, v in other.variants.items()}
        for part in registry.parts():
            node = {"name": part.name}
            cases.append((f"{axis}={part.name}", {axis: node}))
            defaults, types = option_defaults(part), option_types(part.cls)
            taken = {name: v for name, v in variants.items() if set(v) <= set(types)}  # every part taking its options
            for option, annotation in types.items():
                for value in candidates(annotation, defaults[option]):
                    if value == defaults[option]:
                        continue
                    within = [(f"+{name}", v) for name, v in taken.items() if option not in v]
                    label, context = next(((name, v) for name, v in [("", {}), *within]
                                           if valid(axis, {**node, **v, option: value})), ("", {}))  # fmt: skip
                    cases.append((f"{axis}={part.name}{label} {option}={value!r}",
                                  {axis: {**node, **context, option: value}}))  # fmt: skip
            for variant, options in taken.items():
                cases.append((f"{axis}={part.name}+{variant}", {axis: {**node, **options}}))
    return cases


def setting_cases(family: str) -> list[tuple[str, dict[str, Any]]]:
    """(id, change) for each block size and switch (BlockDims) and each model option, at each value the family's
    base does not hold."""
    cases = []
    for f in block_fields():
        key, base = f"block.{f.name}", BASES[family].get(f.name, f.default)
        values = SAMPLES.get(key) or candidates(typing.get_type_hints(BlockDims)[f.name], f.default)
        cases += [(f"{key}={value!r}", {f.name: value}) for value in values if value != base]
    for key, default in MODEL_DEFAULTS.items():
        if key not in MODEL_SIZES:
            values = candidates(int | float | None if default is None else type(default), default)
            cases += [(f"model.{key}={value!r}", {"model": {key: value}}) for value in values if value != default]
    cases.append(("model.pattern mixed", {"model": {"pattern": [{"attn": {"window": 3}}, {}]}}))
    cases.append(("model.layers mixed", {"model": {"layers": {1: {"norm": {"eps": 1e-3}}}}}))
    return cases


def config_of(family: str, change: dict[str, Any]) -> dict[str, Any]:
    """The family's base with ``change``: an axis's part with the same name as the base's keeps the base's
    options beneath the change's (gpt-oss's sinks beneath an attention option); another part replaces it."""
    block, model, objective = dict(BASES[family]), {**MODEL, **BASE_MODELS.get(family, {})}, None
    for key, value in change.items():
        if key == "model":
            model.update(value)
        elif key == "objective":
            objective = value
        else:
            base = block.get(key)
            same = isinstance(base, dict) and isinstance(value, dict) and value.get("name") == base["name"]
            block[key] = {**base, **value} if same else value
    return {"block": block, "model": model, **({"objective": objective} if objective else {})}


def perturbed(config: dict[str, Any]) -> torch.nn.Module:
    """The model of ``config`` (eval mode) with every weight moved off its init, so a swapped one shows."""
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@functools.cache
def base_settings(family: str) -> list[dict[str, Any]]:
    return model_settings(build_model(config_of(family, {})))[0]


CASES = [(family, name, change) for family in FAMILIES for name, change in [*part_cases(), *setting_cases(family)]]


def test_every_option_is_walked():
    """The walk reaches every option of every part and every model option: none is left to chance."""
    walked = {(family, key) for family, _, change in CASES for key in change}
    assert {key for _, key in walked} >= {*AXES, "objective", "model"} | {f.name for f in block_fields()}
    options = {(axis, o) for axis, r in AXES.items() for p in r.parts() for o in option_types(p.cls)}
    named = {(axis, o) for _, _, change in CASES for axis, node in change.items() if isinstance(node, dict)
             for o in node}  # fmt: skip
    assert options <= named, options - named


def test_every_option_has_a_value_other_than_its_default_that_builds():
    """So no option's walk is all skips: a value its part's checks accept, other than the default."""
    accepted = set()
    for _, _, change in CASES:
        for axis, node in change.items():
            if axis in AXES and len(node) > 1:
                try:
                    resolve_block({**BASES["llama"], axis: node})
                except ConfigError:
                    continue
                accepted |= {(axis, node["name"], option) for option in node if option != "name"}
            elif axis == "objective" and len(node) > 1:
                objective_entry(node)
                accepted |= {(axis, node["name"], option) for option in node if option != "name"}
    registries = {**AXES, "objective": OBJECTIVES}
    options = {(axis, p.name, o) for axis, r in registries.items() for p in r.parts() for o in option_types(p.cls)}
    assert options <= accepted, options - accepted


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_base_exports_to_its_family(family):
    assert family_for(perturbed(config_of(family, {}))).name == family


@pytest.mark.parametrize(("family", "name", "change"), CASES, ids=[f"{f}: {n}" for f, n, _ in CASES])
def test_an_option_exports_with_the_same_logits_or_is_refused_by_name(family, name, change):
    try:
        model = perturbed(config_of(family, change))
    except ConfigError:
        pytest.skip("not a model zoo builds (the part's own checks refuse it)")
    layers, base_layers = model_settings(model)[0], base_settings(family)
    # a key the base's layer lacks is changed too (a part's option that came with the part: a None shows no change)
    changed = {key for a, b in zip(layers, base_layers, strict=False) for key in a if key not in b or a[key] != b[key]}
    try:
        theirs = to_hf_model(model, family)
    except ConfigError as error:
        field = error.field
        if field.startswith("model.layers."):
            field = "block." + field.split(".", 3)[3]
        # the setting refused is one this case changed, or one the family ties to a changed one, naming it
        # (Qwen3-Next's Gated DeltaNet norm_eps must equal the block norm's eps: a changed block.norm.eps)
        tied = {key for key in changed if f"={key})" in str(error)}
        assert field in changed or tied, f"refused naming {error.field}, which this case did not change: {changed}"
        return
    with torch.no_grad():
        mine = model(IDS)
        torch.testing.assert_close(theirs(IDS).logits, mine, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(from_hf(theirs)(IDS), mine, rtol=1e-5, atol=1e-5)
