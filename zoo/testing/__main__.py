"""``python -m zoo.testing``: the same as ``zoo-contract``."""

from zoo.testing.cli import main

main()
