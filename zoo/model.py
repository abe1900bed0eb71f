"""A decoder-only language model: token embedding, a stack of blocks, final norm, LM head."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from zoo.block import Block
from zoo.build import BlockSpec, build_block, resolve_block, to_dict
from zoo.errors import ConfigError
from zoo.init import seeded_parameters
from zoo.parts.attention import KVCache


class LanguageModel(nn.Module):
    """Token ids (batch, time) -> next-token logits (batch, time, vocab).

    Parameter names: ``embed``, ``pos_embed`` (absolute positions: ``learned``), ``blocks.{i}.*``,
    ``final_norm`` (pre-norm stacks only), ``head`` (absent when tied to the embedding).
    """

    def __init__(self, spec: BlockSpec, vocab_size: int, n_layers: int, tie_embeddings: bool = True) -> None:
        super().__init__()
        d_model = spec.dims.d_model
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos_embed = spec["pos"].build(spec.dims).embedding()  # absolute positions, else None
        self.blocks = nn.ModuleList(build_block(spec, context="model") for _ in range(n_layers))
        needs_final_norm = spec["placement"].part.cls.final_norm
        self.final_norm = spec["norm"].build(spec.dims) if needs_final_norm else nn.Identity()
        self.head = None if tie_embeddings else nn.Linear(d_model, vocab_size, bias=False)
        self.reset_parameters(n_layers)

    def reset_parameters(self, n_layers: int, seed: int | None = None) -> None:
        """Normal(0, 0.02) weights, zero biases; residual-output projections scaled by 1/sqrt(2 n_layers).

        Each draw is seeded from (seed, name, shape) (zoo.init; seed: the last torch.manual_seed).
        """
        for name, p in seeded_parameters(self, seed):
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.ndim >= 2:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("attn.out.weight", "mlp.down.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(
        self,
        ids: torch.Tensor,
        *,
        key_mask: torch.Tensor | None = None,
        caches: list[KVCache] | None = None,
    ) -> torch.Tensor:
        """ids: (b, t) -> logits (b, t, vocab). caches: one KVCache per block, appended to in place."""
        x = self.embed(ids)  # (b, t, d)
        if self.pos_embed is not None:  # absolute positions continue after the cached ones
            offset = caches[0].length if caches else 0
            x = self.pos_embed(x, torch.arange(offset, offset + ids.shape[1], device=ids.device))
        for i, block in enumerate(self.blocks):
            x = block(x, key_mask=key_mask, cache=None if caches is None else caches[i])
        x = self.final_norm(x)
        return self.head(x) if self.head is not None else x @ self.embed.weight.T

    def new_caches(self) -> list[KVCache]:
        return [KVCache() for _ in self.blocks]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def parameter_counts(self) -> dict[str, int]:
        """Parameters by component: embedding (and untied head), attention, mlp, norms, total."""
        counts = {"embedding": 0, "attention": 0, "mlp": 0, "norms": 0}
        for name, p in self.named_parameters():
            counts[component_of(name)] += p.numel()
        counts["total"] = sum(counts.values())
        return counts

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs (forward + backward) per token at context ``seq_len``.

        6 x the non-embedding parameters (each weight: one multiply-add forward, two backward),
        plus attention scores and weighted values: 6 x n_layers x seq_len x d_model
        (Kaplan et al. 2020, without halving for the causal mask).
        """
        counts = self.parameter_counts()
        dense = counts["total"] - counts["embedding"] + self.embed.weight.numel()  # the LM head matmul counts
        return 6 * dense + 6 * len(self.blocks) * seq_len * self.embed.embedding_dim


def component_of(name: str) -> str:
    """The component a parameter belongs to, from its name (``blocks.0.attn.qkv.weight`` -> attention)."""
    if name.startswith(("embed", "pos_embed", "head")):
        return "embedding"
    if ".attn." in name or ".cross_attn." in name:
        return "attention"
    if ".mlp." in name:
        return "mlp"
    return "norms"


def build_model(cfg: Mapping[str, Any] | DictConfig) -> LanguageModel:
    """A model from a config with a ``block`` section and a ``model`` section
    (``vocab_size``, ``n_layers``, ``tie_embeddings``)."""
    raw = to_dict(cfg)
    spec = resolve_block(raw.get("block", {}))
    model = dict(raw.get("model") or {})
    allowed = {"vocab_size": 256, "n_layers": 2, "tie_embeddings": True}
    for key, value in model.items():
        if key not in allowed:
            raise ConfigError(f"model.{key}", value, f"unknown key; allowed: {', '.join(allowed)}")
    options = {**allowed, **model}
    for key in ("vocab_size", "n_layers"):
        if not isinstance(options[key], int) or isinstance(options[key], bool) or options[key] < 1:
            raise ConfigError(f"model.{key}", options[key], "must be a positive integer")
    return LanguageModel(spec, options["vocab_size"], options["n_layers"], bool(options["tie_embeddings"]))


__all__ = ["Block", "LanguageModel", "build_model"]
