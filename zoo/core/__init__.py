"""The foundation layer: the name registries, the one error type, block sizes and typed options.

Imports nothing else of zoo; every other layer builds on it.
"""
