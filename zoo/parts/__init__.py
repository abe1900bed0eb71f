"""Every built-in part. Importing this package registers them (explicit imports, no scanning)."""

from zoo.parts import attention, mlps, moe, norms, placements, positions

__all__ = ["attention", "mlps", "moe", "norms", "placements", "positions"]
