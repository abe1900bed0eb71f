"""``SmolLM3ForCausalLM``: Llama's block (pre-norm RMSNorm, grouped-query attention, a gated MLP) with rotary on
some layers and none on the others (``no_rope_layers``: 1 for a rotary layer, 0 for a NoPE one; SmolLM3-3B drops
it on every fourth). Its weights are Llama's, key for key. zoo writes the NoPE layers as a ``model.pattern`` of
``{pos: none}`` entries (the shortest period of ``no_rope_layers``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zoo.core.errors import ConfigError
from zoo.models.hf import llama
from zoo.models.hf.family import Family, Holds, hf_activation, transformers_module

if TYPE_CHECKING:
    from zoo.models.language import LanguageModel


def hf_config(model: LanguageModel, layers: Sequence[Mapping[str, Any]], tied: bool) -> Any:
    """The ``SmolLM3Config`` of a model the family holds: Llama's settings, each layer's rotary or none explicit."""
    first = layers[0]
    rotary = next((layer for layer in layers if layer["block.pos"] == "rotary"), {"block.pos.base": 10000.0})
    return transformers_module().SmolLM3Config(
        **llama.shared_sizes(model, layers, tied),  # head_dim read by SmolLM3's attention when set
        hidden_act=hf_activation(llama.GLU_ACTS[first["block.mlp"]], first),
        rope_parameters={"rope_type": "default", "rope_theta": rotary["block.pos.base"]},
        no_rope_layers=[int(layer["block.pos"] == "rotary") for layer in layers],
        layer_types=["full_attention"] * len(layers),
        use_sliding_window=False,
        attention_bias=first["block.bias"],
        mlp_bias=first["block.bias"],
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    )


def period(flags: Sequence[int]) -> int:
    """The shortest p with flags[i] == flags[i % p] for every i."""
    return next(p for p in range(1, len(flags) + 1) if all(f == flags[i % p] for i, f in enumerate(flags)))


def zoo_config(config: Any) -> dict[str, Any]:
    """The zoo config (``block`` and ``model``) of a ``SmolLM3Config``: Llama's, the NoPE layers as a pattern."""
    if config.use_sliding_window and config.sliding_window is not None:
        raise ConfigError("use_sliding_window", True, "false (zoo's SmolLM3 has no sliding-window layers)")
    flags = list(config.no_rope_layers)[: config.num_hidden_layers]
    if len(flags) < config.num_hidden_layers or set(flags) - {0, 1}:
        raise ConfigError("no_rope_layers", config.no_rope_layers, "a 0 (NoPE) or 1 (rotary) for every layer")
    cfg = llama.zoo_config(config)
    if 0 in flags:
        cfg["model"]["pattern"] = [{} if flag else {"pos": "none"} for flag in flags[: period(flags)]]
    return cfg


SMOLLM3 = Family(
    name="smollm3",
    hf_class="SmolLM3ForCausalLM",
    model_type="smollm3",
    holds={**llama.LLAMA.holds, "block.pos": Holds("rotary or no positions on each layer (pos=rotary or none)",
                                                   ("rotary", "none"))},  # fmt: skip
    weights=llama.LLAMA.weights,
    hf_config=hf_config,
    zoo_config=zoo_config,
    varies=frozenset({"block.pos"}),
)
