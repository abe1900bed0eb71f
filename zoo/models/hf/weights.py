"""Weight tables between zoo and transformers: per family, every zoo key, its transformers key(s) and the layout
between them (:class:`Entry`), driving both directions (:func:`convert`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from einops import rearrange

from zoo.core.errors import ConfigError
from zoo.parts.attention import fuse_qkv, split_qkv
from zoo.parts.mlps import fuse_gate_up, split_gate_up


@dataclass(frozen=True)
class Geometry:
    """What a layout needs of one layer: its query and key/value heads; ``mixer``, its attention part's name
    (an entry may apply to some mixers only); a Gated DeltaNet's key heads and their width (``n_key_heads``,
    ``d_key``) and its value heads' width (``d_head``); a latent attention's content (``d_head``) and rotary
    (``rope_dim``) query rows per head."""

    n_heads: int
    n_kv_heads: int
    mixer: str = ""
    n_key_heads: int = 0
    d_key: int = 0
    d_head: int = 0
    rope_dim: int = 0


def geometry(attn: Any, mixer: str = "") -> Geometry:
    """The :class:`Geometry` of a layer whose attention part is ``attn`` (named ``mixer``)."""
    return Geometry(
        attn.n_heads, getattr(attn, "n_kv_heads", attn.n_heads), mixer, getattr(attn, "n_key_heads", 0),
        getattr(attn, "d_key", 0), getattr(attn, "d_head", 0),
    )  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """How tensors change between zoo's layout and transformers': ``out`` (zoo -> transformers) and
    ``back`` (its inverse), each from the tensors of one side's keys to those of the other's."""

    name: str
    out: Callable[[list[torch.Tensor], Geometry], list[torch.Tensor]]
    back: Callable[[list[torch.Tensor], Geometry], list[torch.Tensor]]

    def then(self, other: Layout) -> Layout:
        """This layout, then ``other`` on the way out (and ``other`` undone first on the way back)."""
        return Layout(
            f"{self.name}, then {other.name}",
            lambda ts, geometry: other.out(self.out(ts, geometry), geometry),
            lambda ts, geometry: self.back(other.back(ts, geometry), geometry),
        )


def _conv1d(ts: list[torch.Tensor], geometry: Geometry) -> list[torch.Tensor]:
    """GPT-2's Conv1D stores a weight (in, out), nn.Linear's transposed; a bias as it is (its own inverse)."""
    return [rearrange(t, "o i -> i o") if t.ndim == 2 else t for t in ts]


def _three(t: torch.Tensor) -> list[torch.Tensor]:
    """(3 n, ...) -> three (n, ...) tensors: the q, k and v rows of a concatenated projection."""
    return list(rearrange(t, "(three o) ... -> three o ...", three=3))


SAME = Layout("same", lambda ts, geometry: ts, lambda ts, geometry: ts)


CONV1D = Layout("Conv1D (in, out)", _conv1d, _conv1d)


#: zoo's fused qkv (grouped by key/value head, :func:`split_qkv`) <-> separate q, k, v projections.
SPLIT_QKV = Layout(
    "split qkv",
    lambda ts, g: list(split_qkv(ts[0], g.n_heads, g.n_kv_heads)),
    lambda ts, g: [fuse_qkv(*ts, g.n_kv_heads)],
)


#: zoo's fused qkv <-> one projection holding all q rows, then all k, then all v (GPT-2's c_attn).
CAT_QKV = SPLIT_QKV.then(Layout("concatenated", lambda ts, g: [torch.cat(ts)], lambda ts, g: _three(ts[0])))


#: zoo's interleaved gate_up (:func:`split_gate_up`) <-> separate gate and up projections.
SPLIT_GATE_UP = Layout("split gate_up", lambda ts, g: list(split_gate_up(ts[0])), lambda ts, g: [fuse_gate_up(*ts)])


def _by_key_head(t: torch.Tensor, g: Geometry) -> list[torch.Tensor]:
    """A Gated DeltaNet's rows grouped by key head (each key head's query, key, then its value heads' values:
    zoo's ``qkv`` and convolution) -> [all queries, all keys, all values]."""
    sizes = [g.d_key, g.d_key, g.n_heads // g.n_key_heads * g.d_head]
    grouped = rearrange(t, "(h n) ... -> h n ...", h=g.n_key_heads).split(sizes, 1)
    return [rearrange(part, "h n ... -> (h n) ...") for part in grouped]


def _to_key_heads(ts: list[torch.Tensor], g: Geometry) -> torch.Tensor:
    """The inverse of :func:`_by_key_head`: [all queries, all keys, all values] -> rows grouped by key head."""
    parts = [rearrange(t, "(h n) ... -> h n ...", h=g.n_key_heads) for t in ts]
    return rearrange(torch.cat(parts, 1), "h n ... -> (h n) ...")


#: A Gated DeltaNet's ``qkv`` (rows by key head) <-> separate q, k and v projections (OLMo-Hybrid's).
SPLIT_DELTA_QKV = Layout("split Gated DeltaNet qkv", lambda ts, g: _by_key_head(ts[0], g),
                         lambda ts, g: [_to_key_heads(ts, g)])  # fmt: skip


def _identity_tap(kernel: torch.Tensor) -> torch.Tensor:
    """A depthwise kernel (channels, 1, taps) that is one at the present token (the last tap)."""
    present = torch.zeros_like(kernel)
    present[..., -1] = 1.0
    return present


def _conv_out(ts: list[torch.Tensor], g: Geometry) -> list[torch.Tensor]:
    kernel = ts[0] + _identity_tap(ts[0])
    return [torch.cat(_by_key_head(kernel, g))]


def _conv_back(ts: list[torch.Tensor], g: Geometry) -> list[torch.Tensor]:
    kernel = _to_key_heads(list(ts[0].split([g.n_key_heads * g.d_key] * 2 + [g.n_heads * g.d_head])), g)
    return [kernel - _identity_tap(kernel)]


#: A Gated DeltaNet's short convolution: zoo's kernel (channels by key head, stored less the identity tap) <->
#: one depthwise kernel over every query channel, then every key, then every value (``conv1d.weight``).
DELTA_CONV = Layout("Gated DeltaNet convolution", _conv_out, _conv_back)


#: zoo's interleaved gate_up of every expert, stacked (experts, 2 f, d) <-> each expert's f gate rows, then its f up
#: rows, stacked the same way (transformers' ``experts.gate_up_proj`` of DeepSeek-V3, Qwen3-Next and the like).
STACKED_GATE_UP = Layout(
    "stacked experts' gate_up, gate rows then up rows",
    lambda ts, g: [rearrange(ts[0], "e (f two) d -> e (two f) d", two=2)],
    lambda ts, g: [rearrange(ts[0], "e (two f) d -> e (f two) d", two=2)],
)


def _experts_in_out(ts: list[torch.Tensor], geometry: Geometry) -> list[torch.Tensor]:
    """Stacked experts' weights (experts, out, in) <-> (experts, in, out), its own inverse; a bias as it is."""
    return [rearrange(t, "e o i -> e i o") if t.ndim == 3 else t for t in ts]


#: zoo's per-expert nn.Linear weights, stacked (experts, out, in) <-> transformers' stacked (experts, in, out)
#: parameters, which multiply ``x @ W`` (gpt-oss's experts); a bias (experts, out) as it is.
STACKED_EXPERTS_IN_OUT = Layout("experts stacked (in, out)", _experts_in_out, _experts_in_out)


#: ``{e}``: an expert's index. A key pattern holding it stands for every expert's key (0, 1, ... as the state dict
#: holds them), whose tensors a layout receives stacked on a new first axis; an output pattern holding it unstacks
#: its tensor's first axis into one key per expert.
PLACEHOLDERS = {"{i}": r"(?P<i>\d+)", "{p}": r"(?P<p>weight|bias)", "{e}": r"(?P<e>\d+)"}
EXPERT = "{e}"


@dataclass(frozen=True)
class Entry:
    """Keys on each side that hold the same weights, as patterns (``{i}``: a layer index; ``{p}``:
    ``weight`` or ``bias``; ``{e}``: every expert's, stacked), and the layout between them. An entry applies
    where a state dict holds one of its keys (a bias-free model has no ``.bias`` keys, a tied one no
    ``head.weight``), and then needs all of that side's keys."""

    zoo: tuple[str, ...]
    hf: tuple[str, ...]
    layout: Layout = SAME
    #: The layer mixers (zoo's attention part names) it applies to; empty: every layer (a hybrid's layers of
    #: different mixers hold different keys, or the same zoo key under another transformers name).
    mixers: tuple[str, ...] = ()

    def applies(self, geometry: Geometry) -> bool:
        """Whether the entry maps a layer of this geometry."""
        return not self.mixers or geometry.mixer in self.mixers

    def keys(self, side: str) -> tuple[str, ...]:
        return self.zoo if side == "zoo" else self.hf

    def match(self, side: str, key: str) -> dict[str, str] | None:
        """The placeholders' values when ``key`` is one of this entry's keys on ``side``, else None."""
        for pattern in self.keys(side):
            regex = re.escape(pattern)
            for placeholder, group in PLACEHOLDERS.items():
                regex = regex.replace(re.escape(placeholder), group)
            found = re.fullmatch(regex, key)
            if found is not None:
                return found.groupdict()
        return None


def per_layer(prefix: str, mixers: tuple[str, ...] = ()) -> Callable[..., Entry]:
    """Entries for every layer (``mixers``: those layers only; an entry's own ``mixer``: that mixer's): ``blocks.{i}.``
    + each of the space-separated zoo keys <-> ``prefix`` + each of the space-separated hf keys."""

    def entry(zoo: str, hf: str, layout: Layout = SAME, mixer: str | None = None) -> Entry:
        zoo_keys = tuple(f"blocks.{{i}}.{key}" for key in zoo.split())
        return Entry(zoo_keys, tuple(prefix + key for key in hf.split()), layout, (mixer,) if mixer else mixers)

    return entry


def convert(
    weights: Mapping[str, torch.Tensor],
    table: Sequence[Entry],
    geometries: Sequence[Geometry],
    *,
    to: str,
    name: str = "the family",
) -> dict[str, torch.Tensor]:
    """``weights`` (one side's state dict) in the other side's keys and layouts, through ``table``; ``to``: ``hf``
    (from zoo's keys) or ``zoo`` (from transformers'); ``geometries``: each layer's (a key without a layer index
    reads layer 0's). A key no entry maps, or a key an entry needs and ``weights`` lacks, is a ValueError naming
    it (and ``name``, the family's)."""
    if to not in ("hf", "zoo"):
        raise ConfigError("to", to, "hf (zoo's keys to transformers') or zoo (back)")
    source, target = ("zoo", "hf") if to == "hf" else ("hf", "zoo")
    out, used = {}, set()
    for key in weights:
        if key in used:
            continue
        entry, values = next(((e, v) for e in table if (v := e.match(source, key)) is not None
                              and e.applies(geometries[int(v.get("i", 0))])), (None, None))  # fmt: skip
        if entry is None:
            raise ValueError(f"{key}: no entry of {name}'s weight table maps it (zoo.models.hf)")
        groups = [source_keys(pattern, values, weights) for pattern in entry.keys(source)]
        missing = [k for group in groups for k in group if k not in weights]
        if missing:
            raise ValueError(f"{missing[0]}: missing, and {name}'s weight table needs it with {key}")
        tensors = [torch.stack([weights[k] for k in group]) if EXPERT in pattern else weights[group[0]]
                   for pattern, group in zip(entry.keys(source), groups, strict=True)]  # fmt: skip
        layout = entry.layout.out if to == "hf" else entry.layout.back
        converted = layout(tensors, geometries[int(values.get("i", 0))])
        for pattern, tensor in zip(entry.keys(target), converted, strict=True):
            if EXPERT in pattern:
                out.update({pattern.format(**values, e=e): expert for e, expert in enumerate(tensor.unbind(0))})
            else:
                out[pattern.format(**values)] = tensor
        used.update(k for group in groups for k in group)
    return out


def source_keys(pattern: str, values: Mapping[str, str], weights: Mapping[str, torch.Tensor]) -> list[str]:
    """The keys ``pattern`` stands for at ``values``: one, or (with ``{e}``) every expert's that ``weights`` holds,
    0, 1, ... in order (expert 0's key, missing, when it holds none)."""
    if EXPERT not in pattern:
        return [pattern.format(**values)]
    values = {k: v for k, v in values.items() if k != "e"}
    keys = [pattern.format(**values, e=0)]
    while (following := pattern.format(**values, e=len(keys))) in weights:
        keys.append(following)
    return keys
