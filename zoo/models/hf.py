"""Hugging Face ``transformers`` export and import: a zoo LanguageModel <-> a transformers causal LM.

Which zoo models have a transformers class (every layer alike, causal, no attention options such
as qk_norm, window or softcap):

| transformers class | placement | norm | attn | pos | mlp | bias |
|---|---|---|---|---|---|---|
| ``LlamaForCausalLM`` | pre | rmsnorm | mha, gqa, mqa | rotary (whole head) | swiglu, geglu, reglu | either |
| ``GPT2LMHeadModel`` | pre | layernorm | mha | learned | gelu, relu, relu2 | true |

Tied or untied embeddings either way; a model under μP (zoo.assembly.mup) exports with its score and
logit multipliers folded into the weights (:func:`folded_weights`). One table per class
(:data:`TABLES`) pairs every zoo key with its transformers key(s) and the layout between them, and
drives both directions (:func:`convert`).
zoo's fused layouts are split on the way out (``attn.qkv`` grouped by key/value head:
:func:`split_qkv`; ``mlp.gate_up`` interleaved: :func:`split_gate_up`); zoo's rotary pairs feature j
with j + d/2, as Llama's ``rotate_half`` does, so query and key rows need no permutation. GPT-2's
``Conv1D`` stores weights transposed. GPT-2's default activation is ``gelu_new`` (the tanh
approximation): zoo's ``gelu`` is exact, so exports say ``gelu`` and an import of ``gelu_new`` is
refused rather than silently changed.

``transformers`` is imported only inside these functions (the ``hf`` extra); nothing is downloaded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from einops import rearrange
from torch import nn

from zoo.core.errors import ConfigError
from zoo.core.registry import AXES
from zoo.models.language import LanguageModel, build_model
from zoo.parts.attention import Attention, fuse_qkv, split_qkv
from zoo.parts.mlps import fuse_gate_up, split_gate_up
from zoo.parts.positions import LearnedEmbedding, Rotary

INSTALL = 'pip install -e ".[hf]"'
#: zoo MLP -> transformers activation name (Llama's hidden_act for GLUs, GPT-2's activation_function).
GLU_ACTS = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu"}
PLAIN_ACTS = {"gelu": "gelu", "relu": "relu", "relu2": "relu2"}


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ImportError(f"Hugging Face export and import need transformers: {INSTALL}") from None
    return transformers


def part_name(axis: str, module: nn.Module | None) -> str:
    """The registered name of a built part (first of the names sharing its class), else its class name."""
    if module is None:
        return "none"
    names = [p.name for p in AXES[axis].parts() if type(module) is p.cls]
    return names[0] if names else type(module).__name__


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


def layer_shape(model: LanguageModel, i: int) -> Shape:
    block = model.blocks[i]
    attn, mlp, norm = block.attn, block.mlp, block.placement.norms[0]
    if not isinstance(attn, Attention):
        raise ConfigError(f"model.layers.{i}.attn", part_name("attn", attn), "no transformers counterpart")
    position = attn.position
    rotary = isinstance(position, Rotary)
    pos = "learned" if isinstance(model.pos_embed, LearnedEmbedding) else part_name("pos", position)
    if model.pos_embed is not None and not isinstance(model.pos_embed, LearnedEmbedding):
        pos = "sinusoidal"
    return Shape(
        placement=part_name("placement", block.placement),
        norm=part_name("norm", norm),
        norm_eps=float(getattr(norm, "eps", 0.0)),
        attn="mha" if attn.n_kv_heads == attn.n_heads else "gqa",
        qk_norm=part_name("norm", attn.q_norm),
        window=attn.window,
        softcap=attn.softcap,
        causal=attn.causal,
        n_heads=attn.n_heads,
        n_kv_heads=attn.n_kv_heads,
        pos=pos,
        rotary_base=position.base if rotary else None,
        rotary_fraction=position.rotated / attn.d_head if rotary else None,
        mlp=part_name("mlp", mlp),
        d_ff=mlp.hidden,
        bias=attn.qkv.bias is not None,
        max_len=model.pos_embed.weight.shape[0] if isinstance(model.pos_embed, LearnedEmbedding) else None,
    )


PLAIN_ATTENTION = [
    ("qk_norm", ("none",), "no qk_norm"),
    ("window", (None,), "no sliding window"),
    ("softcap", (None,), "no score softcap"),
    ("causal", (True,), "causal attention"),
]
#: Per target: (field, expected values, description) checks against a Shape.
TARGETS: dict[str, list[tuple[str, tuple[Any, ...], str]]] = {
    "LlamaForCausalLM": [
        ("placement", ("pre",), "pre-norm blocks"),
        ("norm", ("rmsnorm",), "RMSNorm"),
        *PLAIN_ATTENTION,
        ("pos", ("rotary",), "rotary positions"),
        ("rotary_fraction", (1.0,), "rotary over the whole head (rotary_fraction=1)"),
        ("mlp", tuple(GLU_ACTS), "a gated MLP (swiglu, geglu, reglu)"),
    ],
    "GPT2LMHeadModel": [
        ("placement", ("pre",), "pre-norm blocks"),
        ("norm", ("layernorm",), "LayerNorm"),
        ("attn", ("mha",), "multi-head attention (one key/value head per query head)"),
        *PLAIN_ATTENTION,
        ("pos", ("learned",), "learned absolute positions"),
        ("mlp", tuple(PLAIN_ACTS), "a plain MLP (gelu, relu, relu2)"),
        ("bias", (True,), "biases everywhere (block.bias=true)"),
    ],
}
#: Shape fields that are options of a part, not axes: where they sit in the config.
FIELDS = {
    "qk_norm": "block.attn.qk_norm",
    "window": "block.attn.window",
    "softcap": "block.attn.softcap",
    "rotary_fraction": "block.pos.rotary_fraction",
}


def target_for(model: LanguageModel) -> tuple[str, Shape]:
    """The transformers class that expresses ``model``, and its shape; a ConfigError names the part
    that has no counterpart in the nearest class."""
    shapes = [layer_shape(model, i) for i in range(len(model.blocks))]
    for i, shape in enumerate(shapes[1:], 1):
        if shape != shapes[0]:
            differ = next(f for f in shapes[0].__dataclass_fields__ if getattr(shape, f) != getattr(shapes[0], f))
            raise ConfigError(
                f"model.layers.{i}.{differ}",
                getattr(shape, differ),
                f"transformers classes repeat one block; layer 0 has {getattr(shapes[0], differ)!r}",
            )
    shape = shapes[0]
    misses = {
        name: [(f, getattr(shape, f), why) for f, ok, why in checks if getattr(shape, f) not in ok]
        for name, checks in TARGETS.items()
    }
    name = min(misses, key=lambda n: len(misses[n]))
    if misses[name]:
        field, value, why = misses[name][0]
        raise ConfigError(
            FIELDS.get(field, f"block.{field}"),
            value,
            f"no transformers class has a counterpart; the nearest, {name}, needs {why}",
        )
    return name, shape


# -- the key tables ------------------------------------------------------------------------------


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
            raise ValueError(f"{key}: no entry of {name}'s table maps it (zoo.models.hf.TABLES)")
        keys = [pattern.format(**values) for pattern in entry.keys(source)]
        missing = [k for k in keys if k not in weights]
        if missing:
            raise ValueError(f"{missing[0]}: missing, and {name}'s table needs it with {key}")
        layout = entry.layout.out if to == "hf" else entry.layout.back
        converted = layout([weights[k] for k in keys], shape)
        out.update(zip((pattern.format(**values) for pattern in entry.keys(target)), converted, strict=True))
        used.update(keys)
    return out


# -- export ---------------------------------------------------------------------------------------


def hf_config(model: LanguageModel, name: str, shape: Shape, *, tied: bool) -> Any:
    """The transformers config of ``model``; ``tied``: whether the exported head is the embedding."""
    transformers = _transformers()
    d_model, vocab = model.embed.embedding_dim, model.embed.num_embeddings
    common = {"vocab_size": vocab, "tie_word_embeddings": tied, "torch_dtype": "float32"}
    if name == "LlamaForCausalLM":
        return transformers.LlamaConfig(
            hidden_size=d_model,
            intermediate_size=shape.d_ff,
            num_hidden_layers=len(model.blocks),
            num_attention_heads=shape.n_heads,
            num_key_value_heads=shape.n_kv_heads,
            head_dim=d_model // shape.n_heads,
            hidden_act=GLU_ACTS[shape.mlp],
            rms_norm_eps=shape.norm_eps,
            rope_theta=shape.rotary_base,
            attention_bias=shape.bias,
            mlp_bias=shape.bias,
            max_position_embeddings=4096,
            **common,
        )
    return transformers.GPT2Config(
        n_embd=d_model,
        n_layer=len(model.blocks),
        n_head=shape.n_heads,
        n_inner=shape.d_ff,
        n_positions=shape.max_len,
        activation_function=PLAIN_ACTS[shape.mlp],
        layer_norm_epsilon=shape.norm_eps,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
        **common,
    )


def folded_weights(model: LanguageModel, shape: Shape) -> dict[str, torch.Tensor]:
    """``model``'s state dict (float32, detached copies) with the forward-time multipliers μP sets
    (zoo.assembly.mup.apply) folded into the weights, so a transformers class computes the same logits:

    - an attention's ``score_scale`` s (q . k x s instead of 1 / sqrt(d_head)): the query rows of
      ``attn.qkv`` (weight and bias) x s sqrt(d_head), which the standard 1 / sqrt(d_head) brings back
      to s (rotary rotates each position's query linearly, so it commutes with the factor);
    - the ``logit_scale`` m: the head x m; a tied head becomes an untied ``head.weight`` = m x the
      embedding (the input embedding unchanged).

    The rest of what μP sets is in the weights already (the init factors) or read only by the optimizer
    (``model.mup``), so nothing is refused. ``model`` itself is not changed."""
    weights = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    for i, block in enumerate(model.blocks):
        scale = block.attn.score_scale
        if scale is None:
            continue
        factor = scale * math.sqrt(block.attn.d_head)
        for p in ("weight", "bias"):
            if (key := f"blocks.{i}.attn.qkv.{p}") in weights:
                q, k, v = split_qkv(weights[key], shape.n_heads, shape.n_kv_heads)
                weights[key] = fuse_qkv(q * factor, k, v, shape.n_kv_heads)
    logit_scale = model.logit_scale
    if logit_scale is not None and logit_scale != 1.0:
        head = weights.get("head.weight", weights["embed.weight"])
        weights["head.weight"] = head * logit_scale
    return weights


def to_hf_model(model: LanguageModel) -> nn.Module:
    """A transformers model (float32, eval mode) computing the same logits as ``model``, μP's
    multipliers folded into its weights (:func:`folded_weights`; a tied head under a logit
    multiplier is exported untied)."""
    if not isinstance(model, LanguageModel):
        raise ConfigError("model", type(model).__name__, "a zoo LanguageModel (decoder-only)")
    name, shape = target_for(model)
    transformers = _transformers()
    zoo_weights = folded_weights(model, shape)
    tied = "head.weight" not in zoo_weights
    hf_model = getattr(transformers, name)(hf_config(model, name, shape, tied=tied))
    weights = convert(zoo_weights, name, shape, to="hf")
    missing, unexpected = hf_model.load_state_dict({k: v.contiguous() for k, v in weights.items()}, strict=False)
    assert not unexpected and set(missing) <= ({"lm_head.weight"} if tied else set()), (missing, unexpected)
    if tied:
        hf_model.tie_weights()
    return hf_model.float().eval()


def to_hf(model: LanguageModel, out_dir: str | Path) -> Path:
    """Write ``model`` as a transformers checkpoint (config.json + model.safetensors) in ``out_dir``;
    ``AutoModelForCausalLM.from_pretrained(out_dir)`` then computes the same logits."""
    out = Path(out_dir)
    to_hf_model(model).save_pretrained(out)
    return out


# -- import ---------------------------------------------------------------------------------------


def _rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise ConfigError("rope_parameters.rope_type", kind, "zoo's rotary is the default (unscaled) RoPE")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    return float(theta if theta is not None else 10000.0)


def zoo_config(config: Any) -> dict[str, Any]:
    """The zoo run config (``block`` and ``model`` sections) of a transformers Llama or GPT-2 config."""
    kind = getattr(config, "model_type", None)
    if kind == "llama":
        acts = {v: k for k, v in GLU_ACTS.items()}
        if config.hidden_act not in acts:
            raise ConfigError("hidden_act", config.hidden_act, f"one of {', '.join(acts)} (zoo's gated MLPs)")
        if config.attention_bias != config.mlp_bias:
            raise ConfigError("mlp_bias", config.mlp_bias, f"equal to attention_bias ({config.attention_bias})")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        if head_dim * config.num_attention_heads != config.hidden_size:
            raise ConfigError("head_dim", head_dim, "hidden_size / num_attention_heads (zoo's head size)")
        kv = config.num_key_value_heads or config.num_attention_heads
        block = {
            "d_model": config.hidden_size,
            "n_heads": config.num_attention_heads,
            "d_ff": config.intermediate_size,
            "bias": bool(config.attention_bias),
            "placement": "pre",
            "norm": {"name": "rmsnorm", "eps": float(config.rms_norm_eps)},
            "attn": {"name": "gqa", "n_kv_heads": kv},
            "pos": {"name": "rotary", "base": _rope_theta(config)},
            "mlp": acts[config.hidden_act],
        }
    elif kind == "gpt2":
        acts = {v: k for k, v in PLAIN_ACTS.items()}
        if config.activation_function not in acts:
            raise ConfigError(
                "activation_function",
                config.activation_function,
                f"one of {', '.join(acts)} (zoo's gelu is exact erf GELU; GPT-2's gelu_new is the tanh approximation)",
            )
        for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                        ("add_cross_attention", False)):  # fmt: skip
            if getattr(config, key, ok) != ok:
                raise ConfigError(key, getattr(config, key), f"{ok} (as zoo's attention computes)")
        block = {
            "d_model": config.n_embd,
            "n_heads": config.n_head,
            "d_ff": config.n_inner or 4 * config.n_embd,
            "bias": True,
            "max_len": config.n_positions,
            "placement": "pre",
            "norm": {"name": "layernorm", "eps": float(config.layer_norm_epsilon)},
            "attn": "mha",
            "pos": "learned",
            "mlp": acts[config.activation_function],
        }
    else:
        raise ConfigError("model_type", kind, "llama or gpt2 (the transformers classes zoo converts)")
    n_layers = config.num_hidden_layers
    model = {"vocab_size": config.vocab_size, "n_layers": n_layers, "tie_embeddings": bool(config.tie_word_embeddings)}
    return {"block": block, "model": model}


def from_hf(source: str | Path | nn.Module) -> LanguageModel:
    """A zoo LanguageModel from a transformers Llama or GPT-2: a local checkpoint folder (nothing is
    downloaded) or a loaded model. Same logits as the source, in float32, eval mode."""
    transformers = _transformers()
    if isinstance(source, nn.Module):
        hf_model = source
    else:
        folder = Path(source)
        if not (folder / "config.json").exists():
            raise ConfigError("source", str(source), "a local folder holding a transformers checkpoint (config.json)")
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    cfg = zoo_config(hf_model.config)
    model = build_model(cfg)
    weights = {k: v.detach().float() for k, v in hf_model.named_parameters()}  # a tied head once, as the embedding
    model.load_state_dict(convert(weights, CLASSES[hf_model.config.model_type], layer_shape(model, 0), to="zoo"))
    return model.eval()  # parameters float32 as built (.float() would also cast rotary's float64 buffer)
