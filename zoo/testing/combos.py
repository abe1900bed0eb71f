"""The contract suite's grid, at tiny sizes, generated from the registry when asked (so a newly
registered part, built in or from a plugin, is covered at once):

- every combination of part names (the product of the axes), and
- every option *variant* paired with every choice of every other axis. A variant is an option
  setting a part declares (``variants=`` at registration, e.g. ``window``); it applies to each part
  of its axis that takes those options and shows as ``name+variant`` (``gqa+window``). Each variant
  choice is crossed one axis at a time with every choice of the other axes (the rest at their first
  part): all pairs, not the full product, which would multiply the grid's cost by 2.4.

Also: the smaller covering sets (:func:`covering_combinations`, every pair of parts of two axes at least
once), the selection of the combinations that contain given parts (:func:`select`), and deterministic
shards (:func:`shard`). pytest is imported only by the helpers that parametrize or skip a test.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from zoo.assembly.build import build_block
from zoo.assembly.combinations import (  # the grid itself; re-exported for the contract's users
    block_settings,
    choices,
    combinations,
    combo_id,
    covering_combinations,
    default,
    node,
    paired_choices,  # noqa: F401  (re-exported for the contract's users)
    pairwise_combinations,
    product_names,  # noqa: F401  (re-exported for the contract's users)
)
from zoo.assembly.compat import check_combination
from zoo.assembly.spec import resolve_block
from zoo.core.errors import ConfigError
from zoo.core.registry import AXES
from zoo.parts.state import LayerState

#: Tiny sizes: 4 query heads so GQA's 2 kv heads sit strictly between MQA and MHA.
TINY = {"d_model": 16, "n_heads": 4, "d_ff": 24, "bias": True, "dropout": 0.0, "max_len": 8}


def parametrize(test: Any, combos: list[dict[str, str]]) -> Any:
    """``test`` parametrized over ``combos`` as ``combo``, with ids like ``pre-rmsnorm-gqa-rotary-swiglu``."""
    import pytest

    return pytest.mark.parametrize("combo", combos, ids=[combo_id(c) for c in combos])(test)


def every_pair(test: Any) -> Any:
    """Parametrize ``test`` over :func:`pairwise_combinations`, ids as in :func:`every_combination`."""
    return parametrize(test, pairwise_combinations())


def every_combination(test: Any) -> Any:
    """Parametrize ``test`` over every combination, with ids like ``pre-rmsnorm-gqa-rotary-swiglu``."""
    return parametrize(test, combinations())


def block_config(combo: dict[str, str], **overrides: Any) -> dict[str, Any]:
    """A plain-dict block config; ``attn`` overrides go in as ``attn={"backend": "math"}``. A paired axis the
    combination leaves out (``residual``) takes its default, as a config without it does."""
    left_out = {axis: node(axis, default(axis)) for axis in AXES if AXES[axis].paired and axis not in combo}
    cfg: dict[str, Any] = {**TINY, **left_out, **{axis: node(axis, label) for axis, label in combo.items()}}
    cfg.update(block_settings(combo))  # a variant's block settings (pre+canon: block.canon)
    for key, value in overrides.items():
        if key in AXES:
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


def context_of(cfg: dict[str, Any]) -> tuple[str | None, str | None]:
    """The smallest context the block config is valid in (``block``, else ``model``), or None and why not."""
    if check_combination(cfg, "block") is None:
        return "block", None
    reason = check_combination(cfg, "model")
    return ("model", None) if reason is None else (None, reason)


class Embedded(nn.Module):
    """A block behind the position embedding a model adds (``pos=learned``, ``sinusoidal``): the
    smallest context that provides what such parts need. Same call signature as a Block."""

    def __init__(self, block: nn.Module, pos_embed: nn.Module) -> None:
        super().__init__()
        self.pos_embed = pos_embed
        self.block = block

    def forward(
        self, x: torch.Tensor, *, key_mask: torch.Tensor | None = None, cache: LayerState | None = None
    ) -> torch.Tensor:
        offset = cache.length if cache is not None else 0
        positions = torch.arange(offset, offset + x.shape[1], device=x.device)
        return self.block(self.pos_embed(x, positions), key_mask=key_mask, cache=cache)


def build(cfg: dict[str, Any], context: str = "block") -> nn.Module:
    """The block of ``cfg``, wrapped in :class:`Embedded` when it lives in a ``model`` context."""
    if context == "block":
        return build_block(cfg)
    spec = resolve_block(cfg)
    pos_embed = spec["pos"].build(spec.dims).embedding()
    block = build_block(spec, context="model")
    return block if pos_embed is None else Embedded(block, pos_embed)


def make_block(combo: dict[str, str], dtype: torch.dtype = torch.float64, **overrides: Any) -> nn.Module:
    cfg = block_config(combo, **overrides)
    context, reason = context_of(cfg)
    if context is None:
        import pytest

        pytest.skip(reason)
    block = build(cfg, context).to(dtype)
    randomize(block)
    return block.eval()


def randomize(module: torch.nn.Module) -> None:
    """Give norms non-trivial gains and biases so tests cannot pass on ones and zeros; a matrix that starts at
    zero (hyper-connections' dynamic weights) is drawn too, or the scalars that multiply it get no gradient."""
    with torch.no_grad():
        for _name, p in module.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
            elif not p.any():
                p.normal_(0, 0.1)


#: Model-level contract tests: a 2-layer model over a 32-token vocabulary.
VOCAB = 32


#: Layer patterns the model contract covers (``model.pattern`` over a combination's block, one layer per
#: entry): a 3:1 hybrid of Gated DeltaNet and the block's attention (Qwen3.5's), and a local/global stack of
#: three sliding-window layers and a global one without positions (nanochat's "SSSL", NoPE on the global
#: layer as in OLMo-core's gnope ladder).
PATTERNS: dict[str, list[dict[str, Any]]] = {
    "hybrid": [{"attn": "gated_deltanet"}] * 3 + [{}],
    "sssl": [{"attn": {"window": 3}}] * 3 + [{"pos": "none"}],
    "linear": [{"attn": "kda"}, {"attn": "mamba2"}, {"attn": "gated_deltanet"}, {}],  # three states, one cache
}
#: The pattern cases the model contract runs, (pattern, combination): a handful, not a product.
PATTERN_CASES: list[tuple[str, dict[str, str]]] = [
    ("hybrid", {"placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "rotary", "mlp": "swiglu"}),
    ("hybrid", {"placement": "post", "norm": "layernorm", "attn": "gqa", "pos": "none", "mlp": "gelu"}),
    ("sssl", {"placement": "pre", "norm": "rmsnorm", "attn": "gqa", "pos": "rotary", "mlp": "swiglu"}),
    ("sssl", {"placement": "sandwich", "norm": "layernorm", "attn": "mqa", "pos": "alibi", "mlp": "gelu"}),
    ("linear", {"placement": "pre", "norm": "rmsnorm", "attn": "gqa", "pos": "rotary", "mlp": "swiglu"}),
]


#: The model's own options outside its blocks, all at once (Gemma's embedding scale, nanochat's embedding norm,
#: logit cap, smear and backout, cross-layer key/value sharing, a hashed trigram table): the model contract runs them
#: on a handful of combinations, not the product.
MODEL_OPTIONS: dict[str, Any] = {
    "scale_embedding": True, "embedding_norm": True, "logit_softcap": 5.0, "smear": True, "backout": True,
    "kv_share": 2, "ngram": 3, "ngram_table": 50,
}  # fmt: skip
MODEL_OPTION_CASES: list[dict[str, str]] = [
    {"placement": "pre", "norm": "rmsnorm+zc", "attn": "gqa", "pos": "rotary", "mlp": "geglu+tanh"},
    {"placement": "reordered", "norm": "layernorm", "attn": "mha+headdim", "pos": "learned", "mlp": "gelu"},
]


def pattern_id(case: tuple[str, dict[str, str]]) -> str:
    """``hybrid-pre-rmsnorm-mha-rotary-swiglu``: the pattern, then the combination's labels."""
    return f"{case[0]}-{combo_id(case[1])}"


def make_model(
    combo: dict[str, str],
    dtype: torch.dtype = torch.float64,
    n_layers: int = 2,
    pattern: list[dict[str, Any]] | None = None,
    value_embeddings: bool = False,
    options: dict[str, Any] | None = None,
    **overrides: Any,
):
    """A tiny LanguageModel of ``combo`` with weights large enough that greedy tokens vary; with a
    ``pattern`` (:data:`PATTERNS`), its layers take it over the depth (zoo.models.config.layer_specs);
    ``value_embeddings``: ``model.value_embeddings``; ``options``: more of the model's own (:data:`MODEL_OPTIONS`)."""
    from zoo.models.config import layer_specs
    from zoo.models.language import LanguageModel

    block = block_config(combo, **overrides)
    specs = layer_specs(block, n_layers, None, "model.layers", pattern)
    model = LanguageModel(specs, VOCAB, value_embeddings=value_embeddings, **(options or {})).to(dtype)
    scramble(model)
    return model.eval()


def scramble(module: torch.nn.Module, std: float = 0.3) -> None:
    """Redraw matrices with a large std (init's 0.02 makes every logit near-equal) and randomize norms."""
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim >= 2:
                p.normal_(0, std)
    randomize(module)


Part = tuple[str, str]  # (axis, name or name+variant)


def parse_part(option: str) -> Part:
    """``norm=dyt`` -> ("norm", "dyt"), checked against the registry (a ConfigError names what exists)."""
    axis, sep, name = option.partition("=")
    if not sep or axis not in AXES:
        raise ConfigError("part", option, f"AXIS=NAME with AXIS one of {', '.join(AXES)}")
    base, _, variant = name.partition("+")
    AXES[axis].get(base)  # an unknown name: "unknown norm; registered: ..." (and did you mean)
    if variant and name not in choices(axis):
        taken = [label for label in choices(axis) if label.startswith(f"{base}+")]
        raise ConfigError("part", option, f"a variant {base} takes: {', '.join(taken) or 'none'}")
    return axis, name


def has_part(combo: dict[str, str], part: Part) -> bool:
    """Whether ``combo`` holds ``part``: its name, or one of its variants when the name has none."""
    axis, name = part
    label = str(combo.get(axis))
    return label == name or ("+" not in name and label.partition("+")[0] == name)


def select(coverage: str = "full", parts: list[Part] | None = None) -> list[dict[str, str]]:
    """The combinations the contract runs for ``parts`` (every combination when none is named).

    ``full``: every combination (:func:`combinations`) that holds any of the parts. ``pairwise``:
    :func:`covering_combinations`, or with parts named, the union of one covering set per part, that
    part held fixed (so each pair of the other axes' parts meets it once, and each of its variants runs
    once). A variant named alone (``gqa+window``) is held fixed itself; its full coverage is every choice
    of each other axis beside it, as in :func:`combinations`.
    """
    if coverage not in ("full", "pairwise"):
        raise ConfigError("coverage", coverage, "full or pairwise")
    if coverage == "full":
        every = combinations()
        return [c for c in every if any(has_part(c, p) for p in parts)] if parts else every
    if not parts:
        return covering_combinations()
    rows: dict[str, dict[str, str]] = {}
    for part in parts:
        for row in covering_combinations(dict([part])):
            rows.setdefault(combo_id(row), row)
    return list(rows.values())


def parse_shard(text: str) -> tuple[int, int]:
    """``2/4`` -> (2, 4): shard 2 of 4, numbered from 1."""
    index, sep, count = text.partition("/")
    if not (sep and index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise ConfigError("shard", text, "I/N with 1 <= I <= N, e.g. 1/4")
    return int(index), int(count)


def shard(items: list[Any], index: int, count: int) -> list[Any]:
    """Shard ``index`` of ``count`` (from 1): every ``count``-th item from the ``index``-th, in order.

    Deterministic, disjoint, their union is ``items``, and sizes differ by at most one; interleaving
    spreads the costly parts (those of one axis sit next to each other in the product) over every shard.
    """
    if not 1 <= index <= count:
        raise ValueError(f"shard {index}/{count}: need 1 <= index <= count")
    return items[index - 1 :: count]


def every_covering(test: Any) -> Any:
    """Parametrize ``test`` over :func:`covering_combinations`, ids as in :func:`every_combination`."""
    return parametrize(test, covering_combinations())


def every_part_once(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The first ``rows`` until every part (variants included) of them has appeared: where a check that belongs
    to a part (a graph break, a host sync) costs a compilation per row."""
    kept, seen = [], set()
    for combo in rows:
        parts = set(combo.items())
        if not parts <= seen:
            kept.append(combo)
            seen |= parts
    return kept
