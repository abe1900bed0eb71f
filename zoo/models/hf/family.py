"""A transformers family: what of a zoo model it holds, setting by setting, and its weight table.

A family (``llama``: ``LlamaForCausalLM``) lists the settings it maps (:attr:`Family.holds`, by config key:
``block.norm``, ``block.pos.base``) with the values it can hold. Every other setting of every layer must hold
its default (``block.attn.xsa``: False), or the export is refused naming it: an option nobody taught the family
is refused rather than dropped, so a part or option added later cannot export wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zoo.core.errors import ConfigError
from zoo.models.hf.weights import Entry, Geometry, geometry

if TYPE_CHECKING:
    from zoo.models.language import LanguageModel

INSTALL = 'pip install -e ".[hf]"'


def transformers_module() -> Any:
    """``transformers``, imported on first use (the ``hf`` extra); a clear ImportError without it."""
    try:
        import transformers
    except ImportError:
        raise ImportError(f"Hugging Face export and import need transformers: {INSTALL}") from None
    return transformers


@dataclass(frozen=True)
class Holds:
    """What a family holds of one setting: ``values`` (None: any value) or a test of the value against the
    layer's other settings (``accepts``), and ``what`` it needs, said in an error."""

    what: str
    values: tuple[Any, ...] | None = None
    accepts: Callable[[Any, Mapping[str, Any]], bool] | None = None

    def holds(self, value: Any, layer: Mapping[str, Any]) -> bool:
        if self.accepts is not None:
            return self.accepts(value, layer)
        return self.values is None or value in self.values


#: A setting the family maps whatever its value (a size, an epsilon, a backend that computes the same).
ANY = Holds("any value")

#: What every family holds alike: sizes, the attention backend (both compute the same), dropout (off in eval:
#: an export is for inference and carries none), the MLP width's matching (the width it chose is exported),
#: and the objective (multi-token prediction's extra heads train beside the next-token head and are left out).
COMMON = {
    **{f"block.{key}": ANY for key in ("d_model", "n_heads", "d_ff", "dropout", "max_len")},
    **{f"block.mlp.{key}": ANY for key in ("match", "match_mlp", "match_attn")},
    "block.attn.backend": ANY,
    "block.causal": Holds("causal attention (block.causal=true)", (True,)),
    "model.tie_embeddings": ANY,
    "objective": ANY,
}


#: GELU's tanh approximation by transformers' names: PyTorch's kernel (what zoo computes, so an export names it),
#: then GPT-2's ``gelu_new``, the same formula written out (an import takes either).
TANH_GELUS = ("gelu_pytorch_tanh", "gelu_new")


def hf_activation(name: str, layer: Mapping[str, Any]) -> str:
    """transformers' name of a layer's activation ``name`` (``gelu``, ``silu``): GELU's tanh approximation under
    ``block.mlp.approximate=tanh``."""
    return TANH_GELUS[0] if layer.get("block.mlp.approximate") == "tanh" else name


def zoo_mlp(activation: str, names: Mapping[str, str]) -> str | dict[str, Any]:
    """The zoo MLP of a transformers ``activation``: its name in ``names`` (transformers' name -> zoo's MLP), a GELU
    MLP with ``approximate: tanh`` for a tanh GELU; a KeyError for any other."""
    if activation in TANH_GELUS:
        return {"name": names["gelu"], "approximate": "tanh"}
    return names[activation]


@dataclass(frozen=True)
class Refusal:
    """A setting a family cannot hold: where it is set, its value, and what the family needs instead."""

    field: str
    value: Any
    needs: str


