"""The weight tables between zoo and transformers: per transformers class, every zoo key, its transformers
key(s) and the layout between them (:data:`TABLES`), driving both directions (:func:`convert`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from einops import rearrange

from zoo.core.errors import ConfigError
from zoo.parts.attention import fuse_qkv, split_qkv
from zoo.parts.mlps import fuse_gate_up, split_gate_up


@dataclass(frozen=True)
class Shape:
    """What decides a zoo model's transformers counterpart, read from its built modules."""

    placement: str
    norm: str
    norm_eps: float
    attn: str  # mha (one kv head per query head) or gqa (fewer)
    qk_norm: str
    window: int | None
    softcap: float | None
    causal: bool
    n_heads: int
    n_kv_heads: int
    pos: str
    rotary_base: float | None
    rotary_fraction: float | None
    mlp: str
    d_ff: int
    bias: bool
    max_len: int | None
    canon: str = "none"  # block.canon
    residual: str = "add"  # block.residual
    value_residual: str = "none"  # block.attn.value_residual
    value_embeddings: bool = False  # model.value_embeddings


@dataclass(frozen=True)
class Layout:
    """How tensors change between zoo's layout and transformers': ``out`` (zoo -> transformers) and
    ``back`` (its inverse), each from the tensors of one side's keys to those of the other's."""

    name: str
    out: Callable[[list[torch.Tensor], Shape], list[torch.Tensor]]
    back: Callable[[list[torch.Tensor], Shape], list[torch.Tensor]]

    def then(self, other: Layout) -> Layout:
        """This layout, then ``other`` on the way out (and ``other`` undone first on the way back)."""
        return Layout(
            f"{self.name}, then {other.name}",
            lambda ts, shape: other.out(self.out(ts, shape), shape),
            lambda ts, shape: self.back(other.back(ts, shape), shape),
        )


def _conv1d(ts: list[torch.Tensor], shape: Shape) -> list[torch.Tensor]:
    """GPT-2's Conv1D stores a weight (in, out), nn.Linear's transposed; a bias as it is (its own inverse)."""
    return [rearrange(t, "o i -> i o") if t.ndim == 2 else t for t in ts]


def _three(t: torch.Tensor) -> list[torch.Tensor]:
    """(3 n, ...) -> three (n, ...) tensors: the q, k and v rows of a concatenated projection."""
    return list(rearrange(t, "(three o) ... -> three o ...", three=3))


SAME = Layout("same", lambda ts, shape: ts, lambda ts, shape: ts)


CONV1D = Layout("Conv1D (in, out)", _conv1d, _conv1d)


#: zoo's fused qkv (grouped by key/value head, :func:`split_qkv`) <-> separate q, k, v projections.
SPLIT_QKV = Layout(
    "split qkv",
    lambda ts, shape: list(split_qkv(ts[0], shape.n_heads, shape.n_kv_heads)),
    lambda ts, shape: [fuse_qkv(*ts, shape.n_kv_heads)],
)


#: zoo's fused qkv <-> one projection holding all q rows, then all k, then all v (GPT-2's c_attn).
CAT_QKV = SPLIT_QKV.then(Layout("concatenated", lambda ts, shape: [torch.cat(ts)], lambda ts, shape: _three(ts[0])))


#: zoo's interleaved gate_up (:func:`split_gate_up`) <-> separate gate and up projections.
SPLIT_GATE_UP = Layout(
    "split gate_up", lambda ts, shape: list(split_gate_up(ts[0])), lambda ts, shape: [fuse_gate_up(*ts)]
)


PLACEHOLDERS = {"{i}": r"(?P<i>\d+)", "{p}": r"(?P<p>weight|bias)"}


@dataclass(frozen=True)
class Entry:
    """Keys on each side that hold the same weights, as patterns (``{i}``: a layer index; ``{p}``:
    ``weight`` or ``bias``), and the layout between them. An entry applies where a state dict holds
    one of its keys (a bias-free model has no ``.bias`` keys, a tied one no ``head.weight``), and
    then needs all of that side's keys."""

    zoo: tuple[str, ...]
    hf: tuple[str, ...]
    layout: Layout = SAME

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


