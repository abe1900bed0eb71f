"""The one error type for bad configuration: it names the field, the value and what is allowed."""

from __future__ import annotations

from typing import Any


def install_extra(extra: str) -> str:
    """How to install one of zoo's optional extras (pyproject.toml), for an error to say: from zoo's clone."""
    return f'pip install -e ".[{extra}]" in zoo\'s clone'


class ConfigError(ValueError):
    """A configuration value is not allowed.

    The message always reads ``<field>=<value>: <allowed>`` so a user can fix the one thing wrong.
    """

    def __init__(self, field: str, value: Any, allowed: str) -> None:
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}={value!r}: {allowed}")


class IncompatibleParts(ConfigError):
    """Parts that are each valid but cannot be combined: one needs what no other part provides, or
    conflicts with what another provides (zoo.assembly.compat). A sweep over a grid of parts records
    such a combination as ``incompatible``, with this reason, rather than as a failed run."""
