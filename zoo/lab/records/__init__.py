"""What a run leaves on disk and how it is read back: its summary, metrics, config hash, checkpoints,
the run lock, a sweep's status and the trackers that mirror the records."""
