"""``Gemma3ForCausalLM`` (Gemma 3's text model, ``gemma3_text``): sandwich-norm blocks (a norm before and after each
branch), every RMSNorm zero-centred (1 + w) including the q/k norms, grouped-query attention with heads of
``head_dim`` features and scores scaled by ``query_pre_attn_scalar``^-0.5, a gated MLP, the token embedding times
sqrt(d_model). Its layers are of two kinds (``layer_types``): sliding-window layers, each query seeing the last
``sliding_window`` keys (itself included, as zoo's ``block.attn.window``), and global ones, each kind with its own
rotary base (``rope_parameters``). A zoo model whose windowed layers share one window and one base, and whose
global layers share another base, maps onto it; the pattern comes back from ``layer_types`` on import.

What zoo cannot build is refused by name on import: a scaled RoPE (the released 4B, 12B and 27B scale their global
layers' linearly, by 8), bidirectional attention, attention biases. ``attn_logit_softcapping`` is read by no part
of transformers' Gemma 3 (its attention is given no softcap), so it changes no logit and is not imported."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zoo.core.errors import ConfigError
from zoo.models.hf.family import (
    ANY,
    COMMON,
    Family,
    Holds,
    Refusal,
    hf_activation,
    layer_key,
    stacked,
    transformers_module,
    zoo_mlp,
)
from zoo.models.hf.llama import GLU_ACTS, shared_sizes
from zoo.models.hf.weights import SPLIT_GATE_UP, SPLIT_QKV, Entry, per_layer

if TYPE_CHECKING:
    from zoo.models.language import LanguageModel

#: transformers' layer kinds: a sliding-window layer and a global one.
LOCAL, GLOBAL = "sliding_attention", "full_attention"
WINDOW, BASE = "block.attn.window", "block.pos.base"
#: The window of a model with no sliding-window layer (Gemma3TextConfig's default): transformers builds the mask of
#: one whatever its layers, and no layer reads it.
UNUSED_WINDOW = 4096

_layer = per_layer("model.layers.{i}.")


def kind(layer: Mapping[str, Any]) -> str:
    """A layer's kind: sliding-window where it has a window, else global."""
    return LOCAL if layer.get(WINDOW) is not None else GLOBAL


def kinds_agree(layers: Sequence[Mapping[str, Any]]) -> list[Refusal]:
    """Gemma 3 holds one window for all its sliding-window layers and one rotary base per kind of layer: the first
    layer of each kind sets them, and a later one that differs is refused."""
    found, first = [], {}
    for i, layer in enumerate(layers):
        for key in (WINDOW, BASE):
            seen = first.setdefault((kind(layer), key), (i, layer.get(key)))
            if layer.get(key) != seen[1]:
                needs = f"one {key} on every {kind(layer)} layer (layer {seen[0]} has {seen[1]!r})"
                found.append(Refusal(layer_key(key, i), layer.get(key), needs))
    return found


def hf_config(model: LanguageModel, layers: Sequence[Mapping[str, Any]], tied: bool) -> Any:
    """The ``Gemma3TextConfig`` of a model the family holds: its layer kinds, window and each kind's base explicit."""
    first, attn = layers[0], model.blocks[0].attn
    of_kind = {k: [layer for layer in layers if kind(layer) == k] for k in (LOCAL, GLOBAL)}
    bases = {k: (of_kind[k] or layers)[0][BASE] for k in (LOCAL, GLOBAL)}  # a kind no layer has: the other's
    return transformers_module().Gemma3TextConfig(
        **{**shared_sizes(model, layers, tied), "max_position_embeddings": first["block.max_len"] or 131_072},
        query_pre_attn_scalar=first["block.attn.scale_dim"] or attn.d_head,
        hidden_activation=hf_activation(GLU_ACTS[first["block.mlp"]], first),
        layer_types=[kind(layer) for layer in layers],
        sliding_window=of_kind[LOCAL][0][WINDOW] if of_kind[LOCAL] else UNUSED_WINDOW,
        rope_parameters={k: {"rope_type": "default", "rope_theta": bases[k]} for k in (LOCAL, GLOBAL)},
        final_logit_softcapping=first["model.logit_softcap"],
        attn_logit_softcapping=None,
        attention_bias=False,
        use_bidirectional_attention=False,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    )


def rope_base(config: Any, layer_type: str) -> float:
    """The rotary base of one kind of layer; a scaled RoPE (the released 4B's and larger: linear, by 8, on the
    global layers) is refused naming the kind."""
    params = (getattr(config, "rope_parameters", None) or {}).get(layer_type) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ConfigError(f"rope_parameters.{layer_type}.rope_type", rope_type,
                          "default: zoo's rotary is the unscaled RoPE")  # fmt: skip
    return float(params["rope_theta"])


