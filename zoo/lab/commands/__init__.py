"""The command lines over finished runs: ``zoo-generate`` (:mod:`.generate`), ``zoo-eval`` and
``zoo-lm-eval`` (:mod:`.evaluate`). Each parses its arguments and calls the library."""
