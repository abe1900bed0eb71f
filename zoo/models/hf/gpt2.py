"""``GPT2LMHeadModel``: pre-norm LayerNorm blocks with biases everywhere, learned absolute positions, multi-head
attention, a plain MLP. GPT-2's ``Conv1D`` stores weights transposed. Its default activation, ``gelu_new``, is
GELU's tanh approximation: it imports as ``mlp=gelu`` with ``approximate: tanh``, which exports as
``gelu_pytorch_tanh`` (PyTorch's kernel, as zoo computes it); zoo's exact ``gelu`` exports as ``gelu``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zoo.core.errors import ConfigError
from zoo.models.hf.family import ANY, COMMON, Family, Holds, hf_activation, stacked, transformers_module, zoo_mlp
from zoo.models.hf.weights import CAT_QKV, CONV1D, Entry, per_layer

if TYPE_CHECKING:
    from zoo.models.language import LanguageModel

#: zoo's plain MLP -> GPT-2's activation_function.
PLAIN_ACTS = {"gelu": "gelu", "relu": "relu", "relu2": "relu2"}

_layer = per_layer("transformer.h.{i}.")


def hf_config(model: LanguageModel, layers: Sequence[Mapping[str, Any]], tied: bool) -> Any:
    """The ``GPT2Config`` of a model the family holds."""
    first = layers[0]
    return transformers_module().GPT2Config(
        vocab_size=model.embed.num_embeddings,
        n_embd=model.embed.embedding_dim,
        n_layer=len(model.blocks),
        n_head=model.blocks[0].attn.n_heads,
        n_inner=model.blocks[0].mlp.hidden,
        n_positions=model.pos_embed.weight.shape[0],
        activation_function=hf_activation(PLAIN_ACTS[first["block.mlp"]], first),
        layer_norm_epsilon=first["block.norm.eps"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=tied,
        torch_dtype="float32",
    )


def zoo_config(config: Any) -> dict[str, Any]:
    """The zoo config (``block`` and ``model``) of a ``GPT2Config``."""
    acts = {v: k for k, v in PLAIN_ACTS.items()}
    try:
        mlp = zoo_mlp(config.activation_function, acts)
    except KeyError:
        allowed = f"one of {', '.join(acts)}, gelu_new or gelu_pytorch_tanh"
        raise ConfigError("activation_function", config.activation_function, allowed) from None
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
        "mlp": mlp,
    }
    return stacked(block, vocab_size=config.vocab_size, n_layers=config.n_layer,
                   tied=bool(config.tie_word_embeddings))  # fmt: skip

GPT2 = Family(
    name="gpt2",
    hf_class="GPT2LMHeadModel",
    model_type="gpt2",
    holds={
        **COMMON,
        "block.bias": Holds("biases everywhere (block.bias=true)", (True,)),
        "block.placement": Holds("pre-norm blocks (placement=pre)", ("pre",)),
        "block.norm": Holds("LayerNorm (norm=layernorm)", ("layernorm",)),
        "block.norm.eps": ANY,
        "block.attn": Holds("multi-head attention, one key/value head per query head (attn=mha)", ("mha",)),
        "block.attn.n_kv_heads": Holds(
            "one key/value head per query head (block.attn.n_kv_heads=null)",
            accepts=lambda value, layer: value in (None, layer["block.n_heads"]),
        ),
        "block.pos": Holds("learned absolute positions (pos=learned)", ("learned",)),
        "block.mlp": Holds("a plain MLP (mlp=gelu, relu or relu2)", tuple(PLAIN_ACTS)),
        "block.mlp.approximate": ANY,
    },
    weights=(
        Entry(("embed.weight",), ("transformer.wte.weight",)),
        Entry(("pos_embed.weight",), ("transformer.wpe.weight",)),
        _layer("placement.norms.0.{p}", "ln_1.{p}"),
        _layer("attn.qkv.{p}", "attn.c_attn.{p}", CAT_QKV.then(CONV1D)),
        _layer("attn.out.{p}", "attn.c_proj.{p}", CONV1D),
        _layer("placement.norms.1.{p}", "ln_2.{p}"),
        _layer("mlp.up.{p}", "mlp.c_fc.{p}", CONV1D),
        _layer("mlp.down.{p}", "mlp.c_proj.{p}", CONV1D),
        Entry(("final_norm.weight",), ("transformer.ln_f.weight",)),
        Entry(("final_norm.bias",), ("transformer.ln_f.bias",)),
        Entry(("head.weight",), ("lm_head.weight",)),
    ),
    hf_config=hf_config,
    zoo_config=zoo_config,
)
