"""A part's logical matrices: how its fused weights split (the ``matrix_blocks`` hook,
zoo.core.interface), checked, split and fused back. An optimizer that treats each matrix whole (Muon,
zoo.lab.recipe.muon) reads them here rather than guessing from shapes."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from zoo.core.interface import defines
from zoo.core.registry import AXES


def part_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The modules of ``model`` that are parts: instances of a registered part class, or modules that
    declare ``matrix_blocks`` (a cross-attention, built by its self-attention)."""
    classes = {part.cls for registry in AXES.values() for part in registry.parts()}
    return {
        name: module
        for name, module in model.named_modules()
        if type(module) in classes or defines(type(module), "matrix_blocks")
    }


def depthwise_kernel(param: torch.Tensor) -> bool:
    """Whether ``param`` has a depthwise convolution's kernel layout (channels, 1, taps): one short filter
    per channel, each channel's apart from the others' (μP's vector role), not a matrix or a bank of them."""
    return param.ndim == 3 and param.shape[1] == 1


def check_blocks(module: nn.Module, owner: str, blocks: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
    """A part's declaration names its own 2-D or 3-D parameters, no depthwise convolution's kernel, and
    tiles each one's rows exactly once."""
    params = dict(module.named_parameters())
    for local, split in blocks.items():
        where = f"{type(module).__name__} {owner or '(model)'}: matrix_blocks[{local!r}]"
        if local not in params or params[local].ndim not in (2, 3):
            raise ValueError(f"{where} names no 2-D or 3-D parameter of the part")
        if depthwise_kernel(params[local]):
            raise ValueError(
                f"{where}: is a depthwise convolution's kernel {tuple(params[local].shape)}, one filter per "
                "channel, not a bank of matrices; leave it undeclared (AdamW)"
            )
        rows = torch.cat([torch.as_tensor(r).reshape(-1) for r in split.values()]).sort().values
        if not torch.equal(rows, torch.arange(params[local].shape[-2])):
            raise ValueError(f"{where}: the blocks must cover each of its {params[local].shape[-2]} rows exactly once")


def split_blocks(param: torch.Tensor, blocks: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``param``'s logical matrices: each block's rows (for a 3-D bank, each leading index's)."""
    return {name: param.index_select(-2, rows) for name, rows in blocks.items()}


def fuse_blocks(parts: Mapping[str, torch.Tensor], blocks: Mapping[str, torch.Tensor], rows: int) -> torch.Tensor:
    """The inverse of :func:`split_blocks`: the logical matrices back into one parameter of ``rows`` rows."""
    first = next(iter(parts.values()))
    out = first.new_empty((*first.shape[:-2], rows, first.shape[-1]))
    for name, index in blocks.items():
        out.index_copy_(-2, index, parts[name])
    return out
