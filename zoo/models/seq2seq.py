"""The encoder-decoder (Vaswani et al. 2017): an encoder stack reads the source, a decoder stack with
cross-attention generates the target.

Encoder blocks are ordinary blocks with ``causal: false``; decoder blocks are ordinary blocks with
``cross_attention: true`` (self-attention, cross-attention, MLP, each wrapped by the placement).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from zoo.assembly.spec import BlockSpec, resolve_block, to_dict
from zoo.core.errors import ConfigError
from zoo.models.base import TokenModel, init_stack, residual_branches, token_init_stds
from zoo.models.config import (
    DECODER_ONLY,
    ENCODER_DEFAULTS,
    MODEL_DEFAULTS,
    block_section,
    merge_block,
    model_options,
    positive_int,
    section,
    stack_specs,
)
from zoo.models.generate import check_generate_args, generate_tokens
from zoo.models.stack import Stack
from zoo.parts.state import LayerState


class Seq2SeqModel(TokenModel):
    """Source ids (b, s) and target ids (b, t) -> next-token logits (b, t, vocab).

    Parameter names: ``embed`` (shared by source and target), ``encoder.pos_embed`` and
    ``decoder.pos_embed`` (``pos=learned`` only: a table each), ``encoder.blocks.{i}``,
    ``encoder.final_norm``, ``decoder.blocks.{i}`` (with ``cross_attn``), ``decoder.final_norm``,
    ``head`` (absent when tied to the embedding). Initialization: :func:`zoo.models.base.init_stack`
    over the whole model (every draw seeded by the full parameter name), each stack's residual
    outputs scaled by its own depth.
    """

    def __init__(
        self,
        encoder: Sequence[BlockSpec],
        decoder: Sequence[BlockSpec],
        vocab_size: int,
        tie_embeddings: bool = True,
    ) -> None:
        super().__init__()
        if not encoder or not decoder:
            raise ConfigError("n_layers", (len(encoder), len(decoder)), "encoder and decoder need a layer each")
        for i, spec in enumerate(decoder):
            if not spec.dims.cross_attention:
                raise ConfigError(f"decoder[{i}].cross_attention", False, "decoder blocks need cross-attention")
        d_model = encoder[0].dims.d_model
        if any(s.dims.d_model != d_model for s in [*encoder, *decoder]):
            raise ConfigError("block.d_model", d_model, "encoder and decoder need the same d_model")
        self.embed = nn.Embedding(vocab_size, d_model)
        self.encoder = Stack(encoder, "encoder.layers")
        self.decoder = Stack(decoder, "model.layers")
        self.head = None if tie_embeddings else nn.Linear(d_model, vocab_size, bias=False)
        self.reset_parameters()

    @property
    def checkpoint_blocks(self) -> bool:
        """Activation checkpointing (train.activation_checkpointing) in both stacks (:class:`Stack`)."""
        return self.encoder.checkpoint_blocks and self.decoder.checkpoint_blocks

    @checkpoint_blocks.setter
    def checkpoint_blocks(self, value: bool) -> None:
        self.encoder.checkpoint_blocks = self.decoder.checkpoint_blocks = value

    def reset_parameters(self, seed: int | None = None) -> None:
        """Re-draw every weight as :func:`zoo.models.base.init_stack` says (seed: default the last
        torch.manual_seed); residual outputs of ``encoder.*`` scale by the encoder's depth, the rest by
        the decoder's. The token embedding follows the decoder's positions (else the encoder's)."""
        depths = {"encoder": residual_branches(self.encoder.blocks), "decoder": residual_branches(self.decoder.blocks)}
        stds = token_init_stds(self.decoder.pos_embed) or token_init_stds(self.encoder.pos_embed)
        init_stack(self, lambda name: depths.get(name.split(".")[0], depths["decoder"]), seed, stds)

    def encode(self, src_ids: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """src_ids: (b, s) -> memory (b, s, d_model). src_mask: (b, s) bool, True at real tokens."""
        return self.encoder(self.embed(src_ids), key_mask=src_mask)

    def decode(
        self,
        tgt_ids: torch.Tensor,
        memory: torch.Tensor | None,
        *,
        memory_mask: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        caches: list[LayerState] | None = None,
    ) -> torch.Tensor:
        """The decoder's pass, the other half of :meth:`encode`: tgt_ids (b, t) -> logits (b, t, vocab),
        attending to memory (b, s, d_model). Sampling new tokens is :meth:`generate`.

        memory may be None once ``caches`` hold its keys and values (after the first cached step).
        key_mask: (b, t_k) bool over target keys (cached ones too), True at real tokens.
        """
        h = self.decoder(self.embed(tgt_ids), key_mask=key_mask, caches=caches, memory=memory, memory_mask=memory_mask)
        return self.logits(h)

    def forward(
        self,
        src_ids: torch.Tensor,
        tgt_ids: torch.Tensor,
        *,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher forcing: (b, s), (b, t) -> logits (b, t, vocab). Masks: True at real tokens."""
        memory = self.encode(src_ids, src_mask)
        return self.decode(tgt_ids, memory, memory_mask=src_mask, key_mask=tgt_mask)

    def new_caches(self, max_len: int | None = None) -> list[LayerState]:
        """One empty decoding state per decoder block; each also keeps its layer's memory keys and values."""
        return [LayerState(max_len) for _ in self.decoder.blocks]

    @torch.no_grad()
    def generate(
        self,
        src_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        *,
        bos_id: int = 0,
        src_mask: torch.Tensor | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Encode the source once, then generate ``max_new_tokens`` after ``bos_id``; -> (b, max_new_tokens).

        With the cache, each layer's memory keys and values are projected once, at the first step.
        Sampling as in :meth:`zoo.LanguageModel.generate`.
        """
        check_generate_args(src_ids, max_new_tokens, temperature, top_k, name="src_ids")
        memory = self.encode(src_ids, src_mask)
        ids = src_ids.new_full((src_ids.shape[0], max_new_tokens + 1), bos_id)  # BOS, then the new tokens
        caches = self.new_caches(max_new_tokens + 1) if use_cache else None

        def next_logits(token: torch.Tensor | None, step: int) -> torch.Tensor:
            if token is not None:
                ids[:, step] = token
            if caches is None:  # recompute the whole target
                return self.decode(ids[:, : step + 1], memory, memory_mask=src_mask)[:, -1]
            # Memory only at the first step: later steps read its keys and values from the caches.
            return self.decode(
                ids[:, step : step + 1], memory if step == 0 else None, memory_mask=src_mask, caches=caches
            )[:, -1]

        return generate_tokens(next_logits, src_ids, max_new_tokens, temperature, top_k, generator)

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per target token, source and target both ``seq_len`` long
        (:meth:`TokenModel.training_flops`): an encoder layer attends once, a decoder layer twice."""
        return self.training_flops(seq_len, attention_layers=len(self.encoder.blocks) + 2 * len(self.decoder.blocks))


def build_seq2seq(cfg: Mapping[str, Any] | DictConfig) -> Seq2SeqModel:
    """An encoder-decoder from a config: ``block`` (shared by both stacks), ``model`` (as for
    :func:`zoo.build_model`; ``n_layers``, ``pattern`` and ``layers`` are the decoder's) and an optional
    ``encoder`` section: ``n_layers`` (default: the decoder's), ``block`` (overrides of ``block``
    for the encoder), ``pattern`` and ``layers`` (its own, as the model's).

    Decoder blocks get ``cross_attention: true``; encoder blocks ``causal: false`` and no cross-attention.
    """
    raw = to_dict(cfg)
    options = model_options(raw)
    for key in DECODER_ONLY:
        default = MODEL_DEFAULTS[key]
        if options[key] != default:
            spelt = "null" if default is None else str(default).lower()
            why = f"{spelt} in an encoder-decoder: a decoder-only model's option"
            raise ConfigError(f"model.{key}", options[key], why)
    encoder = section(raw, "encoder", ENCODER_DEFAULTS)
    block = block_section(raw)
    d_model = resolve_block(block).dims.d_model  # errors in the shared block name block.*
    n_encoder = encoder["n_layers"] if encoder["n_layers"] is not None else options["n_layers"]
    positive_int("encoder.n_layers", n_encoder)
    changes = encoder["block"] or {}
    if not isinstance(changes, Mapping):
        raise ConfigError("encoder.block", changes, "must be a mapping of block overrides, e.g. {attn: mha}")
    if changes.get("d_model", d_model) != d_model:
        raise ConfigError("encoder.block.d_model", changes["d_model"], f"must equal block.d_model={d_model}")
    encoder_block = merge_block({**block, "causal": False, "cross_attention": False}, changes)
    try:
        resolve_block(encoder_block)
    except ConfigError as error:
        raise ConfigError(f"encoder.{error.field}", error.value, error.allowed) from None
    encoder_specs = stack_specs(encoder_block, {**encoder, "n_layers": n_encoder}, "encoder")
    decoder_block = {**block, "cross_attention": True}
    decoder_specs = stack_specs(decoder_block, options)
    return Seq2SeqModel(encoder_specs, decoder_specs, options["vocab_size"], options["tie_embeddings"])


__all__ = ["Seq2SeqModel", "build_seq2seq"]
