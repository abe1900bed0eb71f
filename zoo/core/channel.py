"""The side channel: what a stack hands its blocks' sequence mixers beside the residual stream, per forward.

A block sees only its own input; some parts need more: the token ids, the first layer's values (value
residual, ResFormer), a per-layer table's rows for the tokens (value embeddings). A :class:`Stack
<zoo.models.stack.Stack>` whose mixers use the channel creates one :class:`Channel` per forward and hands it
to each of those mixers (``forward(..., channel=...)``); a stack whose mixers do not passes nothing, so they
run as before.

Entries are named tensors. The stack provides some (``ids``, and ``value_embedding`` to the layers that have
one) and mixers write others (``first_values``, written by layer 0). Which entries a mixer reads and writes
it says once, when the stack is built, through its ``join_channel(layer, provided)`` hook
(zoo.core.interface.AttentionHooks), returning a :class:`ChannelUse`; the stack refuses a layer that reads
an entry nothing before it provides, with a ConfigError naming the option that needs it. Every entry holds
the *new* tokens of the call only (a prefill's, then one decoding step's), as the stack's input does: a
mixer that caches state keeps what it needs of them itself.

:data:`ENTRIES` documents the built-in entries; a plugin part may use any other name (write it in one
layer, read it in a later one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

#: The built-in entries: name -> what it holds and who writes it.
ENTRIES: dict[str, str] = {
    "ids": "the new tokens' ids (b, t); written by a stack that owns its token embedding (the language model)",
    "first_values": "layer 0's attention values for the new tokens (b, n_kv_heads, t, d_head), after a value "
    "embedding if it has one; written by layer 0's softmax attention when it has block.attn.value_residual, read "
    "by the later layers' value residual",
    "shared_keys": "the keys of a kv_share group's first layer, cached ones included (b, n_kv_heads, t_k, d_head); "
    "written by that layer under model.kv_share, read by the group's later layers",
    "shared_values": "its values likewise (b, n_kv_heads, t_k, d_head)",
    "shared_new_values": "its values for the new tokens alone (b, n_kv_heads, t, d_head), for a reader's XSA",
    "shared_key_positions": "its keys' per-sample positions (b, t_k), when the batch has them",
    "value_embedding": "this layer's value embedding rows for the new tokens (b, t, n_kv_heads d_head); written "
    "by the stack before each layer with one (model.value_embeddings)",
}


@dataclass(frozen=True)
class ChannelUse:
    """What one layer's mixer does with the channel: ``reads`` (entry -> the option that needs it, its field
    under ``block``, e.g. ``attn.value_residual``, for errors) and ``writes`` (entries it writes)."""

    reads: Mapping[str, str] = field(default_factory=dict)
    writes: frozenset[str] = frozenset()

    @property
    def used(self) -> bool:
        return bool(self.reads or self.writes)


class Channel:
    """One forward's side channel: named tensors of the new tokens, written and read by layer.

    The stack hands each layer its own view, :meth:`at`: the layer's index (``layer``), the entries written
    before it, frozen at that moment, and its own (``value_embedding``). A layer's writes go to the forward's
    channel, seen by the views of later layers. So a block recomputed in backward (activation checkpointing)
    reads what it read in the forward, whatever was written since.
    """

    def __init__(self, ids: torch.Tensor | None = None) -> None:
        self.layer = 0
        self._written: dict[str, torch.Tensor] = {}  # the forward's, shared by every view
        self._visible = self._written  # what this view reads
        if ids is not None:
            self.write("ids", ids)

    def at(self, layer: int, **entries: torch.Tensor) -> Channel:
        """The view layer ``layer`` gets: what was written so far, and ``entries`` of its own."""
        view = Channel()
        view.layer, view._written, view._visible = layer, self._written, {**self._written, **entries}
        return view

    def __contains__(self, name: object) -> bool:
        return name in self._visible

    def write(self, name: str, value: torch.Tensor) -> None:
        """Set entry ``name`` for this layer and the later ones (replacing an earlier layer's, if any)."""
        self._written[name] = self._visible[name] = value

    def read(self, name: str) -> torch.Tensor:
        """Entry ``name``; one that nothing wrote is a KeyError naming it, the layer and the entries present
        (the stack's build-time check makes this a programming error, not a config one)."""
        if name not in self._visible:
            present = ", ".join(self._visible) or "none"
            raise KeyError(f"layer {self.layer} reads side-channel entry {name!r}, which nothing wrote ({present} did)")
        return self._visible[name]


__all__ = ["ENTRIES", "Channel", "ChannelUse"]
