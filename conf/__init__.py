"""zoo's Hydra config tree, shipped inside the package as ``zoo.conf`` (pyproject.toml's package-dir).

One group per block axis (``placement``, ``norm``, ``attn``, ``pos``, ``mlp``), ``preset`` and ``task``;
``config.yaml`` is the primary config.
"""
