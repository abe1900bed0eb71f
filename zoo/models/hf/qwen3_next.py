"""``Qwen3NextForCausalLM``: a hybrid of Gated DeltaNet layers (``linear_attention``) and output-gated full attention
(``full_attention``) in the order of its ``layer_types``, zero-centred RMSNorms (block, final, q and k norms), a
sparse MoE MLP with a sigmoid-gated shared expert on every layer but its ``mlp_only_layers`` (a gated MLP there).

zoo holds it as a block of full attention (``attn=gqa``, ``gate=elementwise``, ``qk_norm=rmsnorm``, rotary over a
fraction of each head) and a ``model.pattern`` whose Gated DeltaNet entries set their own value heads
(``n_heads``), ``n_key_heads``, ``d_key``, ``head_dim`` (the value heads' width) and ``pos=none``. Layouts:
q_proj holds per head its query rows then its gate rows; in_proj_qkvz per key head its query, key, values and
output gates z, in_proj_ba per key head its value heads' b then their a (zoo's rows are by key head already); the
convolution's channels are every query, every key, every value (zoo's: by key head, stored less the identity
kernel); the experts are stacked, each gate_up holding its gate rows then its up rows (zoo's interleaved).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from einops import rearrange

from zoo.core.errors import ConfigError
from zoo.models.hf.family import ANY, COMMON, Family, Holds, stacked, transformers_module
from zoo.models.hf.llama import rope_theta
from zoo.models.hf.weights import DELTA_CONV, SPLIT_GATE_UP, STACKED_GATE_UP, Entry, Geometry, Layout, per_layer
from zoo.parts.attention import fuse_qkv, split_qkv

if TYPE_CHECKING:
    from zoo.models.language import LanguageModel

LINEAR, FULL = "gated_deltanet", "gqa"
#: zoo's mixer -> Qwen3-Next's layer type.
LAYER_TYPES = {LINEAR: "linear_attention", FULL: "full_attention"}


def _gated_query_out(ts: list[torch.Tensor], g: Geometry) -> list[torch.Tensor]:
    q, k, v = split_qkv(ts[0], g.n_heads, g.n_kv_heads)
    return [rearrange(torch.stack([q, ts[1]]), "two (h d) ... -> (h two d) ...", h=g.n_heads), k, v]


def _gated_query_back(ts: list[torch.Tensor], g: Geometry) -> list[torch.Tensor]:
    q, gate = rearrange(ts[0], "(h two d) ... -> two (h d) ...", h=g.n_heads, two=2)
    return [fuse_qkv(q, ts[1], ts[2], g.n_kv_heads), gate]


#: zoo's fused qkv and elementwise gate <-> q_proj (per head: its query rows, then its gate rows), k_proj, v_proj.
GATED_QUERY = Layout("query and gate rows per head", _gated_query_out, _gated_query_back)


def _qkvz_out(ts: list[torch.Tensor], g: Geometry) -> list[torch.Tensor]:
    qkv, gate = (rearrange(t, "(k n) ... -> k n ...", k=g.n_key_heads) for t in ts[:2])
    qkvz = rearrange(torch.cat([qkv, gate], 1), "k n ... -> (k n) ...")
    return [qkvz, *DELTA_CONV.out([ts[2]], g)]


def _qkvz_back(ts: list[torch.Tensor], g: Geometry) -> list[torch.Tensor]:
    qkvz = rearrange(ts[0], "(k n) ... -> k n ...", k=g.n_key_heads)
    values = g.n_heads // g.n_key_heads * g.d_head  # a key head's value channels
    qkv, gate = qkvz.split([2 * g.d_key + values, values], 1)
    qkv, gate = (rearrange(t, "k n ... -> (k n) ...") for t in (qkv, gate))
    return [qkv, gate, *DELTA_CONV.back(ts[1:], g)]


#: Gated DeltaNet's qkv (by key head), output gate and convolution (by key head, less the identity kernel) <->
#: in_proj_qkvz (per key head: its q, k, values, gates z) and conv1d (every query, every key, every value).
QKVZ = Layout("qkvz by key head, convolution by kind", _qkvz_out, _qkvz_back)


def _ba_out(ts: list[torch.Tensor], g: Geometry) -> list[torch.Tensor]:
    b, a = (rearrange(t, "(k r) ... -> k r ...", k=g.n_key_heads) for t in ts)
    return [rearrange(torch.cat([b, a], 1), "k r ... -> (k r) ...")]


def _ba_back(ts: list[torch.Tensor], g: Geometry) -> list[torch.Tensor]:
    b, a = rearrange(ts[0], "(k r) ... -> k r ...", k=g.n_key_heads).chunk(2, 1)
    return [rearrange(b, "k r ... -> (k r) ..."), rearrange(a, "k r ... -> (k r) ...")]


#: Gated DeltaNet's beta and decay projections <-> in_proj_ba (per key head: its value heads' b, then their a).
BA = Layout("b then a per key head", _ba_out, _ba_back)


_layer = per_layer("model.layers.{i}.")


def first_of(layers: Sequence[Mapping[str, Any]], key: str, value: str) -> int | None:
    """The first layer whose ``key`` is ``value`` (None when none is)."""
    return next((i for i, layer in enumerate(layers) if layer[key] == value), None)


def hf_config(model: LanguageModel, layers: Sequence[Mapping[str, Any]], tied: bool) -> Any:
    """The ``Qwen3NextConfig`` of a model the family holds: every layer's type and every size explicit."""
    full, linear, sparse = (first_of(layers, "block.attn", FULL), first_of(layers, "block.attn", LINEAR),
                            first_of(layers, "block.mlp", "moe"))  # fmt: skip
    dense = first_of(layers, "block.mlp", "swiglu")
    first, attn = layers[0], model.blocks[full if full is not None else 0].attn
    attention: dict[str, Any] = {"num_attention_heads": attn.n_heads, "head_dim": attn.d_head}
    if full is not None:
        attention["num_key_value_heads"] = attn.n_kv_heads
        attention["rope_parameters"] = {"rope_type": "default", "rope_theta": layers[full]["block.pos.base"],
                                        "partial_rotary_factor": layers[full]["block.pos.rotary_fraction"]}  # fmt: skip
    if linear is not None:
        gdn = model.blocks[linear].attn
        attention.update(linear_num_value_heads=gdn.n_heads, linear_value_head_dim=gdn.d_head,
                         linear_num_key_heads=gdn.n_key_heads, linear_key_head_dim=gdn.d_key,
                         linear_conv_kernel_dim=gdn.conv.shape[-1])  # fmt: skip
    experts: dict[str, Any] = {"num_experts": 0}
    if sparse is not None:
        moe = model.blocks[sparse].mlp
        experts = {"num_experts": moe.n_experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.hidden,
                   "shared_expert_intermediate_size": moe.shared.hidden, "norm_topk_prob": moe.normalize}  # fmt: skip
    return transformers_module().Qwen3NextConfig(
        vocab_size=model.embed.num_embeddings,
        hidden_size=model.embed.embedding_dim,
        intermediate_size=model.blocks[dense if dense is not None else 0].mlp.hidden,
        num_hidden_layers=len(model.blocks),
        layer_types=[LAYER_TYPES[layer["block.attn"]] for layer in layers],
        decoder_sparse_step=1,
        mlp_only_layers=[i for i, layer in enumerate(layers) if layer["block.mlp"] == "swiglu"],
        hidden_act="silu",
        rms_norm_eps=first["block.norm.eps"],
        attention_bias=False,
        max_position_embeddings=first["block.max_len"] or 4096,
        tie_word_embeddings=tied,
        torch_dtype="float32",
        **attention,
        **experts,
    )


