"""Beyond one process and one eager forward: compiling blocks, activation checkpointing.

Everything here goes through PyTorch's own engine: ``torch.compile`` per block (``fullgraph=True``:
a graph break is an error, not a silent slowdown) and ``torch.utils.checkpoint`` per block.
"""

from __future__ import annotations

from torch import nn


def compile_blocks(model: nn.Module, backend: str = "inductor") -> None:
    """Compile each of ``model.blocks`` in place (``nn.Module.compile``, one graph per block, no
    breaks allowed); parameter names and the state dict are unchanged."""
    for block in model.blocks:  # type: ignore[union-attr]
        block.compile(fullgraph=True, backend=backend)
