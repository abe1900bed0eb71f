"""Weight tables between zoo and transformers: per family, every zoo key, its transformers key(s) and the layout
between them (:class:`Entry`), driving both directions (:func:`convert`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from einops import rearrange

from zoo.core.errors import ConfigError
from zoo.parts.attention import fuse_qkv, split_qkv
from zoo.parts.mlps import fuse_gate_up, split_gate_up


@dataclass(frozen=True)
class Geometry:
    """What a layout needs of one layer: its query and key/value heads; for a layout that needs more, each head's
    width, a linear mixer's key heads and their width (Gated DeltaNet's ``n_key_heads``, ``d_key``), the experts of
    its MLP (``n_experts``: an entry's ``{e}`` keys), and its mixer's name (an entry with ``mixer`` set applies to
    that mixer's layers only)."""

    n_heads: int
    n_kv_heads: int
    d_head: int = 0
    n_key_heads: int = 0
    d_key: int = 0
    n_experts: int = 0
    mixer: str = ""


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


PLACEHOLDERS = {"{i}": r"(?P<i>\d+)", "{p}": r"(?P<p>weight|bias)", "{e}": r"(?P<e>\d+)"}


@dataclass(frozen=True)
class Entry:
    """Keys on each side that hold the same weights, as patterns (``{i}``: a layer index; ``{p}``:
    ``weight`` or ``bias``; ``{e}``: every expert of the layer in turn, one key each), and the layout
    between them. An entry applies where a state dict holds one of its keys (a bias-free model has no
    ``.bias`` keys, a tied one no ``head.weight``), and then needs all of that side's keys; with ``mixer``
    set, only on the layers of that mixer (a hybrid's two mixers may share zoo keys: ``attn.out``)."""

    zoo: tuple[str, ...]
    hf: tuple[str, ...]
    layout: Layout = SAME
    mixer: str | None = None

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


def per_layer(prefix: str) -> Callable[..., Entry]:
    """Entries for every layer: ``blocks.{i}.`` + each of the space-separated zoo keys <-> ``prefix`` + each of the
    space-separated hf keys."""

    def entry(zoo: str, hf: str, layout: Layout = SAME, mixer: str | None = None) -> Entry:
        zoo_keys = tuple(f"blocks.{{i}}.{key}" for key in zoo.split())
        return Entry(zoo_keys, tuple(prefix + key for key in hf.split()), layout, mixer)

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
        found = [(e, v) for e in table if (v := e.match(source, key)) is not None]
        found = [(e, v) for e, v in found if e.mixer in (None, geometries[int(v.get("i", 0))].mixer)]
        if not found:
            raise ValueError(f"{key}: no entry of {name}'s weight table maps it (zoo.models.hf)")
        entry, values = found[0]
        geometry = geometries[int(values.get("i", 0))]
        keys = expand(entry.keys(source), values, geometry)
        missing = [k for k in keys if k not in weights]
        if missing:
            raise ValueError(f"{missing[0]}: missing, and {name}'s weight table needs it with {key}")
        layout = entry.layout.out if to == "hf" else entry.layout.back
        converted = layout([weights[k] for k in keys], geometry)
        out.update(zip(expand(entry.keys(target), values, geometry), converted, strict=True))
        used.update(keys)
    return out


def expand(patterns: Sequence[str], values: Mapping[str, str], geometry: Geometry) -> list[str]:
    """The keys of ``patterns`` at the placeholders' ``values``; a pattern with ``{e}`` once per expert of the
    layer (``geometry.n_experts``), in order."""
    keys = []
    for pattern in patterns:
        experts = range(geometry.n_experts) if "{e}" in pattern else [values.get("e")]
        keys += [pattern.format(**{**values, "e": e}) for e in experts]
    return keys
