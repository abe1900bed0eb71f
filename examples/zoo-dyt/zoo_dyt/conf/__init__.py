"""Option files of zoo-dyt's parts, one folder per axis (on zoo's Hydra search path)."""
