"""``GptOssForCausalLM``: pre-norm RMSNorm blocks; grouped-query attention with biases, heads of their own width
and a learned sink per head, on layers that are each sliding-window or full (``layer_types``, one
``sliding_window``); on every layer a mixture of experts, its router biased (the top k logits, then a softmax over
them: zoo's renormalized softmax gives the same weights) and its experts clamped SwiGLUs with biases, stored
stacked as ``x @ W`` (zoo's per-expert weights transposed), gate and up interleaved as zoo's ``gate_up`` rows.

zoo's rotary is the default RoPE: an export writes ``rope_type: default`` explicitly, and an import of a scaled
RoPE (the released checkpoints' YaRN) is refused by name. A zoo model's sliding layers and full layers export as
``layer_types``; an import's ``layer_types`` comes back as ``model.pattern``, its shortest repeating period."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zoo.core.errors import ConfigError
from zoo.core.options import option_defaults
from zoo.core.registry import MLPS
from zoo.models.hf.family import ANY, COMMON, Family, Holds, Refusal, layer_key, stacked, transformers_module
from zoo.models.hf.llama import PRE_RMSNORM_ROTARY, PRE_RMSNORM_ROTARY_WEIGHTS, shared_block, shared_sizes
from zoo.models.hf.weights import STACKED_EXPERTS_IN_OUT, per_layer

if TYPE_CHECKING:
    from zoo.models.language import LanguageModel

SLIDING, FULL = "sliding_attention", "full_attention"
#: gpt-oss's config keys for its experts' clamp and slope -> the options of zoo's expert (clamped_swiglu), which a
#: mixture of experts builds at their defaults.
EXPERT_OPTIONS = {"swiglu_limit": "limit", "swiglu_alpha": "alpha"}

_layer = per_layer("model.layers.{i}.")


def expert_defaults() -> dict[str, float]:
    """The clamp and slope of zoo's MoE experts, by gpt-oss's config keys."""
    defaults = option_defaults(MLPS.get("clamped_swiglu"))
    return {key: defaults[option] for key, option in EXPERT_OPTIONS.items()}


def windows_refused(layers: Sequence[Mapping[str, Any]]) -> list[Refusal]:
    """gpt-oss has one ``sliding_window``: every windowed layer needs the first one's window."""
    windows = [(i, layer.get("block.attn.window")) for i, layer in enumerate(layers) if layer.get("block.attn.window")]
    return [Refusal(layer_key("block.attn.window", i), w, f"the window of every sliding layer alike (layer "
                    f"{windows[0][0]} has {windows[0][1]}): gpt-oss has one sliding_window")  # fmt: skip
            for i, w in windows[1:] if w != windows[0][1]][:1]


def hf_config(model: LanguageModel, layers: Sequence[Mapping[str, Any]], tied: bool) -> Any:
    """The ``GptOssConfig`` of a model the family holds, every size and option explicit."""
    first, moe = layers[0], model.blocks[0].mlp
    windows = [layer["block.attn.window"] for layer in layers]
    sliding = [window for window in windows if window is not None]
    # With no sliding layer the class's own sliding_window (unused, but its masks need one) stands.
    sliding_window = {"sliding_window": sliding[0]} if sliding else {}
    return transformers_module().GptOssConfig(
        **shared_sizes(model, layers, tied),
        num_local_experts=moe.n_experts,
        num_experts_per_tok=moe.top_k,
        swiglu_limit=moe.experts[0].limit,
        swiglu_alpha=moe.experts[0].alpha,
        layer_types=[FULL if window is None else SLIDING for window in windows],
        **sliding_window,
        rope_parameters={"rope_type": "default", "rope_theta": first["block.pos.base"]},
        attention_bias=True,
    )


def pattern_of(layer_types: Sequence[str], window: int | None) -> list[dict[str, Any]]:
    """``model.pattern`` of ``layer_types``: its shortest repeating period, a sliding layer ``{attn: {window}}`` and a
    full one ``{}``; ``[]`` where every layer is alike (the block then says which)."""
    n = len(layer_types)
    period = next(p for p in range(1, n + 1) if all(layer_types[i] == layer_types[i % p] for i in range(n)))
    return [] if period == 1 else [{"attn": {"window": window}} if t == SLIDING else {} for t in layer_types[:period]]


