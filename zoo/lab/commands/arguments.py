"""argparse types shared by the command lines: a bad value is argparse's one-line error naming the flag and the value,
before any work."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a positive integer")
    return value
