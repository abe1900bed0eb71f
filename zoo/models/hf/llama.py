"""``LlamaForCausalLM``: pre-norm RMSNorm blocks, rotary over the whole head, softmax attention with any number
of key/value heads, a gated MLP. zoo's rotary pairs feature j with j + d/2, as Llama's ``rotate_half`` does, so
no query or key rows are permuted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zoo.core.errors import ConfigError
from zoo.models.hf.family import ANY, COMMON, Family, Holds, hf_activation, stacked, transformers_module, zoo_mlp
from zoo.models.hf.weights import SPLIT_GATE_UP, SPLIT_QKV, Entry, per_layer

if TYPE_CHECKING:
    from zoo.models.language import LanguageModel

#: zoo's gated MLP -> Llama's hidden_act.
GLU_ACTS = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu"}


_layer = per_layer("model.layers.{i}.")

#: What Llama's layout holds, and the families that share it (gpt-oss): pre-norm RMSNorm blocks, softmax attention
#: with any number of key/value heads of any width, rotary over the whole head.
PRE_RMSNORM_ROTARY = {
    "block.placement": Holds("pre-norm blocks (placement=pre)", ("pre",)),
    "block.norm": Holds("RMSNorm (norm=rmsnorm)", ("rmsnorm",)),
    "block.norm.eps": ANY,
    "block.attn": Holds("softmax attention (attn=mha, gqa or mqa)", ("mha", "gqa", "mqa")),
    "block.attn.n_kv_heads": ANY,
    "block.attn.head_dim": ANY,
    "block.pos": Holds("rotary positions (pos=rotary)", ("rotary",)),
    "block.pos.base": ANY,
    "block.pos.rotary_fraction": Holds("rotary over the whole head (block.pos.rotary_fraction=1)", (1.0,)),
}

#: The weights of that layout outside the MLP: the embedding, each layer's norms and attention, the final norm and
#: the untied head (``model.`` ... and ``lm_head``, as Llama and gpt-oss name them).
PRE_RMSNORM_ROTARY_WEIGHTS = (
    Entry(("embed.weight",), ("model.embed_tokens.weight",)),
    _layer("placement.norms.0.weight", "input_layernorm.weight"),
    _layer("attn.qkv.{p}", "self_attn.q_proj.{p} self_attn.k_proj.{p} self_attn.v_proj.{p}", SPLIT_QKV),
    _layer("attn.out.{p}", "self_attn.o_proj.{p}"),
    _layer("placement.norms.1.weight", "post_attention_layernorm.weight"),
    Entry(("final_norm.weight",), ("model.norm.weight",)),
    Entry(("head.weight",), ("lm_head.weight",)),
)


def shared_sizes(model: LanguageModel, layers: Sequence[Mapping[str, Any]], tied: bool) -> dict[str, Any]:
    """The config keys Llama and gpt-oss name alike: sizes, heads, the norm's eps, the context, the tied head."""
    first, attn = layers[0], model.blocks[0].attn
    return {
        "vocab_size": model.embed.num_embeddings,
        "hidden_size": model.embed.embedding_dim,
        "intermediate_size": model.blocks[0].mlp.hidden,
        "num_hidden_layers": len(model.blocks),
        "num_attention_heads": attn.n_heads,
        "num_key_value_heads": attn.n_kv_heads,
        "head_dim": attn.d_head,
        "rms_norm_eps": first["block.norm.eps"],
        "max_position_embeddings": first["block.max_len"] or 4096,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
    }


def hf_config(model: LanguageModel, layers: Sequence[Mapping[str, Any]], tied: bool) -> Any:
    """The ``LlamaConfig`` of a model the family holds."""
    first = layers[0]
    return transformers_module().LlamaConfig(
        **shared_sizes(model, layers, tied),
        hidden_act=hf_activation(GLU_ACTS[first["block.mlp"]], first),
        rope_theta=first["block.pos.base"],
        attention_bias=first["block.bias"],
        mlp_bias=first["block.bias"],
    )


def rope_theta(config: Any) -> float:
    """The default RoPE's base of a transformers config; any scaled RoPE is refused by name."""
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise ConfigError("rope_parameters.rope_type", kind, "zoo's rotary is the default (unscaled) RoPE")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    return float(theta if theta is not None else 10000.0)


def zoo_config(config: Any) -> dict[str, Any]:
    """The zoo config (``block`` and ``model``) of a ``LlamaConfig``."""
    acts = {v: k for k, v in GLU_ACTS.items()}
    try:
        mlp = zoo_mlp(config.hidden_act, acts)
    except KeyError:
        raise ConfigError(
            "hidden_act", config.hidden_act, f"one of {', '.join(acts)} or gelu_pytorch_tanh (zoo's gated MLPs)"
        ) from None
    if config.attention_bias != config.mlp_bias:
        raise ConfigError("mlp_bias", config.mlp_bias, f"equal to attention_bias ({config.attention_bias})")
    block = {**shared_block(config), "bias": bool(config.attention_bias), "mlp": mlp}
    return stacked(block, vocab_size=config.vocab_size, n_layers=config.num_hidden_layers,
                   tied=bool(config.tie_word_embeddings))  # fmt: skip


def shared_block(config: Any) -> dict[str, Any]:
    """The zoo block settings of a Llama-like config (Llama's, gpt-oss's) outside its biases and MLP: sizes,
    pre-norm RMSNorm, grouped-query attention (its head width where it is not d_model / n_heads), rotary (a scaled
    RoPE refused by name)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attn = {"name": "gqa", "n_kv_heads": config.num_key_value_heads or config.num_attention_heads}
    if head_dim * config.num_attention_heads != config.hidden_size:  # heads wider or narrower (Qwen3's)
        attn["head_dim"] = head_dim
    return {
        "d_model": config.hidden_size,
        "n_heads": config.num_attention_heads,
        "d_ff": config.intermediate_size,
        "placement": "pre",
        "norm": {"name": "rmsnorm", "eps": float(config.rms_norm_eps)},
        "attn": attn,
        "pos": {"name": "rotary", "base": rope_theta(config)},
    }

LLAMA = Family(
    name="llama",
    hf_class="LlamaForCausalLM",
    model_type="llama",
    holds={
        **COMMON,
        "block.bias": ANY,
        **PRE_RMSNORM_ROTARY,
        "block.mlp": Holds("a gated MLP (mlp=swiglu, geglu or reglu)", tuple(GLU_ACTS)),
        "block.mlp.approximate": ANY,
    },
    weights=(
        *PRE_RMSNORM_ROTARY_WEIGHTS,
        _layer("mlp.gate_up.{p}", "mlp.gate_proj.{p} mlp.up_proj.{p}", SPLIT_GATE_UP),
        _layer("mlp.down.{p}", "mlp.down_proj.{p}"),
    ),
    hf_config=hf_config,
    zoo_config=zoo_config,
)
