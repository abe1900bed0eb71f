"""Options, declared once: a part's (or task's) options are the keyword-only arguments of its
constructor, with their types and defaults. Configs are checked against those declarations
before anything is built; a part's ``check(dims, **options)`` then receives every option.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, Literal, Union

from zoo.core.errors import ConfigError
from zoo.core.registry import Part, Registry


@cache
def option_types(cls: type) -> dict[str, Any]:
    """A class's options: its constructor's keyword-only parameters and their annotations."""
    hints = type_hints(cls.__init__)
    return {name: hints.get(name, Any) for name in _keyword_only(cls)}


def option_defaults(part: Part) -> dict[str, Any]:
    """Every option of a part with the value it gets when a config leaves it out (its registered
    defaults over its signature's)."""
    signature = _keyword_only(part.cls)
    return {name: part.defaults.get(name, signature[name].default) for name in signature}


def resolve_options(
    part: Part, given: Mapping[str, Any], prefix: str, also_allowed: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Every option of ``part``: its defaults, then ``given`` (type-checked). An unknown key, a wrong
    type or a missing required option raises ConfigError naming ``<prefix>.<key>``.

    ``also_allowed``: keys the caller reads itself, listed among the options in that error.
    """
    types_ = option_types(part.cls)
    options = option_defaults(part)
    for key, value in given.items():
        if key not in types_:
            allowed = ", ".join([*types_, *also_allowed]) or "none"
            raise ConfigError(
                f"{prefix}.{key}", value, f"not an option of {part.axis} {part.name!r}; options: {allowed}"
            )
        options[key] = check_type(f"{prefix}.{key}", value, types_[key])
    for key, value in options.items():
        if value is inspect.Parameter.empty:
            raise ConfigError(f"{prefix}.{key}", None, f"required by {part.axis} {part.name!r}")
    return options


def named_section(registry: Registry, kind: str, section: Any, default: str) -> tuple[Part, dict[str, Any]]:
    """A config section that names an entry of ``registry`` (``optim: {name: sgd, momentum: 0.9}``, or the name
    alone; absent: ``default``): that entry and the section's other keys, not yet checked. A section that is
    no mapping, or names no entry, is a ConfigError naming ``kind``."""
    if isinstance(section, str):
        section = {"name": section}
    if not isinstance(section or {}, Mapping):
        raise ConfigError(kind, section, f"a mapping with a name: one of {', '.join(registry.names())}")
    raw = dict(section or {})
    return registry.get(raw.pop("name", default)), raw


@cache
def _keyword_only(cls: type) -> dict[str, inspect.Parameter]:
    parameters = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}


@cache
def type_hints(obj: Any) -> dict[str, Any]:
    return typing.get_type_hints(obj)


def check_type(field: str, value: Any, annotation: Any) -> Any:
    """``value`` if it fits ``annotation`` (int, float, bool, str, Literal, Optional, tuple[T, ...]);
    else ConfigError naming ``field``.

    Ints are accepted for floats (and converted); bools are not accepted for numbers; a list is
    accepted (as a tuple) for ``tuple[T, ...]``.
    """
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return value
    if origin is Literal:
        choices = typing.get_args(annotation)
        if value not in choices:
            raise ConfigError(field, value, f"must be one of {', '.join(map(repr, choices))}")
        return value
    if origin in (Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is not type(None):
                try:
                    return check_type(field, value, option)
                except ConfigError:
                    pass
        names = ["null" if o is type(None) else getattr(o, "__name__", str(o)) for o in options]
        raise ConfigError(field, value, f"must be {' or '.join(names)}")
    if origin is tuple:
        item = typing.get_args(annotation)[0]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(field, value, f"must be a list of {getattr(item, '__name__', item)}")
        return tuple(check_type(field, v, item) for v in value)
    if annotation is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if annotation is bool and isinstance(value, bool):
        return value
    if annotation in (int, str) and isinstance(value, annotation) and not isinstance(value, bool):
        return value
    raise ConfigError(field, value, f"must be {annotation.__name__}, got {type(value).__name__}")
