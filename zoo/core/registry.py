"""Name registries: one per axis of the block, the allow-list of what a config may name."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from zoo.core.errors import ConfigError

T = TypeVar("T", bound=type)


@dataclass(frozen=True)
class Part:
    """A registered part: the class to build, the options its name presets, and its catalogue entry."""

    axis: str
    name: str
    cls: type
    summary: str
    formula: str
    reference: str
    defaults: dict[str, Any] = field(default_factory=dict)
    #: Named option settings the contract suite also covers, e.g. ``{"window": {"window": 3}}``
    #: (on every part of the axis that takes those options; tests/combos.py).
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)


class Registry:
    """Maps names to parts for one axis (``norm``, ``attn``, ...).

    >>> NORMS = Registry("norm")
    >>> @NORMS.register("rmsnorm", formula="x / rms(x) * g")
    ... class RMSNorm: ...
    """

    def __init__(self, axis: str, where: str | None = None) -> None:
        self.axis = axis
        self.where = where or f"block.{axis}.name"  # the config key that names a part, for errors
        self._parts: dict[str, Part] = {}

    def register(
        self,
        name: str,
        *,
        summary: str | None = None,
        formula: str = "",
        reference: str = "",
        variants: dict[str, dict[str, Any]] | None = None,
        **defaults: Any,
    ) -> Callable[[T], T]:
        """Class decorator registering ``cls`` under ``name``; ``defaults`` preset its options.

        ``summary`` defaults to the first line of the class docstring. ``variants`` names option
        settings (beyond the defaults) that the contract suite also checks, paired with every part
        of every other axis.
        """

        def decorator(cls: T) -> T:
            if name in self._parts:
                raise ValueError(
                    f"{self.axis} part {name!r} is already registered "
                    f"(by {self._parts[name].cls.__qualname__}); pick another name"
                )
            doc = (cls.__doc__ or "").strip().splitlines()
            self._parts[name] = Part(
                axis=self.axis,
                name=name,
                cls=cls,
                summary=summary or (doc[0] if doc else ""),
                formula=formula,
                reference=reference,
                defaults=dict(defaults),
                variants={key: dict(value) for key, value in (variants or {}).items()},
            )
            return cls

        return decorator

    def unregister(self, name: str) -> None:
        """Remove ``name`` (for tests and notebooks that register throwaway parts)."""
        self.get(name)
        del self._parts[name]

    def get(self, name: str) -> Part:
        """The part called ``name``; an unknown name raises a ConfigError listing every choice."""
        if name not in self._parts:
            close = difflib.get_close_matches(str(name), self._parts, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(self.where, name, f"unknown {self.axis}; {hint}registered: {', '.join(self.names())}")
        return self._parts[name]

    def names(self) -> list[str]:
        return list(self._parts)

    def parts(self) -> list[Part]:
        return list(self._parts.values())

    def __contains__(self, name: object) -> bool:
        return name in self._parts

    def __len__(self) -> int:
        return len(self._parts)


PLACEMENTS = Registry("placement")
NORMS = Registry("norm")
ATTENTIONS = Registry("attn")
POSITIONS = Registry("pos")
MLPS = Registry("mlp")

#: Every axis of a block, in the order configs and test ids name them.
AXES: dict[str, Registry] = {
    "placement": PLACEMENTS,
    "norm": NORMS,
    "attn": ATTENTIONS,
    "pos": POSITIONS,
    "mlp": MLPS,
}
