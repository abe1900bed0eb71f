"""Sizes and switches shared by every part of a block."""

from __future__ import annotations

from dataclasses import Field, dataclass, field, fields

from torch import nn


@dataclass(frozen=True)
class BlockDims:
    """The block-wide settings a part is built from (``block.d_model``, ``block.n_heads``, ...).

    ``d_ff`` is the MLP hidden width; ``None`` lets the MLP pick its own default.
    ``causal`` is False for encoder blocks. ``cross_attention`` adds a cross-attention sub-layer
    (decoder blocks of an encoder-decoder model). ``max_len`` is the longest sequence the block will see
    (positions ``0..max_len-1``): it sizes learned positions and bounds an attention window;
    ``None`` means unbounded. ``canon``: the canon layers' sites (``none``, or letters of ``abcd``;
    zoo.parts.canon), checked by the assembly; parts read :attr:`canon_sites`. ``out_conv``: the branches whose
    output takes canon's convolution before the residual add (``none``, ``attn``, ``mlp``, ``attn,mlp``).
    ``head_dim``: the attention's head width when its ``block.attn.head_dim`` sets one (the assembly copies it
    here, so the position part and the attention's own modules read the same :attr:`d_head`); no config key of its
    own.
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
    out_conv: str = "none"
    head_dim: int | None = field(default=None, metadata={"set_by": "block.attn.head_dim"})

    @property
    def canon_sites(self) -> str:
        """The canon sites as letters (``""`` for ``none``)."""
        return "" if self.canon == "none" else self.canon

    @property
    def out_conv_sites(self) -> tuple[str, ...]:
        """The branches ``out_conv`` names (``()`` for ``none``)."""
        return () if self.out_conv == "none" else tuple(self.out_conv.split(","))

    @property
    def d_head(self) -> int:
        """A head's width: ``head_dim``, else d_model / n_heads."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads


def block_fields() -> tuple[Field, ...]:
    """The fields of :class:`BlockDims` a block config sets (``block.d_model``...): all but those an option sets."""
    return tuple(f for f in fields(BlockDims) if "set_by" not in f.metadata)


def dropout(p: float) -> nn.Module:
    """nn.Dropout(p), or Identity when p == 0 (no per-call cost in train())."""
    return nn.Dropout(p) if p > 0 else nn.Identity()
