"""Using a finished run: load it as it was trained, evaluate it, score it with lm-eval."""
