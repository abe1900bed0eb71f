"""The stack of blocks both models run: absolute positions added to the token embeddings, the blocks in
turn (each with its decoding state, optionally recomputed in backward), then the final norm.

The decoder-only :class:`zoo.LanguageModel` is a Stack with the token embedding in front and the LM
head after it; the encoder-decoder (:class:`zoo.Seq2SeqModel`) runs two, ``encoder`` and ``decoder``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from zoo.assembly.build import build_block
from zoo.assembly.spec import BlockSpec
from zoo.core import tp
from zoo.core.channel import ENTRIES, Channel
from zoo.core.errors import ConfigError
from zoo.core.interface import hook
from zoo.core.tp import Plan, prefixed
from zoo.models.smear_backout import Backout
from zoo.parts.attention import Attention
from zoo.parts.documents import Documents
from zoo.parts.positions import LearnedEmbedding
from zoo.parts.residuals import stream_count
from zoo.parts.state import LayerState


def final_norm_for(spec: BlockSpec) -> nn.Module:
    """The norm after the last block when its placement needs one (pre), else Identity."""
    return spec.make_norm() if hook(spec["placement"].part.cls, "final_norm") else nn.Identity()


def embeds_positions(spec: BlockSpec) -> bool:
    """Whether the block's position part is added at the embedding (it needs one: learned, sinusoidal)."""
    return "embedding" in hook(spec["pos"].part.cls, "needs")


def check_positions(specs: Sequence[BlockSpec], fields: Sequence[str]) -> None:
    """Positions added at the embedding reach every layer, so all layers must agree on them: a layer
    whose ``pos`` differs from layer 0's when either is an embedding-side position is a ConfigError
    naming ``{fields[i]}.pos`` (per-layer ``pos`` may only vary among positions applied inside
    attention: none, rotary, alibi). fields: where each layer's overrides sit (``model.layers.3``)."""
    first = specs[0]
    for i, spec in enumerate(specs[1:], 1):
        embedded = embeds_positions(first) or embeds_positions(spec)
        same = spec["pos"] == first["pos"] and spec.dims.max_len == first.dims.max_len
        if embedded and not same:
            raise ConfigError(
                f"{fields[i]}.pos",
                spec["pos"].part.name,
                f"layer 0 has pos={first['pos'].part.name}; positions added at the token embedding "
                "(learned, sinusoidal) apply to every layer, so set them once with block.pos, not per layer",
            )


def check_streams(specs: Sequence[BlockSpec], fields: Sequence[str]) -> int:
    """The residual streams every layer keeps (``block.residual``: 1, hyper's ``n_streams``, or 0: attnres' growing
    sources); a layer that keeps another number than layer 0 is a ConfigError naming ``{fields[i]}.residual``."""
    first = stream_count(specs[0]["residual"])
    for i, spec in enumerate(specs[1:], 1):
        if stream_count(spec["residual"]) != first:
            raise ConfigError(
                f"{fields[i]}.residual",
                spec["residual"].part.name,
                f"keeps {stream_count(spec['residual'])} residual stream(s) and layer 0 "
                f"(residual={specs[0]['residual'].part.name}) {first}: every layer of a stack must keep as many",
            )
    return first


def position_embedding(specs: Sequence[BlockSpec], field: str = "model.layers") -> nn.Module | None:
    """The module that adds the stack's absolute positions to its token embeddings, or None; the layers
    must agree on them (:func:`check_positions`, naming ``{field}.{i}.pos``)."""
    check_positions(specs, [f"{field}.{i}" for i in range(len(specs))])
    first = specs[0]
    return first["pos"].build(first.dims).embedding()


def value_tables(blocks: Sequence[nn.Module], vocab_size: int, field: str) -> nn.ModuleList:
    """One value embedding table per layer (``model.value_embeddings``): vocab_size x the layer's attention's
    ``value_width``; a layer whose mixer takes none is a ConfigError naming ``{section}.value_embeddings``."""
    tables = []
    for i, block in enumerate(blocks):
        width = hook(block.attn, "value_width")
        if width is None:
            raise ConfigError(
                f"{field.rpartition('.')[0]}.value_embeddings",
                True,
                f"false here: layer {i}'s attention ({type(block.attn).__name__}) takes no value embedding; "
                "softmax attention (mha, gqa, mqa) does",
            )
        tables.append(nn.Embedding(vocab_size, width))
    return nn.ModuleList(tables)


