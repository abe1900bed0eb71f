"""``OlmoHybridForCausalLM``: Gated DeltaNet layers and softmax attention layers in the order of the config's
``layer_types``. An attention layer (``full_attention``) is OLMo 3's: reordered norms (``x + norm(f(x))``), an
RMSNorm over all the queries jointly and one over all the keys, rotary positions or none (NoPE: the released
checkpoint's ``rope_theta`` is null). A Gated DeltaNet layer (``linear_attention``) is pre-norm, never rotated,
with negative eigenvalues allowed or not, its own key and value head counts and widths, and fla's output-norm
epsilon (1e-5). Both take a SwiGLU MLP (``hidden_act`` silu is also the convolution's activation) and no biases.

zoo's Gated DeltaNet holds q, k and v in one projection grouped by key head and its convolution's kernel less the
identity tap; OLMo-Hybrid holds separate projections and one kernel over every query, key and value channel
(:data:`~zoo.models.hf.weights.SPLIT_DELTA_QKV`, :data:`~zoo.models.hf.weights.DELTA_CONV`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zoo.core.errors import ConfigError
from zoo.models.hf.family import ANY, COMMON, Family, Holds, Refusal, stacked, transformers_module
from zoo.models.hf.llama import rope_theta
from zoo.models.hf.weights import DELTA_CONV, SPLIT_DELTA_QKV, SPLIT_GATE_UP, SPLIT_QKV, Entry, per_layer

if TYPE_CHECKING:
    from zoo.models.language import LanguageModel

LINEAR, FULL = "linear_attention", "full_attention"
#: The softmax attentions a full-attention layer may be (one key/value head count for all).
SOFTMAX = ("mha", "gqa", "mqa")


def layer_type(layer: Mapping[str, Any]) -> str:
    """A layer's ``layer_types`` entry: ``linear_attention`` for a Gated DeltaNet layer, else ``full_attention``."""
    return LINEAR if layer["block.attn"] == "gated_deltanet" else FULL


def by_type(placement: Mapping[str, str], what: str) -> Holds:
    """Holds a setting whose value the layer's type fixes (``placement``: layer type -> value)."""
    return Holds(what, accepts=lambda value, layer: value == placement[layer_type(layer)])


