"""``DeepseekV3ForCausalLM``: pre-norm RMSNorm blocks, multi-head latent attention (zoo's ``mla``: its ``q_rank``,
``kv_rank`` and ``rope_dim`` are q_lora_rank, kv_lora_rank and qk_rope_head_dim; qk_nope_head_dim and v_head_dim are
zoo's d_head), default RoPE, the first ``first_k_dense_replace`` layers a SwiGLU MLP and every later one a mixture of
experts (sigmoid scores, the bias-balanced choice, group-limited routing, a shared expert).

Export writes ``rope_interleave: true`` (DeepSeek-V3's layout): the rotary rows of ``q_b_proj`` (each head's) and
``kv_a_proj_with_mqa`` are stored in interleaved pairs (2i, 2i + 1), zoo's in halves (i, i + r/2), so each head's
rotary rows are permuted on the way. The released model's YaRN RoPE scaling is not zoo's: an export writes the
default RoPE, an import of a scaled one is refused by name. transformers' model has no multi-token-prediction
layers (``num_nextn_predict_layers`` is written 0): a zoo model trained with ``objective=mtp`` exports without its
extra heads (zoo.models.hf.export.folded_weights)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from einops import rearrange

from zoo.core.errors import ConfigError
from zoo.models.hf.family import ANY, COMMON, Family, Holds, Refusal, stacked, transformers_module
from zoo.models.hf.llama import rope_theta
from zoo.models.hf.weights import SPLIT_GATE_UP, STACKED_GATE_UP, Entry, Geometry, Layout, per_layer

if TYPE_CHECKING:
    from zoo.models.language import LanguageModel

DENSE, MOE = "swiglu", "moe"


def _interleaved(rows: torch.Tensor, width: int) -> torch.Tensor:
    """Each ``width``-row group from halves (i, i + width/2) to interleaved pairs (2i, 2i + 1)."""
    return rearrange(rows, "(g two half) ... -> (g half two) ...", two=2, half=width // 2)


def _halves(rows: torch.Tensor, width: int) -> torch.Tensor:
    """The inverse of :func:`_interleaved`."""
    return rearrange(rows, "(g half two) ... -> (g two half) ...", two=2, half=width // 2)


def _query_rope(ts: list[torch.Tensor], g: Geometry, permute: Any) -> list[torch.Tensor]:
    """Each head's rotary rows of a query projection (per head: d_head content, then rope_dim rotary rows) permuted."""
    heads = rearrange(ts[0], "(h f) ... -> h f ...", h=g.n_heads)
    rope = rearrange(permute(rearrange(heads[:, g.d_head :], "h f ... -> (h f) ..."), g.rope_dim),
                     "(h f) ... -> h f ...", h=g.n_heads)  # fmt: skip
    return [rearrange(torch.cat([heads[:, : g.d_head], rope], 1), "h f ... -> (h f) ...")]


def _key_rope(ts: list[torch.Tensor], g: Geometry, permute: Any) -> list[torch.Tensor]:
    """The shared rotary key's rows (the last rope_dim of the down-projection, after the latent's) permuted."""
    latent, rope = ts[0][: -g.rope_dim], ts[0][-g.rope_dim :]
    return [torch.cat([latent, permute(rope, g.rope_dim)])]


#: zoo's query rows (rotary pairs in halves) <-> DeepSeek-V3's (rope_interleave: in interleaved pairs).
QUERY_ROPE = Layout(
    "each head's rotary query rows interleaved",
    lambda ts, g: _query_rope(ts, g, _interleaved),
    lambda ts, g: _query_rope(ts, g, _halves),
)
#: zoo's kv down-projection <-> ``kv_a_proj_with_mqa``, the shared rotary key's rows interleaved.
KEY_ROPE = Layout(
    "the rotary key's rows interleaved",
    lambda ts, g: _key_rope(ts, g, _interleaved),
    lambda ts, g: _key_rope(ts, g, _halves),
)

_layer = per_layer("model.layers.{i}.")


def dense_layers(layers: Sequence[Mapping[str, Any]]) -> int:
    """``first_k_dense_replace``: how many layers, from the first, have the dense MLP."""
    return next((i for i, layer in enumerate(layers) if layer["block.mlp"] != DENSE), len(layers))


def arrangement(model: LanguageModel) -> list[Refusal]:
    """DeepSeek-V3's stack: dense layers first, then mixtures of experts, each kind at one width."""
    layers = [{**spec.settings()} for spec in model.specs]
    k = dense_layers(layers)
    found = [Refusal(f"model.layers.{i}.mlp", layer["block.mlp"], f"the dense layers first (first_k_dense_replace="
                     f"{k}), then every later layer a mixture of experts (block.mlp=moe)")
             for i, layer in enumerate(layers) if i >= k and layer["block.mlp"] != MOE]  # fmt: skip
    for start, stop in ((0, k), (k, len(layers))):
        widths = [block.mlp.hidden for block in model.blocks[start:stop]]
        needs = f"layer {start}'s width ({widths[0] if widths else None}): one intermediate_size, one moe's"
        found += [Refusal(f"model.layers.{start + j}.d_ff", width, needs)
                  for j, width in enumerate(widths) if width != widths[0]]  # fmt: skip
    return found[:1]


