"""zoo's versioned sweeps (``zoo-sweep NAME``), shipped inside the package as ``zoo.sweeps``."""
