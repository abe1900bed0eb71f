"""Sizes and switches shared by every part of a block."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class BlockDims:
    """The block-wide settings a part is built from (``block.d_model``, ``block.n_heads``, ...).

    ``d_ff`` is the MLP hidden width; ``None`` lets the MLP pick its own default.
    ``causal`` is False for encoder blocks. ``cross_attention`` adds a cross-attention sub-layer
    (decoder blocks of an encoder-decoder model). ``max_len`` is the longest sequence the block will see
    (positions ``0..max_len-1``): it sizes learned positions and bounds an attention window;
    ``None`` means unbounded. ``canon``: the canon layers' sites (``none``, or letters of ``abcd``;
    zoo.parts.canon), checked by the assembly; parts read :attr:`canon_sites`.
    """

    d_model: int = 256
    n_heads: int = 8
    d_ff: int | None = None
    bias: bool = True
    dropout: float = 0.0
    causal: bool = True
    cross_attention: bool = False
    max_len: int | None = None
    canon: str = "none"

    @property
    def canon_sites(self) -> str:
        """The canon sites as letters (``""`` for ``none``)."""
        return "" if self.canon == "none" else self.canon

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


def dropout(p: float) -> nn.Module:
    """nn.Dropout(p), or Identity when p == 0 (no per-call cost in train())."""
    return nn.Dropout(p) if p > 0 else nn.Identity()