@dataclass(frozen=True)
class Family:
    """A transformers class zoo exports to and imports from.

    ``holds``: the settings it maps (config keys) and the values it can hold; every other setting must hold
    its default. ``varies``: the settings that may differ from layer to layer (every other one is the same
    on every layer that has it: a hybrid's two mixers have options of their own); ``alike_within``: of those,
    the ones that must still be alike among the layers alike in another setting (Qwen3-Next's
    ``block.attn.head_dim`` among the layers of one ``block.attn``). ``weights``: the weight table.
    ``hf_config``: the transformers config of a model it
    holds (its layers' settings and whether the head is tied); ``zoo_config``: the zoo config (``block`` and
    ``model``) of a transformers config of this family, refusing what zoo cannot build.

    A setting only some layers hold (an option of one mixer's) is checked on those. ``across``: refusals of the
    layers taken together (a layer type the family needs and the model lacks; one window for every sliding layer),
    reported first.
    """

    name: str
    hf_class: str
    model_type: str
    holds: Mapping[str, Holds]
    weights: tuple[Entry, ...]
    hf_config: Callable[[LanguageModel, Sequence[Mapping[str, Any]], bool], Any]
    zoo_config: Callable[[Any], dict[str, Any]]
    varies: frozenset[str] = field(default_factory=frozenset)
    alike_within: Mapping[str, str] = field(default_factory=dict)
    across: Callable[[Sequence[Mapping[str, Any]]], list[Refusal]] = lambda layers: []

    @property
    def title(self) -> str:
        return f"{self.hf_class} ({self.name})"

    def refusals(self, model: LanguageModel) -> list[Refusal]:
        """Every setting of ``model`` this family cannot hold, in the order the layers' settings list them. A
        setting only some layers have (``block.pos.base`` beside a layer of ``pos=none``, a mixture of experts'
        options beside a dense layer) is checked on those."""
        layers, defaults = model_settings(model)
        found: list[Refusal] = []
        for key in dict.fromkeys(key for layer in layers for key in layer):  # layer 0's keys, then others' own
            holders = [i for i, layer in enumerate(layers) if key in layer]
            first = holders[0]
            differs = self.differs(key, layers, holders)
            if differs is not None:
                i, j = differs
                group = self.alike_within.get(key)
                alike = f"every layer alike in {key}" + (f" among those of one {group}" if group else "")
                found.append(Refusal(layer_key(key, i), layers[i][key], f"{alike} (layer {j} has {layers[j][key]!r})"))
                continue
            wrong = [i for i in holders if not self.accepts(key, layers[i][key], layers[i], defaults[i])]
            if wrong:
                everywhere = wrong == holders and all(layers[i][key] == layers[first][key] for i in holders)
                name = key if everywhere else layer_key(key, wrong[0])
                found.append(Refusal(name, layers[wrong[0]][key], self.needs(key, defaults[wrong[0]])))
        return self.across(layers) + found

    def differs(self, key: str, layers: Sequence[Mapping[str, Any]], holders: Sequence[int]) -> tuple[int, int] | None:
        """The first layer whose ``key`` differs where this family needs it alike (among every layer holding it,
        or among those alike in the setting ``alike_within`` names), and the layer it differs from; else None."""
        if key in self.varies and key not in self.alike_within:
            return None
        group = self.alike_within.get(key)
        seen: dict[str, int] = {}
        for i in holders:
            j = seen.setdefault(repr(layers[i].get(group)) if group else "", i)
            if layers[i][key] != layers[j][key]:
                return i, j
        return None

    def accepts(self, key: str, value: Any, layer: Mapping[str, Any], defaults: Mapping[str, Any]) -> bool:
        holds = self.holds.get(key)
        return holds.holds(value, layer) if holds is not None else value == defaults[key]

    def needs(self, key: str, defaults: Mapping[str, Any]) -> str:
        holds = self.holds.get(key)
        return holds.what if holds is not None else f"{key}={defaults[key]!r} (its default: it has no counterpart)"

    def geometries(self, model: LanguageModel) -> list[Geometry]:
        """Each layer's heads, for the weight layouts."""
        return [geometry(block.attn, spec["attn"].part.name) for block, spec in zip(model.blocks, model.specs,
                                                                                      strict=True)]  # fmt: skip


def model_settings(model: LanguageModel) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each layer's settings (its spec's, then the model's own) and what each holds by default."""
    layers = [{**spec.settings(), **model.settings} for spec in model.specs]
    defaults = [{**spec.default_settings(), **model.default_settings()} for spec in model.specs]
    return layers, defaults


def layer_key(key: str, index: int) -> str:
    """``block.attn.xsa`` as layer ``index``'s override (``model.layers.3.attn.xsa``); a model key as it is."""
    return f"model.layers.{index}.{key.removeprefix('block.')}" if key.startswith("block.") else key


def refused(refusal: Refusal, family: Family, named: bool) -> ConfigError:
    """The ConfigError of ``refusal``: by the family asked for (``named``), or by the nearest of all."""
    if named:
        why = f"{family.title} has no counterpart; it needs {refusal.needs}"
    else:
        why = f"no transformers class has a counterpart; the nearest, {family.title}, needs {refusal.needs}"
    return ConfigError(refusal.field, refusal.value, why)


def stacked(block: dict[str, Any], *, vocab_size: int, n_layers: int, tied: bool) -> dict[str, Any]:
    """An imported model's zoo config: its block settings under ``block``, its stack's under ``model``."""
    return {"block": block, "model": {"vocab_size": vocab_size, "n_layers": n_layers, "tie_embeddings": tied}}
