"""The transformer block: receives built parts and wires them through its placement."""

from __future__ import annotations

import torch
from torch import nn

from zoo.core.channel import Channel
from zoo.core.tp import Plan, prefixed
from zoo.parts.canon import KERNEL, Canon, block_canon, block_out_conv
from zoo.parts.documents import Documents
from zoo.parts.placements import Branch, Placement
from zoo.parts.state import LayerState, query_slots


class Block(nn.Module):
    """Self-attention, optional cross-attention, then MLP, each a branch wired into the residual
    stream by ``placement`` (which holds one norm per branch).

    Never reads configs: build one with :func:`zoo.build_block`, or pass parts directly.
    Parameter names: ``attn.qkv``, ``attn.out``, ``mlp.*``, ``placement.norms.{0,1}``; with
    cross-attention also ``cross_attn.{q,kv,out}``, and the norms are ``placement.norms.{0,1,2}``
    (self-attention, cross-attention, MLP).

    ``residual``: how the branches join the stream (``block.residual``, zoo.parts.residuals: ``residual.*``);
    None: the placement adds them itself, as ``add`` does.

    ``canon``: the canon sites (``block.canon`` as letters, zoo.parts.canon). The block applies ``a`` and ``c``
    itself, on its branches' inputs (``canon.a.kernel``, ``canon.c.kernel``); the attention and the MLP apply
    ``b`` and ``d`` inside (built from the same ``dims``), the MLP handed the new tokens' padding mask and
    the decoding state.

    ``out_conv``: the branches (``attn``, ``mlp``) whose output takes a canon layer before the residual add
    (``block.out_conv``: ``out_conv.attn.kernel``, ``out_conv.mlp.kernel``), kept in the decoding state as canon's.
    """

    def __init__(
        self,
        placement: Placement,
        attn: nn.Module,
        mlp: nn.Module,
        d_model: int,
        cross_attn: nn.Module | None = None,
        canon: str = "",
        residual: nn.Module | None = None,
        out_conv: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self.placement = placement
        self.attn = attn
        self.cross_attn = cross_attn
        self.mlp = mlp
        self.d_model = d_model
        self.canon_sites = canon
        self.canon = block_canon(canon, d_model)
        self.out_conv = block_out_conv(out_conv, d_model)
        self.residual = residual
        #: The residual streams the block keeps: its input is (batch, time, d_model), or in a stack
        #: (batch, time, streams, d_model) when more than 1 (zoo.parts.residuals.Hyper), or any number when 0
        #: (attnres' sources, zoo.parts.attnres.AttentionResidual).
        self.streams: int = getattr(residual, "streams", 1)

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        """The block's tensor-parallel plan: its placement's (the norms), its attention's and its MLP's,
        each declared by the part (zoo.core.tp). Cross-attention has none."""
        if self.cross_attn is not None:
            raise ValueError("blocks with cross-attention have no tensor-parallel plan")
        plan: Plan = {}
        for name in ("placement", "attn", "mlp", "residual"):
            if getattr(self, name) is not None:
                plan.update(prefixed(name, getattr(self, name).tp_plan(sequence_parallel)))
        return plan

    def state_size(self, length: int) -> int:
        """Numbers one sample's decoding state holds after ``length`` tokens: the attention's (its
        ``state_size``) and each canon layer's last inputs (branch-output convolutions' too)."""
        return self.attn.state_size(length) + sum(m.state_size() for m in self.modules() if isinstance(m, Canon))

    def forward(
        self,
        x: torch.Tensor,
        *,
        key_mask: torch.Tensor | None = None,
        cache: LayerState | None = None,
        positions: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        x0: torch.Tensor | None = None,
        channel: Channel | None = None,
        documents: Documents | None = None,
    ) -> torch.Tensor:
        """x: (batch, time, d_model) -> (batch, time, d_model); a block of several residual streams
        (``streams``) also takes and returns them whole, (batch, time, streams, d_model), as a stack passes them.

        key_mask: (batch, keys) bool, True at real tokens, False at padding (keys include cached ones).
        cache: this layer's decoding state for incremental decoding (written in place).
        positions: (batch, time) per-sample position ids (left-padded batches); default: cache slots.
        memory: (batch, source, d_model) encoder output, for a block with cross-attention.
        memory_mask: (batch, source) bool, True at real source tokens.
        x0: (batch, time, d_model) the stack's embedding output, for a residual that re-injects it (``scaled``;
        None: the block's input).
        channel: the stack's side channel, handed to the attention (zoo.core.channel); None: none.
        documents: the document of every token (keys included, zoo.parts.documents), handed to the attention and
        the canon layers, which keep documents apart; None: one sequence.
        """
        streams = x.ndim == 4 and self.streams != 1 and x.shape[2] == (self.streams or x.shape[2])
        if not (x.ndim == 3 or streams) or x.shape[-1] != self.d_model:
            also = f" or (batch, time, streams={self.streams or 'n'}, d_model)" if self.streams != 1 else ""
            raise ValueError(
                f"block input must be (batch, time, d_model={self.d_model}){also}, got shape {tuple(x.shape)}"
            )
        if self.cross_attn is None and memory is not None:
            raise ValueError("this block has no cross-attention (block.cross_attention=false) but got memory")

        def attend(h: torch.Tensor) -> torch.Tensor:
            side = {} if channel is None else {"channel": channel}
            if documents is not None:
                side["documents"] = documents
            return self.attn(h, key_mask=key_mask, cache=cache, positions=positions, **side)

        branches: list[Branch] = [attend, self.mlp]
        if self.canon_sites or self.out_conv is not None:
            real, taps = new_token_masks(x, key_mask, cache, documents)
            if self.canon_sites:
                branches = self.canon_branches(real, taps, cache, attend)
            if self.out_conv is not None:
                branches = self.conv_outputs(branches, real, taps, cache)
        if self.cross_attn is not None:
            cross_attn = self.cross_attn

            def cross(h: torch.Tensor) -> torch.Tensor:
                return cross_attn(h, memory, memory_mask=memory_mask, cache=cache)

            branches.insert(1, cross)
        if self.residual is None:
            return self.placement(x, branches)
        return self.residual(x, x0, self.placement, branches)

    def canon_branches(
        self, real: torch.Tensor | None, taps: torch.Tensor | None, cache: LayerState | None, attend: Branch
    ) -> list[Branch]:
        """The attention and MLP branches with the canon sites: ``a`` before the attention, ``c`` before the
        MLP, and the MLP (site ``d``) handed the new tokens' padding mask (``real``), the decoding state and the
        taps inside each token's document (``taps``)."""
        canon = self.canon if self.canon is not None else {}

        def attend_after_canon(h: torch.Tensor) -> torch.Tensor:
            return attend(canon["a"](h, real, cache, taps) if "a" in canon else h)

        def feed(h: torch.Tensor) -> torch.Tensor:
            h = canon["c"](h, real, cache, taps) if "c" in canon else h
            return self.mlp(h, real=real, cache=cache, taps=taps) if "d" in self.canon_sites else self.mlp(h)

        return [attend_after_canon, feed]

    def conv_outputs(
        self, branches: list[Branch], real: torch.Tensor | None, taps: torch.Tensor | None, cache: LayerState | None
    ) -> list[Branch]:
        """The attention and MLP ``branches``, each that ``out_conv`` names followed by its canon layer (its taps
        inside each token's document, ``taps``)."""
        convs = self.out_conv if self.out_conv is not None else {}

        def then_conv(branch: Branch, site: str) -> Branch:
            return lambda h: convs[site](branch(h), real, cache, taps) if site in convs else branch(h)

        return [then_conv(branch, site) for branch, site in zip(branches, ("attn", "mlp"), strict=True)]


def new_token_masks(
    x: torch.Tensor, key_mask: torch.Tensor | None, cache: LayerState | None, documents: Documents | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """For the new tokens (the slots after those the state holds): ``real`` (b, t) bool, False at padding
    (``key_mask``'s columns), and ``taps`` (b, t, KERNEL) bool, whether each convolution tap lies in the token's
    document (``documents``); each None without its input."""
    slots = query_slots(None if cache is None else cache.mixer, x.shape[1], x.device)
    real = None if key_mask is None else key_mask.index_select(1, slots).bool()
    taps = None if documents is None else documents.taps(slots, KERNEL)
    return real, taps