def _per_layer(prefix: str) -> Callable[..., Entry]:
    """Entries for every layer: ``blocks.{i}.`` + a zoo key <-> ``prefix`` + each of the space-separated hf keys."""

    def entry(zoo: str, hf: str, layout: Layout = SAME) -> Entry:
        return Entry((f"blocks.{{i}}.{zoo}",), tuple(prefix + key for key in hf.split()), layout)

    return entry


_llama, _gpt2 = _per_layer("model.layers.{i}."), _per_layer("transformer.h.{i}.")


#: Per transformers class: every zoo key and the transformers key(s) it becomes. zoo's rotary pairs
#: feature j with j + d/2, as Llama's rotate_half does, so no query or key rows are permuted.
TABLES: dict[str, tuple[Entry, ...]] = {
    "LlamaForCausalLM": (
        Entry(("embed.weight",), ("model.embed_tokens.weight",)),
        _llama("placement.norms.0.weight", "input_layernorm.weight"),
        _llama("attn.qkv.{p}", "self_attn.q_proj.{p} self_attn.k_proj.{p} self_attn.v_proj.{p}", SPLIT_QKV),
        _llama("attn.out.{p}", "self_attn.o_proj.{p}"),
        _llama("placement.norms.1.weight", "post_attention_layernorm.weight"),
        _llama("mlp.gate_up.{p}", "mlp.gate_proj.{p} mlp.up_proj.{p}", SPLIT_GATE_UP),
        _llama("mlp.down.{p}", "mlp.down_proj.{p}"),
        Entry(("final_norm.weight",), ("model.norm.weight",)),
        Entry(("head.weight",), ("lm_head.weight",)),
    ),
    "GPT2LMHeadModel": (
        Entry(("embed.weight",), ("transformer.wte.weight",)),
        Entry(("pos_embed.weight",), ("transformer.wpe.weight",)),
        _gpt2("placement.norms.0.{p}", "ln_1.{p}"),
        _gpt2("attn.qkv.{p}", "attn.c_attn.{p}", CAT_QKV.then(CONV1D)),
        _gpt2("attn.out.{p}", "attn.c_proj.{p}", CONV1D),
        _gpt2("placement.norms.1.{p}", "ln_2.{p}"),
        _gpt2("mlp.up.{p}", "mlp.c_fc.{p}", CONV1D),
        _gpt2("mlp.down.{p}", "mlp.c_proj.{p}", CONV1D),
        Entry(("final_norm.weight",), ("transformer.ln_f.weight",)),
        Entry(("final_norm.bias",), ("transformer.ln_f.bias",)),
        Entry(("head.weight",), ("lm_head.weight",)),
    ),
}


#: transformers' model_type -> its class with a table.
CLASSES = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}


def convert(weights: Mapping[str, torch.Tensor], name: str, shape: Shape, *, to: str) -> dict[str, torch.Tensor]:
    """``weights`` (one side's state dict) in the other side's keys and layouts, through ``TABLES[name]``;
    ``to``: ``hf`` (from zoo's keys) or ``zoo`` (from transformers'). A key no entry maps, or a key
    an entry needs and ``weights`` lacks, is a ValueError naming it."""
    if to not in ("hf", "zoo"):
        raise ConfigError("to", to, "hf (zoo's keys to transformers') or zoo (back)")
    source, target = ("zoo", "hf") if to == "hf" else ("hf", "zoo")
    table, out, used = TABLES[name], {}, set()
    for key in weights:
        if key in used:
            continue
        entry, values = next(((e, v) for e in table if (v := e.match(source, key)) is not None), (None, None))
        if entry is None:
            raise ValueError(f"{key}: no entry of {name}'s table maps it (zoo.models.hf_tables.TABLES)")
        keys = [pattern.format(**values) for pattern in entry.keys(source)]
        missing = [k for k in keys if k not in weights]
        if missing:
            raise ValueError(f"{missing[0]}: missing, and {name}'s table needs it with {key}")
        layout = entry.layout.out if to == "hf" else entry.layout.back
        converted = layout([weights[k] for k in keys], shape)
        out.update(zip((pattern.format(**values) for pattern in entry.keys(target)), converted, strict=True))
        used.update(keys)
    return out
