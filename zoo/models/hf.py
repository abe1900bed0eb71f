"""Hugging Face ``transformers`` export and import: a zoo LanguageModel <-> a transformers causal LM.

Which zoo models have a transformers class (every layer alike, causal, no attention options such
as qk_norm, window or softcap):

| transformers class | placement | norm | attn | pos | mlp | bias |
|---|---|---|---|---|---|---|
| ``LlamaForCausalLM`` | pre | rmsnorm | mha, gqa, mqa | rotary (whole head) | swiglu, geglu, reglu | either |
| ``GPT2LMHeadModel`` | pre | layernorm | mha | learned | gelu, relu, relu2 | true |

Tied or untied embeddings either way. zoo's fused layouts are split on the way out (``attn.qkv``
grouped by key/value head: :func:`split_qkv`; ``mlp.gate_up`` interleaved: :func:`split_gate_up`);
zoo's rotary pairs feature j with j + d/2, as Llama's ``rotate_half`` does, so query and key rows
need no permutation. GPT-2's ``Conv1D`` stores weights transposed. GPT-2's default activation is
``gelu_new`` (the tanh approximation): zoo's ``gelu`` is exact, so exports say ``gelu`` and an
import of ``gelu_new`` is refused rather than silently changed.

``transformers`` is imported only inside these functions (the ``hf`` extra); nothing is downloaded.
"""

from __future__ import annotations

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


# -- export ---------------------------------------------------------------------------------------


def hf_config(model: LanguageModel, name: str, shape: Shape) -> Any:
    transformers = _transformers()
    d_model, vocab = model.embed.embedding_dim, model.embed.num_embeddings
    tied = model.head is None
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


def llama_weights(model: LanguageModel, shape: Shape) -> dict[str, torch.Tensor]:
    sd = model.state_dict()
    out = {"model.embed_tokens.weight": sd["embed.weight"], "model.norm.weight": sd["final_norm.weight"]}
    for i in range(len(model.blocks)):
        z, h = f"blocks.{i}.", f"model.layers.{i}."
        for kind in ("weight", "bias") if shape.bias else ("weight",):
            q, k, v = split_qkv(sd[f"{z}attn.qkv.{kind}"], shape.n_heads, shape.n_kv_heads)
            gate, up = split_gate_up(sd[f"{z}mlp.gate_up.{kind}"])
            out |= {
                f"{h}self_attn.q_proj.{kind}": q,
                f"{h}self_attn.k_proj.{kind}": k,
                f"{h}self_attn.v_proj.{kind}": v,
                f"{h}self_attn.o_proj.{kind}": sd[f"{z}attn.out.{kind}"],
                f"{h}mlp.gate_proj.{kind}": gate,
                f"{h}mlp.up_proj.{kind}": up,
                f"{h}mlp.down_proj.{kind}": sd[f"{z}mlp.down.{kind}"],
            }
        out[f"{h}input_layernorm.weight"] = sd[f"{z}placement.norms.0.weight"]
        out[f"{h}post_attention_layernorm.weight"] = sd[f"{z}placement.norms.1.weight"]
    if model.head is not None:
        out["lm_head.weight"] = sd["head.weight"]
    return out


def gpt2_weights(model: LanguageModel, shape: Shape) -> dict[str, torch.Tensor]:
    sd = model.state_dict()
    out = {
        "transformer.wte.weight": sd["embed.weight"],
        "transformer.wpe.weight": sd["pos_embed.weight"],
        "transformer.ln_f.weight": sd["final_norm.weight"],
        "transformer.ln_f.bias": sd["final_norm.bias"],
    }
    for i in range(len(model.blocks)):
        z, h = f"blocks.{i}.", f"transformer.h.{i}."
        q, k, v = split_qkv(sd[f"{z}attn.qkv.weight"], shape.n_heads, shape.n_kv_heads)
        qb, kb, vb = split_qkv(sd[f"{z}attn.qkv.bias"], shape.n_heads, shape.n_kv_heads)
        out |= {  # Conv1D weights are (in, out): transposed
            f"{h}attn.c_attn.weight": rearrange(torch.cat([q, k, v]), "o i -> i o"),
            f"{h}attn.c_attn.bias": torch.cat([qb, kb, vb]),
            f"{h}attn.c_proj.weight": rearrange(sd[f"{z}attn.out.weight"], "o i -> i o"),
            f"{h}attn.c_proj.bias": sd[f"{z}attn.out.bias"],
            f"{h}mlp.c_fc.weight": rearrange(sd[f"{z}mlp.up.weight"], "o i -> i o"),
            f"{h}mlp.c_fc.bias": sd[f"{z}mlp.up.bias"],
            f"{h}mlp.c_proj.weight": rearrange(sd[f"{z}mlp.down.weight"], "o i -> i o"),
            f"{h}mlp.c_proj.bias": sd[f"{z}mlp.down.bias"],
        }
        for j, ln in ((0, "ln_1"), (1, "ln_2")):
            out[f"{h}{ln}.weight"] = sd[f"{z}placement.norms.{j}.weight"]
            out[f"{h}{ln}.bias"] = sd[f"{z}placement.norms.{j}.bias"]
    if model.head is not None:
        out["lm_head.weight"] = sd["head.weight"]
    return out