def dense_layers(config: Any) -> list[int]:
    """The layers whose MLP is a dense gated one, as Qwen3NextDecoderLayer decides."""
    step, only = config.decoder_sparse_step, set(config.mlp_only_layers or [])
    return [i for i in range(config.num_hidden_layers)
            if i in only or not (config.num_experts > 0 and (i + 1) % step == 0)]  # fmt: skip


def linear_layer(config: Any) -> dict[str, Any]:
    """The block overrides of a ``linear_attention`` layer: Gated DeltaNet with its own value heads (every size
    explicit, as the config states them), no positions, its output norm at rms_norm_eps."""
    value_heads, key_heads = config.linear_num_value_heads, config.linear_num_key_heads
    if value_heads % key_heads:
        raise ConfigError("linear_num_key_heads", key_heads, f"a divisor of linear_num_value_heads={value_heads}")
    attn = {"name": LINEAR, "n_key_heads": key_heads, "d_key": config.linear_key_head_dim,
            "head_dim": config.linear_value_head_dim, "conv": config.linear_conv_kernel_dim,
            "norm_eps": float(config.rms_norm_eps)}  # fmt: skip
    return {"n_heads": value_heads, "pos": "none", "attn": attn}


def layer_overrides(config: Any) -> list[dict[str, Any]]:
    """Each layer's overrides of the block (full attention and a sparse MLP): a linear layer's mixer, a dense MLP."""
    dense = dense_layers(config)
    overrides = []
    for i, kind in enumerate(config.layer_types):
        if kind not in LAYER_TYPES.values():
            raise ConfigError(f"layer_types[{i}]", kind, f"one of {', '.join(LAYER_TYPES.values())}")
        layer = linear_layer(config) if kind == "linear_attention" else {}
        if i in dense:
            layer.update(mlp="swiglu", d_ff=config.intermediate_size)
        overrides.append(layer)
    return overrides