def zoo_config(config: Any) -> dict[str, Any]:
    """The zoo config (``block``, ``model`` with its pattern) of a ``GptOssConfig``; what zoo cannot build (a scaled
    RoPE, attention without biases, other expert clamps, a layer type other than sliding or full) refused by name."""
    block = shared_block(config)  # a scaled RoPE refused first, by name
    if not config.attention_bias:
        raise ConfigError("attention_bias", config.attention_bias, "true: gpt-oss's experts always have biases, and "
                          "zoo's block.bias puts them on the attention and the experts alike")  # fmt: skip
    for key, default in expert_defaults().items():
        if getattr(config, key) != default:
            raise ConfigError(key, getattr(config, key), f"{default} (zoo's MoE experts, clamped_swiglu at its "
                              "defaults)")  # fmt: skip
    types = list(config.layer_types)
    for i, kind in enumerate(types):
        if kind not in (SLIDING, FULL):
            raise ConfigError(f"layer_types[{i}]", kind, f"{SLIDING} or {FULL}")
    if SLIDING in types and not config.sliding_window:
        raise ConfigError("sliding_window", config.sliding_window, f"a positive integer ({SLIDING} layers need one)")
    pattern = pattern_of(types, config.sliding_window)
    block["attn"]["sink"] = "learned"
    if not pattern and types[0] == SLIDING:
        block["attn"]["window"] = config.sliding_window
    block["bias"] = True
    block["mlp"] = {"name": "moe", "n_experts": config.num_local_experts, "top_k": config.num_experts_per_tok,
                    "expert": "clamped_swiglu", "router_bias": True}  # fmt: skip
    cfg = stacked(block, vocab_size=config.vocab_size, n_layers=config.num_hidden_layers,
                  tied=bool(config.tie_word_embeddings))  # fmt: skip
    cfg["model"]["pattern"] = pattern
    return cfg


GPT_OSS = Family(
    name="gpt_oss",
    hf_class="GptOssForCausalLM",
    model_type="gpt_oss",
    holds={
        **COMMON,
        **PRE_RMSNORM_ROTARY,
        "block.bias": Holds("biases (block.bias=true): gpt-oss's attention and experts have them", (True,)),
        "block.attn.window": ANY,
        "block.attn.sink": Holds("a learned sink per head (block.attn.sink=learned)", ("learned",)),
        "block.mlp": Holds("a mixture of experts (mlp=moe)", ("moe",)),
        "block.mlp.n_experts": ANY,
        "block.mlp.top_k": ANY,
        "block.mlp.expert": Holds("clamped SwiGLU experts (block.mlp.expert=clamped_swiglu)", ("clamped_swiglu",)),
        "block.mlp.router_bias": Holds("a router with a bias (block.mlp.router_bias=true)", (True,)),
    },
    weights=(
        *PRE_RMSNORM_ROTARY_WEIGHTS,
        _layer("attn.sink", "self_attn.sinks"),
        _layer("mlp.router.{p}", "mlp.router.{p}"),
        _layer("mlp.experts.{e}.gate_up.weight", "mlp.experts.gate_up_proj", STACKED_EXPERTS_IN_OUT),
        _layer("mlp.experts.{e}.gate_up.bias", "mlp.experts.gate_up_proj_bias", STACKED_EXPERTS_IN_OUT),
        _layer("mlp.experts.{e}.down.weight", "mlp.experts.down_proj", STACKED_EXPERTS_IN_OUT),
        _layer("mlp.experts.{e}.down.bias", "mlp.experts.down_proj_bias", STACKED_EXPERTS_IN_OUT),
    ),
    hf_config=hf_config,
    zoo_config=zoo_config,
    varies=frozenset({"block.attn.window"}),
    across=windows_refused,
)