def join_channel(
    blocks: Sequence[nn.Module], specs: Sequence[BlockSpec], field: str, stack_entries: frozenset[str], tables: bool
) -> list[bool]:
    """Tell each layer's mixer its index and the side-channel entries before it (the stack's ``stack_entries``,
    ``value_embedding`` where it has a table, and what earlier layers write: zoo.core.channel); which layers use
    the channel. A layer reading an entry nothing provides is a ConfigError naming the option that reads it
    (``{field}.{i}.attn.value_residual``)."""
    written, used = set(stack_entries), []
    for i, (block, spec) in enumerate(zip(blocks, specs, strict=True)):
        provided = frozenset(written | ({"value_embedding"} if tables else set()))
        use = hook(block.attn, "join_channel")(i, provided)
        for name, option in use.reads.items():
            if name not in provided:
                axis, _, key = option.partition(".")
                value = spec[axis].options.get(key, spec[axis].part.name) if axis in spec.choices else None
                raise ConfigError(
                    f"{field}.{i}.{option}",
                    value,
                    f"reads the side channel's {name!r} ({ENTRIES.get(name, 'a plugin entry')}), which nothing "
                    f"before layer {i} writes (written before it: {', '.join(sorted(written)) or 'none'})",
                )
        written |= use.writes
        used.append(use.used)
    return used


def share_kv(blocks: Sequence[nn.Module], specs: Sequence[BlockSpec], k: int, field: str) -> None:
    """``model.kv_share`` = k: each group of k layers attends with its first layer's keys and values (it writes
    them to the side channel; the others read them, with no key/value projection and nothing cached). Every layer
    must be softmax attention (mha, gqa, mqa) with the same key/value heads, head width and positions as its
    group's first, without what changes its values alone (value residual, value embeddings) or a canon layer on
    its keys (site b): else a ConfigError naming ``{section}.kv_share``."""
    if k == 1:
        return
    section = field.rpartition(".")[0]
    for i, (block, spec) in enumerate(zip(blocks, specs, strict=True)):
        first = i - i % k
        why = None
        if not isinstance(block.attn, Attention):
            why = f"layer {i}'s attention ({spec['attn'].part.name}) holds no keys and values to share"
        elif block.attn.value_residual != "none" or "b" in block.attn.dims.canon_sites:
            why = f"layer {i} changes its keys or values itself (value_residual, canon site b)"
        elif first != i and (spec["pos"] != specs[first]["pos"] or
                             (block.attn.n_kv_heads, block.attn.d_head) !=
                             (blocks[first].attn.n_kv_heads, blocks[first].attn.d_head)):  # fmt: skip
            why = f"layer {i}'s key/value heads, head width or positions differ from layer {first}'s, its group's first"
        if why is not None:
            raise ConfigError(f"{section}.kv_share", k, f"1 here: {why}; softmax attention (mha, gqa, mqa) alike "
                              "across each group shares")  # fmt: skip
    for i, block in enumerate(blocks):
        if i % k == 0 and i + 1 < len(blocks):
            block.attn.share_kv("writes")
        elif i % k:
            block.attn.share_kv("reads")