def shortest_pattern(overrides: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The shortest list whose repetition over the depth gives ``overrides`` ([] when every layer is the block)."""
    period = next(p for p in range(1, len(overrides) + 1)
                  if all(o == overrides[i % p] for i, o in enumerate(overrides)))  # fmt: skip
    pattern = overrides[:period]
    return [] if pattern == [{}] else pattern


def moe_node(config: Any) -> dict[str, Any]:
    """The sparse MLP of a ``Qwen3NextConfig``: softmax routing, its top k, a sigmoid-gated shared expert."""
    shared, width = config.shared_expert_intermediate_size, config.moe_intermediate_size
    if shared < 1 or shared % width:
        raise ConfigError("shared_expert_intermediate_size", shared,
                          f"a positive multiple of moe_intermediate_size={width} (zoo's n_shared x d_ff)")  # fmt: skip
    return {"name": "moe", "n_experts": config.num_experts, "top_k": config.num_experts_per_tok,
            "n_shared": shared // width, "shared_gate": True, "normalize": bool(config.norm_topk_prob)}  # fmt: skip


def zoo_config(config: Any) -> dict[str, Any]:
    """The zoo config (``block`` and ``model``, its pattern) of a ``Qwen3NextConfig``."""
    if config.hidden_act != "silu":
        raise ConfigError("hidden_act", config.hidden_act, "silu (zoo's SwiGLU experts and Gated DeltaNet's SiLU)")
    if config.attention_bias:
        raise ConfigError("attention_bias", config.attention_bias, "false (zoo's attention here has no biases)")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attn: dict[str, Any] = {"name": FULL, "n_kv_heads": config.num_key_value_heads, "qk_norm": "rmsnorm",
                            "gate": "elementwise"}  # fmt: skip
    if head_dim * config.num_attention_heads != config.hidden_size:
        attn["head_dim"] = head_dim
    params = config.rope_parameters or {}
    sparse = config.num_experts > 0
    block = {
        "d_model": config.hidden_size,
        "n_heads": config.num_attention_heads,
        "d_ff": config.moe_intermediate_size if sparse else config.intermediate_size,
        "bias": False,
        "placement": "pre",
        "norm": {"name": "rmsnorm", "eps": float(config.rms_norm_eps), "zero_centred": True},
        "attn": attn,
        "pos": {"name": "rotary", "base": rope_theta(config),
                "rotary_fraction": float(params.get("partial_rotary_factor", 1.0))},  # fmt: skip
        "mlp": moe_node(config) if sparse else "swiglu",
    }
    overrides = layer_overrides(config)
    if not sparse:  # every layer dense: the block's own MLP
        overrides = [{k: v for k, v in o.items() if k not in ("mlp", "d_ff")} for o in overrides]
    cfg = stacked(block, vocab_size=config.vocab_size, n_layers=config.num_hidden_layers,
                  tied=bool(config.tie_word_embeddings))  # fmt: skip
    cfg["model"]["pattern"] = shortest_pattern(overrides)
    return cfg


def _pos_of(value: Any, layer: Mapping[str, Any]) -> bool:
    return value == ("none" if layer["block.attn"] == LINEAR else "rotary")


QWEN3_NEXT = Family(
    name="qwen3_next",
    hf_class="Qwen3NextForCausalLM",
    model_type="qwen3_next",
    holds={
        **COMMON,
        "block.bias": Holds("no biases (block.bias=false)", (False,)),
        "block.placement": Holds("pre-norm blocks (placement=pre)", ("pre",)),
        "block.norm": Holds("RMSNorm (norm=rmsnorm)", ("rmsnorm",)),
        "block.norm.eps": ANY,
        "block.norm.zero_centred": Holds("zero-centred RMSNorm (block.norm.zero_centred=true)", (True,)),
        "block.attn": Holds("full attention (attn=gqa) or Gated DeltaNet (attn=gated_deltanet)", (FULL, LINEAR)),
        "block.attn.n_kv_heads": ANY,
        "block.attn.head_dim": ANY,
        "block.attn.qk_norm": Holds("RMSNorm on queries and keys (block.attn.qk_norm=rmsnorm)", ("rmsnorm",)),
        "block.attn.gate": Holds("the elementwise output gate (block.attn.gate=elementwise)", ("elementwise",)),
        "block.attn.d_key": ANY,
        "block.attn.n_key_heads": ANY,
        "block.attn.conv": ANY,
        "block.attn.chunk": ANY,
        "block.attn.norm_eps": Holds(
            "Gated DeltaNet's output norm at the block norm's epsilon (block.attn.norm_eps=block.norm.eps)",
            accepts=lambda value, layer: value == layer["block.norm.eps"],
        ),
        "block.pos": Holds("rotary on full-attention layers, none on Gated DeltaNet layers", accepts=_pos_of),
        "block.pos.base": ANY,
        "block.pos.rotary_fraction": ANY,
        "block.mlp": Holds("a sparse MoE (mlp=moe), or a gated MLP (mlp=swiglu) on some layers", ("moe", "swiglu")),
        "block.mlp.n_experts": ANY,
        "block.mlp.top_k": ANY,
        "block.mlp.n_shared": Holds("a shared expert (block.mlp.n_shared >= 1)", accepts=lambda value, _: value >= 1),
        "block.mlp.shared_gate": Holds("the shared expert's sigmoid gate (block.mlp.shared_gate=true)", (True,)),
        "block.mlp.normalize": ANY,
    },
    varies=frozenset({"block.attn", "block.n_heads", "block.pos", "block.attn.head_dim", "block.attn.backend",
                      "block.mlp", "block.d_ff"}),  # fmt: skip
    alike_within={"block.n_heads": "block.attn", "block.attn.head_dim": "block.attn", "block.d_ff": "block.mlp"},
    weights=(
        Entry(("embed.weight",), ("model.embed_tokens.weight",)),
        _layer("placement.norms.0.weight", "input_layernorm.weight"),
        _layer("attn.qkv.weight attn.gate.weight attn.conv",
               "linear_attn.in_proj_qkvz.weight linear_attn.conv1d.weight", QKVZ, LINEAR),  # fmt: skip
        _layer("attn.beta.weight attn.decay.weight", "linear_attn.in_proj_ba.weight", BA, LINEAR),
        _layer("attn.a_log", "linear_attn.A_log", mixer=LINEAR),
        _layer("attn.dt", "linear_attn.dt_bias", mixer=LINEAR),
        _layer("attn.norm.weight", "linear_attn.norm.weight", mixer=LINEAR),
        _layer("attn.out.weight", "linear_attn.out_proj.weight", mixer=LINEAR),
        _layer("attn.qkv.weight attn.gate.weight", "self_attn.q_proj.weight self_attn.k_proj.weight "
               "self_attn.v_proj.weight", GATED_QUERY, FULL),  # fmt: skip
        _layer("attn.q_norm.weight", "self_attn.q_norm.weight", mixer=FULL),
        _layer("attn.k_norm.weight", "self_attn.k_norm.weight", mixer=FULL),
        _layer("attn.out.weight", "self_attn.o_proj.weight", mixer=FULL),
        _layer("placement.norms.1.weight", "post_attention_layernorm.weight"),
        _layer("mlp.router.weight", "mlp.gate.weight"),
        _layer("mlp.experts.{e}.gate_up.weight", "mlp.experts.gate_up_proj", STACKED_GATE_UP),
        _layer("mlp.experts.{e}.down.weight", "mlp.experts.down_proj"),
        _layer("mlp.shared.gate_up.weight", "mlp.shared_expert.gate_proj.weight mlp.shared_expert.up_proj.weight",
               SPLIT_GATE_UP),  # fmt: skip
        _layer("mlp.shared.down.weight", "mlp.shared_expert.down_proj.weight"),
        _layer("mlp.shared_gate.weight", "mlp.shared_expert_gate.weight"),
        _layer("mlp.gate_up.weight", "mlp.gate_proj.weight mlp.up_proj.weight", SPLIT_GATE_UP),
        _layer("mlp.down.weight", "mlp.down_proj.weight"),
        Entry(("final_norm.weight",), ("model.norm.weight",)),
        Entry(("head.weight",), ("lm_head.weight",)),
    ),
    hf_config=hf_config,
    zoo_config=zoo_config,
)