def zoo_config(config: Any) -> dict[str, Any]:
    """The zoo config (``block`` and ``model``, its ``pattern`` from ``layer_types``) of a ``Gemma3TextConfig``:
    the block is a global layer's, each sliding-window layer's pattern entry sets its window and base."""
    acts = {v: k for k, v in GLU_ACTS.items()}
    try:
        mlp = zoo_mlp(config.hidden_activation, acts)
    except KeyError:
        raise ConfigError("hidden_activation", config.hidden_activation,
                          f"one of {', '.join(acts)} or gelu_pytorch_tanh (zoo's gated MLPs)") from None  # fmt: skip
    for key, allowed in (("attention_bias", False), ("use_bidirectional_attention", False)):
        if getattr(config, key, allowed):
            raise ConfigError(key, getattr(config, key), f"{allowed}: zoo's Gemma 3 layers are causal and bias-free")
    types = list(config.layer_types)
    if LOCAL in types and not config.sliding_window:
        raise ConfigError("sliding_window", config.sliding_window, f"a positive integer (layer_types has {LOCAL})")
    attn: dict[str, Any] = {"name": "gqa", "n_kv_heads": config.num_key_value_heads, "head_dim": config.head_dim,
                            "qk_norm": "rmsnorm"}  # fmt: skip
    if config.query_pre_attn_scalar != config.head_dim:
        attn["scale_dim"] = config.query_pre_attn_scalar
    block = {
        "d_model": config.hidden_size,
        "n_heads": config.num_attention_heads,
        "d_ff": config.intermediate_size,
        "bias": False,
        "placement": "sandwich",
        "norm": {"name": "rmsnorm", "eps": float(config.rms_norm_eps), "zero_centred": True},
        "attn": attn,
        "pos": {"name": "rotary", "base": rope_base(config, GLOBAL)},
        "mlp": mlp,
    }
    local = {"attn": {"window": config.sliding_window}, "pos": {"base": rope_base(config, LOCAL)}}
    period = next(p for p in range(1, len(types) + 1) if all(t == types[i % p] for i, t in enumerate(types)))
    pattern = [] if types == [GLOBAL] * len(types) else [local if t == LOCAL else {} for t in types[:period]]
    zoo = stacked(block, vocab_size=config.vocab_size, n_layers=config.num_hidden_layers,
                  tied=bool(config.tie_word_embeddings))  # fmt: skip
    zoo["model"].update(scale_embedding=True, logit_softcap=config.final_logit_softcapping, pattern=pattern)
    return zoo


GEMMA3 = Family(
    name="gemma3",
    hf_class="Gemma3ForCausalLM",
    model_type="gemma3_text",
    holds={
        **COMMON,
        "block.n_heads": Holds("n_heads dividing d_model (Gemma3TextConfig's check of hidden_size)",
                               accepts=lambda value, layer: layer["block.d_model"] % value == 0),  # fmt: skip
        "block.bias": Holds("no biases (block.bias=false)", (False,)),
        "block.placement": Holds("sandwich norms (placement=sandwich)", ("sandwich",)),
        "block.norm": Holds("RMSNorm (norm=rmsnorm)", ("rmsnorm",)),
        "block.norm.eps": ANY,
        "block.norm.zero_centred": Holds("zero-centred RMSNorm (block.norm.zero_centred=true)", (True,)),
        "block.attn": Holds("softmax attention (attn=mha, gqa or mqa)", ("mha", "gqa", "mqa")),
        "block.attn.n_kv_heads": ANY,
        "block.attn.head_dim": ANY,
        "block.attn.scale_dim": ANY,
        "block.attn.qk_norm": Holds("the block's RMSNorm on queries and keys (block.attn.qk_norm=rmsnorm)",
                                    ("rmsnorm",)),  # fmt: skip
        WINDOW: ANY,
        "block.pos": Holds("rotary positions (pos=rotary)", ("rotary",)),
        BASE: ANY,
        "block.mlp": Holds("a gated MLP (mlp=swiglu, geglu or reglu)", tuple(GLU_ACTS)),
        "block.mlp.approximate": ANY,
        "model.scale_embedding": Holds("the embedding times sqrt(d_model) (model.scale_embedding=true)", (True,)),
        "model.logit_softcap": ANY,
    },
    weights=(
        Entry(("embed.weight",), ("model.embed_tokens.weight",)),
        _layer("placement.norms.0.weight", "input_layernorm.weight"),
        _layer("attn.qkv.weight", "self_attn.q_proj.weight self_attn.k_proj.weight self_attn.v_proj.weight",
               SPLIT_QKV),  # fmt: skip
        _layer("attn.q_norm.weight", "self_attn.q_norm.weight"),
        _layer("attn.k_norm.weight", "self_attn.k_norm.weight"),
        _layer("attn.out.weight", "self_attn.o_proj.weight"),
        _layer("placement.out_norms.0.weight", "post_attention_layernorm.weight"),
        _layer("placement.norms.1.weight", "pre_feedforward_layernorm.weight"),
        _layer("mlp.gate_up.weight", "mlp.gate_proj.weight mlp.up_proj.weight", SPLIT_GATE_UP),
        _layer("mlp.down.weight", "mlp.down_proj.weight"),
        _layer("placement.out_norms.1.weight", "post_feedforward_layernorm.weight"),
        Entry(("final_norm.weight",), ("model.norm.weight",)),
        Entry(("head.weight",), ("lm_head.weight",)),
    ),
    hf_config=hf_config,
    zoo_config=zoo_config,
    varies=frozenset({WINDOW, BASE}),
    across=kinds_agree,
)
