"""A decoder-only language model: token embedding, a stack of blocks, final norm, LM head."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn
from torch.utils.checkpoint import checkpoint

from zoo.assembly.build import build_block
from zoo.assembly.spec import BlockSpec, to_dict
from zoo.core.errors import ConfigError
from zoo.core.tp import (
    Chain,
    ColwiseParallel,
    Plan,
    PrepareModuleInput,
    PrepareModuleOutput,
    Replicate,
    RowwiseParallel,
    SequenceParallel,
    Shard,
    prefixed,
)
from zoo.models.base import (
    TokenModel,
    final_norm_for,
    init_stack,
    position_embedding,
    residual_branches,
    token_init_stds,
)
from zoo.models.config import block_section, layer_specs, model_options
from zoo.models.generate import check_generate_args, decode, padded_prompt
from zoo.parts.positions import LearnedEmbedding
from zoo.parts.state import LayerState


class LanguageModel(TokenModel):
    """Token ids (batch, time) -> next-token logits (batch, time, vocab).

    Parameter names: ``embed``, ``pos_embed`` (``pos=learned`` only), ``blocks.{i}.*``, ``final_norm``
    (when the last block's placement needs one), ``head`` (absent when tied to the embedding).
    Initialization: :func:`init_stack`; under ``pos=sinusoidal`` the token embedding is drawn with std
    d_model^-0.5 and scaled by sqrt(d_model) in the forward (:class:`zoo.parts.positions.SinusoidalEmbedding`).
    """

    def __init__(
        self,
        spec: BlockSpec | Sequence[BlockSpec],
        vocab_size: int,
        n_layers: int | None = None,
        tie_embeddings: bool = True,
    ) -> None:
        """spec: one BlockSpec repeated ``n_layers`` times, or one BlockSpec per layer."""
        super().__init__()
        specs = [spec] * (n_layers or 1) if isinstance(spec, BlockSpec) else list(spec)
        if n_layers is not None and len(specs) != n_layers:
            raise ConfigError("model.n_layers", n_layers, f"must match the {len(specs)} block specs given")
        if not specs or any(s.dims.d_model != specs[0].dims.d_model for s in specs):
            raise ConfigError("block.d_model", [s.dims.d_model for s in specs], "every layer needs the same d_model")
        d_model = specs[0].dims.d_model
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos_embed = position_embedding(specs)  # absolute positions, else None
        self.blocks = nn.ModuleList(build_block(s, context="model") for s in specs)
        self.final_norm = final_norm_for(specs[-1])
        self.head = None if tie_embeddings else nn.Linear(d_model, vocab_size, bias=False)
        #: Activation checkpointing (train.activation_checkpointing): each block's activations are
        #: recomputed in backward (torch.utils.checkpoint) instead of kept.
        self.checkpoint_blocks = False
        self.reset_parameters()

    def reset_parameters(self, seed: int | None = None) -> None:
        """Re-draw every weight as documented in :func:`init_stack` (seed: default the last torch.manual_seed)."""
        init_stack(self, residual_branches(self.blocks), seed, token_init_stds(self.pos_embed))

    def forward(
        self,
        ids: torch.Tensor,
        *,
        key_mask: torch.Tensor | None = None,
        caches: list[LayerState] | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ids: (b, t) -> logits (b, t, vocab).

        key_mask: (b, t_k) bool, True at real tokens (t_k counts cached tokens too).
        caches: one LayerState per block (:meth:`new_caches`), written in place.
        positions: (b, t) per-sample position ids (left-padded batches); default: cache slots.
        """
        return self.logits(self.hidden_states(ids, key_mask=key_mask, caches=caches, positions=positions))

    def hidden_states(
        self,
        ids: torch.Tensor,
        *,
        key_mask: torch.Tensor | None = None,
        caches: list[LayerState] | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ids: (b, t) -> the final-normed residual stream (b, t, d_model); arguments as in forward."""
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(f"need one cache per block ({len(self.blocks)}), got {len(caches)}")
        x = self.embed(ids)  # (b, t, d)
        if self.pos_embed is not None:  # absolute positions continue after the cached ones
            static = bool(caches) and caches[0].static  # a static cache's length is on the device: not read here
            offset = caches[0].length if caches and not static else 0
            if isinstance(self.pos_embed, LearnedEmbedding) and not static:  # static: checked against max_len
                self.pos_embed.check_length(offset + ids.shape[1])  # per-sample positions never pass their slot
            if positions is None and static:
                raise ValueError("a static cache needs the tokens' positions (StaticDecoder passes them)")
            slots = torch.arange(offset, offset + ids.shape[1], device=ids.device)
            x = self.pos_embed(x, slots if positions is None else positions)
        for i, block in enumerate(self.blocks):
            cache = None if caches is None else caches[i]
            if self.checkpoint_blocks and torch.is_grad_enabled():  # keep only each block's input for backward
                x = checkpoint(block, x, key_mask=key_mask, cache=cache, positions=positions, use_reentrant=False)
            else:
                x = block(x, key_mask=key_mask, cache=cache, positions=positions)
        return self.final_norm(x)

    def tp_plan(self, sequence_parallel: bool = True) -> Plan:
        """The model's tensor-parallel plan (``parallelize_module`` over the ``tp`` mesh dimension).

        The embedding (and an untied head) split by vocabulary rows; learned positions replicated;
        each block by its parts' plans. With ``sequence_parallel`` the residual stream between the
        branches is split on the sequence (norms and dropout on each rank's tokens): cut at the first
        block, gathered whole after the final norm for the head. Without it (cached generation, one
        token per step) every rank holds the whole stream.
        """
        plan: Plan = {"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())}
        if self.pos_embed is not None:
            plan.update(prefixed("pos_embed", self.pos_embed.tp_plan(sequence_parallel)))
        for i, block in enumerate(self.blocks):
            plan.update(prefixed(f"blocks.{i}", block.tp_plan(sequence_parallel)))
        final = {} if isinstance(self.final_norm, nn.Identity) else self.final_norm.tp_plan(sequence_parallel)
        if sequence_parallel:
            plan["blocks.0"] = PrepareModuleInput(
                input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True
            )
            gather = PrepareModuleOutput(
                output_layouts=Shard(1), desired_output_layouts=Replicate(), use_local_output=True
            )
            norm = SequenceParallel(use_local_output=False)
            final = {"": Chain(norm, gather) if final else gather}
        plan.update(prefixed("final_norm", final))
        if self.head is not None:
            plan["head"] = ColwiseParallel()  # its weight only: logits() reads it directly
        return plan

    def new_caches(self, max_len: int | None = None, static: bool = False) -> list[LayerState]:
        """One empty decoding state per block (each mixer fills in its own kind); ``max_len`` (prompt +
        new tokens) lets growing states preallocate. ``static``: fixed shapes for compiled decoding
        (:class:`zoo.StaticDecoder`)."""
        return [LayerState(max_len, static) for _ in self.blocks]

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        *,
        key_mask: torch.Tensor | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue each prompt by ``max_new_tokens`` tokens; returns only the new ones, (b, max_new_tokens).

        temperature 0 is greedy (argmax); otherwise sample softmax(logits / temperature), restricted
        to the ``top_k`` largest logits when given. Prompts of different lengths go in one batch
        left-padded, with ``key_mask`` (b, t) True at real tokens: each row then generates what it
        would alone. ``use_cache=False`` recomputes the whole sequence at every step (for comparison).
        Runs without gradients; call ``eval()`` first so dropout is off.
        """
        check_generate_args(prompt_ids, max_new_tokens, temperature, top_k)
        batch, time = prompt_ids.shape
        total = time + max_new_tokens
        positions, full_mask = padded_prompt(prompt_ids, key_mask, total)  # (b, t), (b, prompt + new)
        full_positions = None
        if positions is not None:
            steps = torch.arange(1, max_new_tokens + 1, device=prompt_ids.device)
            full_positions = torch.cat([positions, positions[:, -1:] + steps], dim=1)

        if use_cache:
            caches = self.new_caches(total)

            def next_logits(token: torch.Tensor | None, step: int) -> torch.Tensor:
                if token is None:  # prefill: the whole prompt at once
                    prompt_mask = None if full_mask is None else full_mask[:, :time]
                    h = self.hidden_states(prompt_ids, key_mask=prompt_mask, caches=caches, positions=positions)
                else:  # one token against the cache
                    end = time + step
                    h = self.hidden_states(
                        token[:, None],
                        key_mask=None if full_mask is None else full_mask[:, :end],
                        caches=caches,
                        positions=None if full_positions is None else full_positions[:, end - 1 : end],
                    )
                return self.logits(h[:, -1])

        else:
            ids = torch.cat([prompt_ids, prompt_ids.new_zeros(batch, max_new_tokens)], dim=1)

            def next_logits(token: torch.Tensor | None, step: int) -> torch.Tensor:
                end = time + step
                if token is not None:
                    ids[:, end - 1] = token
                h = self.hidden_states(
                    ids[:, :end],
                    key_mask=None if full_mask is None else full_mask[:, :end],
                    positions=None if full_positions is None else full_positions[:, :end],
                )
                return self.logits(h[:, -1])

        return decode(next_logits, prompt_ids, max_new_tokens, temperature, top_k, generator)

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token at context ``seq_len`` (:meth:`TokenModel.training_flops`)."""
        return self.training_flops(seq_len, attention_layers=len(self.blocks))


def build_model(cfg: Mapping[str, Any] | DictConfig, *, specs: Sequence[BlockSpec] | None = None) -> LanguageModel:
    """A model from a config with a ``block`` section and a ``model`` section: ``vocab_size``,
    ``n_layers``, ``tie_embeddings`` and ``layers`` (per-layer block overrides, ``{3: {attn: mqa}}``).
    ``specs``: the layers' specs already resolved from this config (:func:`zoo.models.config.layer_specs`)."""
    raw = to_dict(cfg)
    options = model_options(raw)
    block = block_section(raw)
    if specs is None:
        specs = layer_specs(block, options["n_layers"], options["layers"], "model.layers")
    for i, spec in enumerate(specs):
        if spec.dims.cross_attention:
            field = "block.cross_attention" if block.get("cross_attention") else f"model.layers.{i}.cross_attention"
            raise ConfigError(field, True, "a decoder-only model has no encoder memory; use zoo.build_seq2seq")
    return LanguageModel(specs, options["vocab_size"], tie_embeddings=options["tie_embeddings"])


__all__ = ["LanguageModel", "build_model"]
