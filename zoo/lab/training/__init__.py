"""Training a run: the orchestration of one run (folder, lock, resume), the loop, its step, evaluation,
probes, spike detection and scale (compile, FSDP2, tensor parallelism)."""