class LatentFamily(Family):
    """A family of latent-attention layers: each layer's geometry has its heads' content and rotary widths, and the
    stack's arrangement (dense layers, then experts) is checked beside each setting."""

    def geometries(self, model: LanguageModel) -> list[Geometry]:
        return [Geometry(b.attn.n_heads, b.attn.n_heads, d_head=b.attn.d_head, rope_dim=b.attn.rope_dim)
                for b in model.blocks]  # fmt: skip

    def refusals(self, model: LanguageModel) -> list[Refusal]:
        return super().refusals(model) or arrangement(model)


def hf_config(model: LanguageModel, layers: Sequence[Mapping[str, Any]], tied: bool) -> Any:
    """The ``DeepseekV3Config`` of a model the family holds. With no dense layer, intermediate_size is the experts'
    width (unused); with no mixture of experts, the MoE sizes are transformers' defaults (unused)."""
    first, attn, k = layers[0], model.blocks[0].attn, dense_layers(layers)
    moe = next((i for i, layer in enumerate(layers) if layer["block.mlp"] == MOE), None)
    experts = {}
    if moe is not None:
        routed, options = model.blocks[moe].mlp, layers[moe]
        experts = {
            "moe_intermediate_size": routed.hidden,
            "n_routed_experts": options["block.mlp.n_experts"],
            "num_experts_per_tok": options["block.mlp.top_k"],
            "n_shared_experts": options["block.mlp.n_shared"],
            "routed_scaling_factor": options["block.mlp.routed_scaling_factor"],
            "n_group": options["block.mlp.n_groups"],
            "topk_group": options["block.mlp.top_groups"],
            "norm_topk_prob": options["block.mlp.normalize"],
        }
    return transformers_module().DeepseekV3Config(
        vocab_size=model.embed.num_embeddings,
        hidden_size=model.embed.embedding_dim,
        intermediate_size=model.blocks[0].mlp.hidden,
        num_hidden_layers=len(model.blocks),
        first_k_dense_replace=k,
        num_attention_heads=attn.n_heads,
        num_key_value_heads=attn.n_heads,
        q_lora_rank=attn.q_rank,
        kv_lora_rank=attn.kv_rank,
        qk_nope_head_dim=attn.d_head,
        v_head_dim=attn.d_head,
        qk_rope_head_dim=attn.rope_dim,
        rope_interleave=True,
        rope_parameters={"rope_type": "default", "rope_theta": first["block.pos.base"]},
        hidden_act="silu",
        rms_norm_eps=first["block.norm.eps"],
        attention_bias=False,
        attention_dropout=0.0,
        num_nextn_predict_layers=0,
        max_position_embeddings=first["block.max_len"] or 4096,
        tie_word_embeddings=tied,
        bos_token_id=None,
        eos_token_id=None,
        torch_dtype="float32",
        **experts,
    )


def _refuse_unless(config: Any, key: str, ok: bool, allowed: str) -> None:
    if not ok:
        raise ConfigError(key, getattr(config, key), allowed)


def zoo_config(config: Any) -> dict[str, Any]:
    """The zoo config (``block`` and ``model``) of a ``DeepseekV3Config``: the experts' MLP on the block, the first
    ``first_k_dense_replace`` layers' dense SwiGLU in ``model.layers``."""
    heads = config.num_attention_heads
    d_head = config.hidden_size // heads
    _refuse_unless(config, "hidden_act", config.hidden_act == "silu", "silu (zoo's swiglu, dense and experts)")
    _refuse_unless(config, "attention_bias", not config.attention_bias, "false (zoo's bias would be everywhere)")
    _refuse_unless(config, "rope_interleave", bool(config.rope_interleave),
                   "true (DeepSeek-V3's layout, the one zoo's export writes)")  # fmt: skip
    _refuse_unless(config, "num_key_value_heads", config.num_key_value_heads == heads,
                   f"num_attention_heads ({heads}): latent attention has a key and value per head")  # fmt: skip
    for key in ("qk_nope_head_dim", "v_head_dim"):
        _refuse_unless(config, key, getattr(config, key) * heads == config.hidden_size,
                       f"hidden_size / num_attention_heads = {d_head} (zoo's latent attention's d_head)")  # fmt: skip
    _refuse_unless(config, "n_shared_experts", config.n_shared_experts >= 1, "at least 1 (a shared expert)")
    n_layers, k = config.num_hidden_layers, config.first_k_dense_replace or 0
    dense = {"mlp": DENSE, "d_ff": config.intermediate_size}
    moe = {
        "name": MOE, "n_experts": config.n_routed_experts, "top_k": config.num_experts_per_tok,
        "n_shared": config.n_shared_experts, "routing": "sigmoid", "balance": "bias",
        "normalize": bool(config.norm_topk_prob), "routed_scaling_factor": float(config.routed_scaling_factor),
        "n_groups": config.n_group or 1, "top_groups": config.topk_group or 1,
    }  # fmt: skip
    attn = {"name": "mla", "kv_rank": config.kv_lora_rank, "q_rank": config.q_lora_rank,
            "rope_dim": config.qk_rope_head_dim}  # fmt: skip
    block = {
        "d_model": config.hidden_size,
        "n_heads": heads,
        "d_ff": config.moe_intermediate_size if k < n_layers else config.intermediate_size,
        "bias": False,
        "placement": "pre",
        "norm": {"name": "rmsnorm", "eps": float(config.rms_norm_eps)},
        "attn": attn,
        "pos": {"name": "rotary", "base": rope_theta(config)},
        "mlp": moe if k < n_layers else DENSE,
    }
    out = stacked(block, vocab_size=config.vocab_size, n_layers=n_layers, tied=bool(config.tie_word_embeddings))
    if 0 < k < n_layers:
        out["model"]["layers"] = {i: dict(dense) for i in range(k)}
    return out


