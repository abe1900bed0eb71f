"""Every built-in part. Importing this package registers them (explicit imports, no scanning)."""

from zoo.parts import (
    attention,
    attention_options,
    latent_attention,
    linear_attention,
    mlps,
    moe,
    norms,
    placements,
    positions,
    residuals,
)

# isort: split
from zoo.parts import attnres, gated_deltanet  # after residuals, linear_attention: each axis in registration order

# isort: split
from zoo.parts import kda, mamba2  # after gated_deltanet, whose part the one extends and the other's state uses

__all__ = [
    "attention", "attention_options", "attnres", "gated_deltanet", "kda", "latent_attention", "linear_attention",
    "mamba2", "mlps", "moe", "norms", "placements", "positions", "residuals",
]  # fmt: skip
