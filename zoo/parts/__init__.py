"""Every built-in part. Importing this package registers them (explicit imports, no scanning)."""

from zoo.parts import attention, latent_attention, linear_attention, mlps, moe, norms, placements, positions, residuals

# isort: split
from zoo.parts import gated_deltanet  # after linear_attention: each axis lists its parts in registration order

__all__ = [
    "attention", "gated_deltanet", "latent_attention", "linear_attention", "mlps", "moe", "norms", "placements",
    "positions", "residuals",
]  # fmt: skip
