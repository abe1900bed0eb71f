"""Every built-in part. Importing this package registers them (explicit imports, no scanning)."""

from zoo.parts import attention, latent_attention, linear_attention, mlps, moe, norms, placements, positions

__all__ = ["attention", "latent_attention", "linear_attention", "mlps", "moe", "norms", "placements", "positions"]