DEEPSEEK_V3 = LatentFamily(
    name="deepseek_v3",
    hf_class="DeepseekV3ForCausalLM",
    model_type="deepseek_v3",
    holds={
        **COMMON,
        "block.bias": Holds("no biases (block.bias=false)", (False,)),
        "block.placement": Holds("pre-norm blocks (placement=pre)", ("pre",)),
        "block.norm": Holds("RMSNorm (norm=rmsnorm)", ("rmsnorm",)),
        "block.norm.eps": ANY,
        "block.attn": Holds("multi-head latent attention (attn=mla)", ("mla",)),
        "block.attn.kv_rank": ANY,
        "block.attn.q_rank": ANY,
        "block.attn.rope_dim": ANY,
        "block.attn.latent_norm": Holds("RMSNorm latents (block.attn.latent_norm=rmsnorm)", ("rmsnorm",)),
        "block.pos": Holds("rotary positions (pos=rotary)", ("rotary",)),
        "block.pos.base": ANY,
        "block.pos.rotary_fraction": Holds("rotary over all rope_dim features (block.pos.rotary_fraction=1)", (1.0,)),
        "block.mlp": Holds("a SwiGLU MLP or a mixture of experts (mlp=swiglu or moe)", (DENSE, MOE)),
        "block.mlp.n_experts": ANY,
        "block.mlp.top_k": ANY,
        "block.mlp.expert": Holds("SwiGLU experts (block.mlp.expert=swiglu)", (DENSE,)),
        "block.mlp.n_shared": Holds("a shared expert (block.mlp.n_shared >= 1)", accepts=lambda v, layer: v >= 1),
        "block.mlp.routing": Holds("sigmoid scores (block.mlp.routing=sigmoid)", ("sigmoid",)),
        "block.mlp.balance": Holds("the bias-balanced choice (block.mlp.balance=bias)", ("bias",)),
        "block.mlp.bias_rate": ANY,
        "block.mlp.normalize": ANY,
        "block.mlp.routed_scaling_factor": ANY,
        "block.mlp.n_groups": ANY,
        "block.mlp.top_groups": ANY,
    },
    varies=frozenset({"block.mlp", "block.d_ff"}),
    weights=(
        Entry(("embed.weight",), ("model.embed_tokens.weight",)),
        _layer("placement.norms.0.weight", "input_layernorm.weight"),
        _layer("attn.q.weight", "self_attn.q_proj.weight", QUERY_ROPE),
        _layer("attn.q_down.weight", "self_attn.q_a_proj.weight"),
        _layer("attn.q_norm.weight", "self_attn.q_a_layernorm.weight"),
        _layer("attn.q_up.weight", "self_attn.q_b_proj.weight", QUERY_ROPE),
        _layer("attn.kv_down.weight", "self_attn.kv_a_proj_with_mqa.weight", KEY_ROPE),
        _layer("attn.kv_norm.weight", "self_attn.kv_a_layernorm.weight"),
        _layer("attn.kv_up.weight", "self_attn.kv_b_proj.weight"),
        _layer("attn.out.weight", "self_attn.o_proj.weight"),
        _layer("placement.norms.1.weight", "post_attention_layernorm.weight"),
        _layer("mlp.gate_up.weight", "mlp.gate_proj.weight mlp.up_proj.weight", SPLIT_GATE_UP),
        _layer("mlp.down.weight", "mlp.down_proj.weight"),
        _layer("mlp.router.weight", "mlp.gate.weight"),
        _layer("mlp.expert_bias", "mlp.gate.e_score_correction_bias"),
        _layer("mlp.experts.{e}.gate_up.weight", "mlp.experts.gate_up_proj", STACKED_GATE_UP),
        _layer("mlp.experts.{e}.down.weight", "mlp.experts.down_proj"),
        _layer("mlp.shared.gate_up.weight", "mlp.shared_experts.gate_proj.weight mlp.shared_experts.up_proj.weight",
               SPLIT_GATE_UP),  # fmt: skip
        _layer("mlp.shared.down.weight", "mlp.shared_experts.down_proj.weight"),
        Entry(("final_norm.weight",), ("model.norm.weight",)),
        Entry(("head.weight",), ("lm_head.weight",)),
    ),
    hf_config=hf_config,
    zoo_config=zoo_config,
)