class Stack(nn.Module):
    """Absolute positions added to its input (``pos_embed``, when the blocks' ``pos`` is learned or
    sinusoidal), blocks in turn, then ``final_norm`` where the last block's placement needs one.
    With ``block.residual=hyper`` the blocks pass ``streams`` residual streams (b, t, streams, d_model): the
    input copied into each before the first block, their sum taken before the final norm; with ``scaled`` each
    block is also given the input (after positions) as ``x0``.

    Parameter names: ``pos_embed`` (``pos=learned`` only), ``blocks.{i}.*``, ``final_norm``; a stack
    that owns its token embedding (the decoder-only model) registers ``embed`` before them, so the
    parameters come in the order embedding, positions, blocks, final norm.

    field: where the stack's per-layer overrides sit (``model.layers``, ``encoder.layers``), for errors.
    ``value_embeddings`` (a stack owning its token embedding): a table per layer, ``value_embeds.{i}``, whose
    rows for the tokens each layer's attention adds to its values (zoo.parts.values).

    The side channel (zoo.core.channel): each mixer is told its layer and what the channel provides once built
    (its ``join_channel`` hook); a forward makes one :class:`~zoo.core.channel.Channel` (with ``ids``, the tokens,
    when given) and hands it to the mixers that use it, and none when none does.
    """

    def __init__(
        self,
        specs: Sequence[BlockSpec],
        field: str = "model.layers",
        *,
        embed: nn.Embedding | None = None,
        value_embeddings: bool = False,
        backout: bool = False,
        kv_share: int = 1,
    ) -> None:
        super().__init__()
        if embed is not None:
            self.embed = embed
        self.pos_embed = position_embedding(specs, field)  # absolute positions, else None
        #: The residual streams between the blocks (block.residual=hyper: n_streams; attnres: 0, its sources; else 1).
        self.streams = check_streams(specs, [f"{field}.{i}" for i in range(len(specs))])
        #: Each layer's validated spec, as built: what an export reads (BlockSpec.settings).
        self.specs = tuple(specs)
        self.blocks = nn.ModuleList(build_block(s, context="model", layer=i) for i, s in enumerate(specs))
        self.final_norm = final_norm_for(specs[-1])
        #: ``model.backout``: the last layer's output less a learned multiple of a middle layer's
        #: (zoo.models.smear_backout).
        self.backout = Backout(len(specs)) if backout else None
        if kv_share > 1 and value_embeddings:
            raise ConfigError(f"{field.rpartition('.')[0]}.kv_share", kv_share, "1 with value_embeddings (they change "
                              "each layer's own values)")  # fmt: skip
        #: model.kv_share: each group of this many layers shares its first layer's keys and values.
        self.kv_share = kv_share
        share_kv(self.blocks, specs, kv_share, field)
        if value_embeddings and embed is None:
            raise ValueError("value embeddings need a stack that owns its token embedding")
        self.value_embeds = value_tables(self.blocks, embed.num_embeddings, field) if value_embeddings else None
        stack_entries = frozenset({"ids"} if embed is not None else ())
        #: Whether each layer's mixer uses the side channel.
        self.channel_layers = join_channel(self.blocks, specs, field, stack_entries, value_embeddings)
        #: Activation checkpointing (train.activation_checkpointing): each block's activations are
        #: recomputed in backward (torch.utils.checkpoint) instead of kept.
        self.checkpoint_blocks = False

    def forward(
        self,
        x: torch.Tensor,
        *,
        key_mask: torch.Tensor | None = None,
        caches: list[LayerState] | None = None,
        positions: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        ids: torch.Tensor | None = None,
        before_layer: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
        documents: Documents | None = None,
    ) -> torch.Tensor:
        """(b, t, d_model) token embeddings -> the final-normed residual stream (b, t, d_model).

        key_mask: (b, t_k) bool, True at real tokens (t_k counts cached tokens too).
        caches: one LayerState per block, written in place.
        positions: (b, t) per-sample position ids (left-padded batches); default: cache slots.
        memory, memory_mask: the encoder's output and its mask, for blocks with cross-attention.
        ids: (b, t) the tokens' ids, the side channel's ``ids`` (needed by value embeddings).
        before_layer: (i, x) -> layer i's input, applied to the stream before each block (``model.ngram``'s sum).
        documents: every token's document (cached ones included, zoo.parts.documents), handed to every block.
        """
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(f"need one cache per block ({len(self.blocks)}), got {len(caches)}")
        if self.value_embeds is not None and ids is None:
            raise ValueError("a stack with value embeddings needs the tokens' ids")
        x0 = x = self.add_positions(x, caches, positions)
        if self.streams != 1:  # hyper: the embedding copied into every stream; attnres: its first source
            x = self.blocks[0].residual.expand(x)
        channel = Channel(ids) if any(self.channel_layers) else None  # one per forward: the new tokens'
        for i, block in enumerate(self.blocks):
            cache = None if caches is None else caches[i]
            inputs = {"key_mask": key_mask, "cache": cache, "positions": positions}
            inputs |= {"memory": memory, "memory_mask": memory_mask}
            if documents is not None:
                inputs["documents"] = documents
            if hook(block.residual, "uses_x0"):  # block.residual=scaled: the embedding output re-injected
                inputs["x0"] = x0
            if channel is not None and self.channel_layers[i]:
                inputs["channel"] = self.channel_for(channel, i)
            if before_layer is not None:
                x = before_layer(i, x)
            if self.checkpoint_blocks and torch.is_grad_enabled():  # keep only each block's input for backward
                x = checkpoint(block, x, use_reentrant=False, **inputs)
            else:
                x = block(x, **inputs)
            if self.backout is not None and i == self.backout.layer:
                middle = x
        if self.streams != 1:
            x = self.blocks[-1].residual.merge(x)
        if self.backout is not None:
            x = self.backout(x, self.blocks[-1].residual.merge(middle) if self.streams != 1 else middle)
        return self.final_norm(x)

    def channel_for(self, channel: Channel, layer: int) -> Channel:
        """``layer``'s view of the forward's channel: with its value embedding's rows for the tokens, if any."""
        if self.value_embeds is None:
            return channel.at(layer)
        return channel.at(layer, value_embedding=self.value_embeds[layer](channel.read("ids")))

    def add_positions(
        self, x: torch.Tensor, caches: list[LayerState] | None, positions: torch.Tensor | None
    ) -> torch.Tensor:
        """x plus the absolute positions (when the stack adds them), which continue after the cached tokens."""
        if self.pos_embed is None:
            return x
        static = bool(caches) and caches[0].static  # a static cache's length is on the device: not read here
        offset = caches[0].length if caches and not static else 0
        if isinstance(self.pos_embed, LearnedEmbedding) and not static:  # static: checked against max_len
            self.pos_embed.check_length(offset + x.shape[1])  # per-sample positions never pass their slot
        if positions is None and static:
            raise ValueError("a static cache needs the tokens' positions (StaticDecoder passes them)")
        slots = torch.arange(offset, offset + x.shape[1], device=x.device)
        return self.pos_embed(x, slots if positions is None else positions)

    def tp_plan(self, sequence_parallel: bool = True) -> Plan:
        """The stack's tensor-parallel plan: learned positions replicated, each block by its parts' plans.

        With ``sequence_parallel`` the residual stream between the branches is split on the sequence
        (norms and dropout on each rank's tokens): cut at the first block, gathered whole after the
        final norm. Without it (cached generation, one token per step) every rank holds the whole stream.
        """
        if self.value_embeds is not None:
            raise ValueError("value embeddings have no tensor-parallel plan (model.value_embeddings: refused under tp)")
        if self.backout is not None:
            raise ValueError("backout has no tensor-parallel plan (model.backout: refused under tp)")
        if self.kv_share > 1:
            raise ValueError("shared keys and values have no tensor-parallel plan (model.kv_share: refused under tp)")
        plan: Plan = {}
        if self.pos_embed is not None:
            plan.update(prefixed("pos_embed", self.pos_embed.tp_plan(sequence_parallel)))
        for i, block in enumerate(self.blocks):
            plan.update(prefixed(f"blocks.{i}", block.tp_plan(sequence_parallel)))
        final = {} if isinstance(self.final_norm, nn.Identity) else self.final_norm.tp_plan(sequence_parallel)
        if sequence_parallel:
            plan["blocks.0"] = tp.PrepareModuleInput(
                input_layouts=(tp.Replicate(),), desired_input_layouts=(tp.Shard(1),), use_local_output=True
            )
            for i, block in enumerate(self.blocks):  # x0 (block.residual=scaled): cut as the stream is
                if hook(block.residual, "uses_x0"):
                    plan[f"blocks.{i}"] = tp.PrepareModuleInput(
                        input_layouts=(tp.Replicate(),) if i == 0 else (None,),
                        desired_input_layouts=(tp.Shard(1),) if i == 0 else (None,),
                        input_kwarg_layouts={"x0": tp.Replicate()},
                        desired_input_kwarg_layouts={"x0": tp.Shard(1)},
                        use_local_output=True,
                    )
            gather = tp.PrepareModuleOutput(
                output_layouts=tp.Shard(1), desired_output_layouts=tp.Replicate(), use_local_output=True
            )
            norm = tp.SequenceParallel(use_local_output=False)
            final = {"": tp.Chain(norm, gather) if final else gather}
        plan.update(prefixed("final_norm", final))
        return plan


__all__ = [
    "Stack", "check_positions", "check_streams", "embeds_positions", "final_norm_for", "position_embedding", "share_kv",
]