def to_hf_model(model: LanguageModel) -> nn.Module:
    """A transformers model (float32, eval mode) computing the same logits as ``model``."""
    if not isinstance(model, LanguageModel):
        raise ConfigError("model", type(model).__name__, "a zoo LanguageModel (decoder-only)")
    name, shape = target_for(model)
    transformers = _transformers()
    config = hf_config(model, name, shape)
    hf_model = getattr(transformers, name)(config)
    weights = (llama_weights if name == "LlamaForCausalLM" else gpt2_weights)(model, shape)
    missing, unexpected = hf_model.load_state_dict(
        {k: v.detach().float().contiguous() for k, v in weights.items()}, strict=False
    )
    tied = {"lm_head.weight"} if model.head is None else set()
    assert not unexpected and set(missing) <= tied, (missing, unexpected)
    if model.head is None:
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
    sd = {k: v.detach().float() for k, v in hf_model.state_dict().items()}
    convert = llama_to_zoo if hf_model.config.model_type == "llama" else gpt2_to_zoo
    model.load_state_dict(convert(sd, model, layer_shape(model, 0)), strict=True)
    return model.eval()  # parameters float32 as built (.float() would also cast rotary's float64 buffer)


def llama_to_zoo(sd: dict[str, torch.Tensor], model: LanguageModel, shape: Shape) -> dict[str, torch.Tensor]:
    """:func:`llama_weights` backwards."""
    out = {"embed.weight": sd["model.embed_tokens.weight"], "final_norm.weight": sd["model.norm.weight"]}
    for i in range(len(model.blocks)):
        z, h = f"blocks.{i}.", f"model.layers.{i}."
        for kind in ("weight", "bias") if shape.bias else ("weight",):
            q, k, v = (sd[f"{h}self_attn.{p}_proj.{kind}"] for p in "qkv")
            out |= {
                f"{z}attn.qkv.{kind}": fuse_qkv(q, k, v, shape.n_kv_heads),
                f"{z}attn.out.{kind}": sd[f"{h}self_attn.o_proj.{kind}"],
                f"{z}mlp.gate_up.{kind}": fuse_gate_up(sd[f"{h}mlp.gate_proj.{kind}"], sd[f"{h}mlp.up_proj.{kind}"]),
                f"{z}mlp.down.{kind}": sd[f"{h}mlp.down_proj.{kind}"],
            }
        out[f"{z}placement.norms.0.weight"] = sd[f"{h}input_layernorm.weight"]
        out[f"{z}placement.norms.1.weight"] = sd[f"{h}post_attention_layernorm.weight"]
    if model.head is not None:
        out["head.weight"] = sd["lm_head.weight"]
    return out


def gpt2_to_zoo(sd: dict[str, torch.Tensor], model: LanguageModel, shape: Shape) -> dict[str, torch.Tensor]:
    """:func:`gpt2_weights` backwards."""
    out = {
        "embed.weight": sd["transformer.wte.weight"],
        "pos_embed.weight": sd["transformer.wpe.weight"],
        "final_norm.weight": sd["transformer.ln_f.weight"],
        "final_norm.bias": sd["transformer.ln_f.bias"],
    }
    for i in range(len(model.blocks)):
        z, h = f"blocks.{i}.", f"transformer.h.{i}."
        q, k, v = rearrange(sd[f"{h}attn.c_attn.weight"], "i (three o) -> three o i", three=3)
        qb, kb, vb = rearrange(sd[f"{h}attn.c_attn.bias"], "(three o) -> three o", three=3)
        out |= {  # Conv1D weights are (in, out): transposed
            f"{z}attn.qkv.weight": fuse_qkv(q, k, v, shape.n_kv_heads),
            f"{z}attn.qkv.bias": fuse_qkv(qb, kb, vb, shape.n_kv_heads),
            f"{z}attn.out.weight": rearrange(sd[f"{h}attn.c_proj.weight"], "i o -> o i"),
            f"{z}attn.out.bias": sd[f"{h}attn.c_proj.bias"],
            f"{z}mlp.up.weight": rearrange(sd[f"{h}mlp.c_fc.weight"], "i o -> o i"),
            f"{z}mlp.up.bias": sd[f"{h}mlp.c_fc.bias"],
            f"{z}mlp.down.weight": rearrange(sd[f"{h}mlp.c_proj.weight"], "i o -> o i"),
            f"{z}mlp.down.bias": sd[f"{h}mlp.c_proj.bias"],
        }
        for j, ln in ((0, "ln_1"), (1, "ln_2")):
            out[f"{z}placement.norms.{j}.weight"] = sd[f"{h}{ln}.weight"]
            out[f"{z}placement.norms.{j}.bias"] = sd[f"{h}{ln}.bias"]
    if model.head is not None:
        out["head.weight"] = sd["lm_head.weight"]
    return out
