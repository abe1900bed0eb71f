"""DyT (Zhu et al. 2025): a drop-in replacement for LayerNorm, registered as zoo's ``norm=dyt``."""

from typing import Any

import torch
from torch import nn

from zoo import NORMS, BlockDims, ConfigError


@NORMS.register(
    "dyt",
    formula="g * tanh(alpha * x) + b, alpha a learned scalar",
    reference="Zhu et al. 2025, Transformers without Normalization, arXiv:2503.10622",
)
class DynamicTanh(nn.Module):
    """DyT: an element-wise tanh with a learned input scale, gain and bias; no statistics."""

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        if not options["alpha_init"] > 0:
            raise ConfigError("block.norm.alpha_init", options["alpha_init"], "must be > 0")

    def __init__(self, dims: BlockDims, *, alpha_init: float = 0.5) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), alpha_init))
        self.weight = nn.Parameter(torch.ones(dims.d_model))
        self.bias = nn.Parameter(torch.zeros(dims.d_model)) if dims.bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.alpha * x) * self.weight
        return y if self.bias is None else y + self.bias
