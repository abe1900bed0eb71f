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
from zoo.parts import gated_deltanet  # after linear_attention: each axis lists its parts in registration order

__all__ = [
    "attention", "attention_options", "gated_deltanet", "latent_attention", "linear_attention", "mlps", "moe",
    "norms", "placements", "positions", "residuals",
]  # fmt: skip
