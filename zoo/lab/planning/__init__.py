"""From a config to a plan: every section checked before any tensor work, the run's model builder,
the process mesh and a branch's start."""