def whole_heads(value: Any, layer: Mapping[str, Any]) -> bool:
    """An attention layer's heads d_model / n_heads wide (OLMo-Hybrid has no head_dim); a Gated DeltaNet layer's
    value heads any width (its linear_value_head_dim)."""
    return layer_type(layer) == LINEAR or value in (None, layer["block.d_model"] // layer["block.n_heads"])


def both_types(layers: Sequence[Mapping[str, Any]]) -> list[Refusal]:
    """OLMo-Hybrid needs at least one layer of each type."""
    types = {layer_type(layer) for layer in layers}
    if types == {LINEAR, FULL}:
        return []
    needs = ("at least one gated_deltanet layer and one softmax attention layer (model.pattern, e.g. three "
             "gated_deltanet layers to one attention layer)")  # fmt: skip
    return [Refusal("block.attn", layers[0]["block.attn"], needs)]


_attention = per_layer("model.layers.{i}.", SOFTMAX)
_delta = per_layer("model.layers.{i}.", ("gated_deltanet",))
_mlp = per_layer("model.layers.{i}.")


def hf_config(model: LanguageModel, layers: Sequence[Mapping[str, Any]], tied: bool) -> Any:
    """The ``OlmoHybridConfig`` of a model the family holds, every size explicit."""
    types = [layer_type(layer) for layer in layers]
    full, linear = types.index(FULL), types.index(LINEAR)
    attn, delta = model.blocks[full].attn, model.blocks[linear].attn
    theta = layers[full].get("block.pos.base") if layers[full]["block.pos"] == "rotary" else None
    return transformers_module().OlmoHybridConfig(
        vocab_size=model.embed.num_embeddings,
        hidden_size=model.embed.embedding_dim,
        intermediate_size=model.blocks[0].mlp.hidden,
        num_hidden_layers=len(model.blocks),
        num_attention_heads=attn.n_heads,
        num_key_value_heads=attn.n_kv_heads,
        hidden_act="silu",
        max_position_embeddings=layers[0]["block.max_len"] or 4096,
        rms_norm_eps=layers[0]["block.norm.eps"],
        tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": theta},  # theta None: NoPE
        attention_bias=False,
        layer_types=types,
        linear_num_key_heads=delta.n_key_heads,
        linear_num_value_heads=delta.n_heads,
        linear_key_head_dim=delta.d_key,
        linear_value_head_dim=delta.d_head,
        linear_conv_kernel_dim=delta.conv.shape[-1],
        linear_allow_neg_eigval=bool(layers[linear]["block.attn.allow_neg_eigval"]),
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        torch_dtype="float32",
    )


def period(types: Sequence[str]) -> int:
    """The shortest p with types[i] == types[i % p] for every i (the pattern that repeats over the depth)."""
    return next(p for p in range(1, len(types) + 1) if all(t == types[i % p] for i, t in enumerate(types)))


def zoo_config(config: Any) -> dict[str, Any]:
    """The zoo config of an ``OlmoHybridConfig``: the attention layers' block, and a pattern whose Gated DeltaNet
    entries override it; anything zoo cannot build is refused by the config's field."""
    types = list(config.layer_types)
    for t in types:
        if t not in (LINEAR, FULL):
            raise ConfigError("layer_types", t, f"{LINEAR} or {FULL}")
    if config.hidden_act != "silu":
        raise ConfigError("hidden_act", config.hidden_act, "silu (zoo's Gated DeltaNet convolution and SwiGLU)")
    if config.attention_bias:
        raise ConfigError("attention_bias", config.attention_bias, "false (zoo's block.bias is every layer's)")
    heads, kv = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    values, keys = config.linear_num_value_heads, config.linear_num_key_heads
    if values % keys:
        raise ConfigError("linear_num_key_heads", keys, f"must divide linear_num_value_heads={values}")
    rope = getattr(config, "rope_parameters", None) or {}
    pos: dict[str, Any] = {"name": "none"}
    if rope.get("rope_theta") is not None:
        pos = {"name": "rotary", "base": rope_theta(config)}
    attn: dict[str, Any] = {"name": "mha"} if kv == heads else {"name": "gqa", "n_kv_heads": kv}
    attn |= {"qk_norm": "rmsnorm", "qk_norm_scope": "all_heads"}
    if config.hidden_size % heads:
        attn["head_dim"] = config.hidden_size // heads  # as OlmoHybridAttention's head_dim
    block = {
        "d_model": config.hidden_size, "n_heads": heads, "d_ff": config.intermediate_size, "bias": False,
        "placement": "reordered", "norm": {"name": "rmsnorm", "eps": float(config.rms_norm_eps)}, "attn": attn,
        "pos": pos, "mlp": "swiglu",
    }  # fmt: skip
    delta = {
        "name": "gated_deltanet", "d_key": config.linear_key_head_dim, "head_dim": config.linear_value_head_dim,
        "conv": config.linear_conv_kernel_dim, "allow_neg_eigval": bool(config.linear_allow_neg_eigval),
        **({} if keys == values else {"n_key_heads": keys}),
    }  # fmt: skip
    linear = {"placement": "pre", "pos": "none", "attn": delta, **({} if values == heads else {"n_heads": values})}
    out = stacked(block, vocab_size=config.vocab_size, n_layers=config.num_hidden_layers,
                  tied=bool(config.tie_word_embeddings))  # fmt: skip
    out["model"]["pattern"] = [linear if t == LINEAR else {} for t in types[: period(types)]]
    return out


OLMO_HYBRID = Family(
    name="olmo_hybrid",
    hf_class="OlmoHybridForCausalLM",
    model_type="olmo_hybrid",
    holds={
        **COMMON,
        "block.bias": Holds("no biases (block.bias=false)", (False,)),
        "block.placement": by_type({FULL: "reordered", LINEAR: "pre"}, "reordered norms on attention layers "
                                   "(placement=reordered), pre-norm on Gated DeltaNet layers (placement=pre)"),
        "block.norm": Holds("RMSNorm (norm=rmsnorm)", ("rmsnorm",)),
        "block.norm.eps": ANY,
        "block.attn": Holds("Gated DeltaNet or softmax attention layers (attn=gated_deltanet, mha, gqa or mqa)",
                            ("gated_deltanet", *SOFTMAX)),  # fmt: skip
        "block.attn.n_kv_heads": ANY,
        "block.attn.head_dim": Holds("attention heads d_model / n_heads wide (block.attn.head_dim=null)",
                                     accepts=whole_heads),  # fmt: skip
        "block.attn.qk_norm": Holds("a joint RMSNorm on queries and keys (block.attn.qk_norm=rmsnorm)", ("rmsnorm",)),
        "block.attn.qk_norm_scope": Holds("the qk-norm over all heads (block.attn.qk_norm_scope=all_heads)",
                                          ("all_heads",)),  # fmt: skip
        **{f"block.attn.{key}": ANY for key in ("d_key", "n_key_heads", "conv", "chunk", "allow_neg_eigval")},
        "block.attn.norm_eps": Holds("fla's output-norm epsilon (block.attn.norm_eps=1e-05)", (1e-5,)),
        "block.pos": Holds("rotary or no positions on attention layers, none on Gated DeltaNet layers",
                           accepts=lambda value, layer: value == "none" or (value == "rotary" and
                                                                             layer_type(layer) == FULL)),  # fmt: skip
        "block.pos.base": ANY,
        "block.pos.rotary_fraction": Holds("rotary over the whole head (block.pos.rotary_fraction=1)", (1.0,)),
        "block.mlp": Holds("SwiGLU (mlp=swiglu: silu is also the convolution's activation)", ("swiglu",)),
    },
    weights=(
        Entry(("embed.weight",), ("model.embed_tokens.weight",)),
        _attention("attn.qkv.weight", "self_attn.q_proj.weight self_attn.k_proj.weight self_attn.v_proj.weight",
                   SPLIT_QKV),  # fmt: skip
        _attention("attn.out.weight", "self_attn.o_proj.weight"),
        _attention("attn.q_norm.weight", "self_attn.q_norm.weight"),
        _attention("attn.k_norm.weight", "self_attn.k_norm.weight"),
        _attention("placement.norms.0.weight", "post_attention_layernorm.weight"),
        _attention("placement.norms.1.weight", "post_feedforward_layernorm.weight"),
        _delta("attn.qkv.weight", "linear_attn.q_proj.weight linear_attn.k_proj.weight linear_attn.v_proj.weight",
               SPLIT_DELTA_QKV),  # fmt: skip
        _delta("attn.conv", "linear_attn.conv1d.weight", DELTA_CONV),
        _delta("attn.beta.weight", "linear_attn.b_proj.weight"),
        _delta("attn.decay.weight", "linear_attn.a_proj.weight"),
        _delta("attn.a_log", "linear_attn.A_log"),
        _delta("attn.dt", "linear_attn.dt_bias"),
        _delta("attn.norm.weight", "linear_attn.o_norm.weight"),
        _delta("attn.gate.weight", "linear_attn.g_proj.weight"),
        _delta("attn.out.weight", "linear_attn.o_proj.weight"),
        _delta("placement.norms.0.weight", "input_layernorm.weight"),
        _delta("placement.norms.1.weight", "post_attention_layernorm.weight"),
        _mlp("mlp.gate_up.weight", "mlp.gate_proj.weight mlp.up_proj.weight", SPLIT_GATE_UP),
        _mlp("mlp.down.weight", "mlp.down_proj.weight"),
        Entry(("final_norm.weight",), ("model.norm.weight",)),
        Entry(("head.weight",), ("lm_head.weight",)),
    ),
    hf_config=hf_config,
    zoo_config=zoo_config,
    varies=frozenset({"block.attn", "block.placement", "block.pos", "block.n_heads", "block.attn.head_dim",
                      "block.attn.backend"}),  # fmt: skip
    alike_within={key: "block.attn" for key in ("block.placement", "block.pos", "block.n_heads", "block.attn.head_dim",
                                                "block.attn.backend")},  # one of each per layer type
    across=both_types,
)
