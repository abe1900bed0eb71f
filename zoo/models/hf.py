"""Hugging Face ``transformers`` export and import: a zoo LanguageModel <-> a transformers causal LM.

Which zoo models have a transformers class (every layer alike, causal, no attention options such
as qk_norm, window or softcap):

| transformers class | placement | norm | attn | pos | mlp | bias |
|---|---|---|---|---|---|---|
| ``LlamaForCausalLM`` | pre | rmsnorm | mha, gqa, mqa | rotary (whole head) | swiglu, geglu, reglu | either |
| ``GPT2LMHeadModel`` | pre | layernorm | mha | learned | gelu, relu, relu2 | true |

Tied or untied embeddings either way; a model under μP (zoo.assembly.mup) exports with its score and
logit multipliers folded into the weights (:func:`folded_weights`). One table per class
(:data:`zoo.models.hf_tables.TABLES`) pairs every zoo key with its transformers key(s) and the layout between them, and
drives both directions (:func:`zoo.models.hf_tables.convert`).
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
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.core.errors import ConfigError
from zoo.core.registry import AXES
from zoo.models.hf_tables import CLASSES, Shape, convert
from zoo.models.language import LanguageModel, build_model
from zoo.parts.attention import Attention, fuse_qkv, split_qkv
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
        canon=block.canon_sites or "none",
        residual=part_name("residual", block.residual) if block.residual is not None else "add",
        value_residual=attn.value_residual,
        value_embeddings=model.value_embeds is not None,
    )


PLAIN_ATTENTION = [
    ("qk_norm", ("none",), "no qk_norm"),
    ("window", (None,), "no sliding window"),
    ("softcap", (None,), "no score softcap"),
    ("causal", (True,), "causal attention"),
    ("canon", ("none",), "no canon layers"),
    ("residual", ("add",), "the plain residual addition (residual=add)"),
    ("value_residual", ("none",), "no value residual"),
    ("value_embeddings", (False,), "no value embeddings"),
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
    "value_residual": "block.attn.value_residual",
    "value_embeddings": "model.value_embeddings",
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
    (``model.mup``), so nothing is refused. Multi-token prediction's extra heads (``mtp.*``) train beside the
    next-token head and predict nothing at inference: left out. ``model`` itself is not changed."""
    weights = {k: v.detach().float().clone() for k, v in model.state_dict().items() if not k.startswith("mtp.")}
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
