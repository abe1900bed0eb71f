"""Name registries: one per axis of the block, the allow-list of what a config may name.

Parts come from zoo itself and from other installed packages: a package lists modules in the
``zoo.parts`` entry-point group, and those modules register parts with the same decorators. They
are imported once, the first time any registry is read (:func:`load_plugins`). A plugin that fails
to import is named in a warning and in every "unknown part" error, and none of its parts stay
registered. A package's option files (Hydra config groups) are found through the ``zoo.conf``
entry-point group (:func:`plugin_config_packages`).

The lab's extension points are registries of the same class: tasks (``zoo.lab.tasks.TASKS``) and
trackers (``zoo.lab.records.trackers.TRACKERS``). Their entries are named, checked and listed as parts are
(``zoo-parts`` shows each registry of ``zoo.lab.commands.catalogue.LISTED``), and a plugin module of the same
``zoo.parts`` group registers into any of them.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import re
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar, TypeVar

from zoo.core.errors import ConfigError

T = TypeVar("T", bound=type)

#: Entry-point group of modules that register parts (``[project.entry-points."zoo.parts"]``).
PARTS_GROUP = "zoo.parts"
#: Entry-point group of packages holding option files, one folder per axis (``norm/dyt.yaml``).
CONF_GROUP = "zoo.conf"
#: The origin of zoo's own parts.
BUILT_IN = "built-in"


class UnknownName(ConfigError):
    """A name that no entry of a registry has: a typo, or a part of a plugin that is not installed here."""


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
    #: (on every part of the axis that takes those options; zoo/testing/combos.py).
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Where it comes from: ``built-in``, the distribution of the plugin that registered it
    #: (``zoo-dyt``), or else the top-level module that did (``__main__``, ``my_parts``).
    origin: str = BUILT_IN
    #: True: the contract's grid pairs it with every choice of every other axis, as it does a variant, rather than
    #: multiplying the product by it: a part that is another's computation with a change (gpt-oss's clamped
    #: SwiGLU is SwiGLU's) meets every other part without costing a product of its own.
    paired: bool = False

    @property
    def where(self) -> str:
        """``module.Class (origin)``: who registered it, for messages."""
        return f"{self.cls.__module__}.{self.cls.__qualname__} ({self.origin})"


@dataclass(frozen=True)
class OptionDoc:
    """An option several parts of an axis take (``block.attn.gate``), for the catalogue: its values, its
    formula, its cost and its reference."""

    option: str
    values: str
    formula: str
    cost: str
    reference: str


class Registry:
    """Maps names to parts for one axis (``norm``, ``attn``, ...).

    >>> NORMS = Registry("norm")
    >>> @NORMS.register("rmsnorm", formula="x / rms(x) * g")
    ... class RMSNorm: ...

    Reading a registry (``get``, ``names``, ``parts``, ``in``, ``len``) first loads the plugins.
    """

    _every: ClassVar[weakref.WeakSet[Registry]] = weakref.WeakSet()  # to undo a failed plugin's parts

    def __init__(
        self, axis: str, where: str | None = None, *, default: str | None = None, paired: bool = False
    ) -> None:
        self.axis = axis
        self.where = where or f"block.{axis}.name"  # the config key that names a part, for errors
        #: The part a block config that leaves the axis out takes (an axis added after runs were recorded);
        #: None: the axis must be named.
        self.default = default
        #: True: the contract's grid pairs this axis' other parts with every choice of every other axis, as
        #: variants are, rather than multiplying the product of the axes (zoo.assembly.combinations).
        self.paired = paired
        self._parts: dict[str, Part] = {}
        #: Options documented once for the parts that take them (:meth:`document`), in the order documented.
        self.option_docs: dict[str, OptionDoc] = {}
        Registry._every.add(self)

    def document(self, option: str, *, values: str, formula: str, cost: str, reference: str) -> None:
        """Describe ``option``, taken by one or several parts of this axis, for the catalogue (docs/parts.md)."""
        self.option_docs[option] = OptionDoc(option, values, formula, cost, reference)

    def register(
        self,
        name: str,
        *,
        summary: str | None = None,
        formula: str = "",
        reference: str = "",
        variants: dict[str, dict[str, Any]] | None = None,
        paired: bool = False,
        **defaults: Any,
    ) -> Callable[[T], T]:
        """Class decorator registering ``cls`` under ``name``; ``defaults`` preset its options.

        ``summary`` defaults to the first sentence of the class docstring. ``variants`` names option
        settings (beyond the defaults) that the contract suite also checks, paired with every part
        of every other axis; ``paired``: the part itself enters the contract's grid that way (:attr:`Part.paired`).
        """

        def decorator(cls: T) -> T:
            if name in self._parts:
                raise ValueError(
                    f"{self.axis} part {name!r} is already registered by {self._parts[name].where}; pick another name"
                )
            self._parts[name] = Part(
                axis=self.axis,
                name=name,
                cls=cls,
                summary=summary or first_sentence(cls.__doc__ or ""),
                formula=formula,
                reference=reference,
                defaults=dict(defaults),
                variants={key: dict(value) for key, value in (variants or {}).items()},
                origin=_origin(cls),
                paired=paired,
            )
            return cls

        return decorator

    def unregister(self, name: str) -> None:
        """Remove ``name`` (for tests and notebooks that register throwaway parts)."""
        self.get(name)
        del self._parts[name]

    def get(self, name: str) -> Part:
        """The part called ``name``; an unknown name raises a ConfigError listing every choice (and
        every plugin that failed to load)."""
        load_plugins()
        if name not in self._parts:
            close = difflib.get_close_matches(str(name), self._parts, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            failed = "".join(f"; {failure}" for failure in FAILED_PLUGINS)
            raise UnknownName(
                self.where, name, f"unknown {self.axis}; {hint}registered: {', '.join(self._parts)}{failed}"
            )
        return self._parts[name]

    def names(self) -> list[str]:
        load_plugins()
        return list(self._parts)

    def parts(self) -> list[Part]:
        load_plugins()
        return list(self._parts.values())

    def __contains__(self, name: object) -> bool:
        load_plugins()
        return name in self._parts

    def __len__(self) -> int:
        load_plugins()
        return len(self._parts)


def first_sentence(doc: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line: up to the first ``.``, ``!`` or
    ``?`` that ends the paragraph or is followed by a capital (so ``e.g. by`` does not end it), with
    reST's double backticks as Markdown's single ones (it is shown in a terminal and in docs/parts.md)."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split()).replace("``", "`")
    match = re.match(r"(.*?[.!?])(?=\s+[A-Z]|$)", paragraph)
    return match.group(1) if match else paragraph


# --- Plugins: parts and option files from other packages ------------------------------------------


class PluginWarning(UserWarning):
    """An installed plugin failed to load; its parts are not registered."""


@dataclass(frozen=True)
class PluginFailure:
    """A ``zoo.parts`` entry point whose module raised on import (or registered a taken name)."""

    package: str
    entry_point: str  # ``name = module``
    error: str

    def __str__(self) -> str:
        return f"plugin {self.package} ({PARTS_GROUP}: {self.entry_point}) failed to load: {self.error}"


#: Every plugin that failed to load, with the reason (filled by :func:`load_plugins`).
FAILED_PLUGINS: list[PluginFailure] = []
_state: dict[str, Any] = {"loaded": False, "loading": None}  # loading: the package being imported


@cache
def plugin_entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
    """The installed entry points of ``group``, each once, ordered by package then name (read once
    per process; ``plugin_entry_points.cache_clear()`` reads them again)."""
    unique = {(ep.name, ep.value): ep for ep in importlib.metadata.entry_points(group=group)}
    return sorted(unique.values(), key=lambda ep: (package_of(ep), ep.name))


def package_of(ep: importlib.metadata.EntryPoint) -> str:
    """The distribution that declares ``ep`` (``zoo-dyt``), or its module's top package."""
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else ep.value.split(":")[0].split(".")[0]


def installed_plugins() -> dict[str, str]:
    """``{distribution: version}`` of every installed package with ``zoo.parts`` entry points (a run records
    them in summary.json's ``versions``), loaded or not."""
    found = {}
    for ep in plugin_entry_points(PARTS_GROUP):
        dist = getattr(ep, "dist", None)
        found[package_of(ep)] = dist.version if dist is not None else "unknown"
    return found


def load_plugins() -> None:
    """Import every module of the ``zoo.parts`` entry-point group, once per process.

    A module that raises (an import error, a name already taken) does not stop the others: its
    parts are unregistered, a :class:`PluginWarning` names it, and it joins :data:`FAILED_PLUGINS`.
    """
    if _state["loaded"]:
        return
    _state["loaded"] = True  # before importing: a plugin reading a registry must not recurse
    for ep in plugin_entry_points(PARTS_GROUP):
        before = {registry: set(registry._parts) for registry in Registry._every}
        _state["loading"] = package_of(ep)
        try:
            ep.load()
        except Exception as error:
            for registry in list(Registry._every):  # its parts go (zoo's own, imported meanwhile, stay)
                for name in set(registry._parts) - before.get(registry, set()):
                    if registry._parts[name].origin != BUILT_IN:
                        del registry._parts[name]
            failure = PluginFailure(package_of(ep), f"{ep.name} = {ep.value}", f"{type(error).__name__}: {error}")
            FAILED_PLUGINS.append(failure)
            warnings.warn(f"{failure}; its parts are not registered", PluginWarning, stacklevel=3)
        finally:
            _state["loading"] = None


def plugin_config_packages() -> list[tuple[str, str]]:
    """(package, module) of each ``zoo.conf`` entry point: a package holding option files, laid out
    as zoo's ``conf/`` (``norm/dyt.yaml``), for Hydra's search path as ``pkg://<module>``."""
    return [(package_of(ep), ep.value) for ep in plugin_entry_points(CONF_GROUP)]


def _origin(cls: type) -> str:
    """``built-in`` for zoo's parts, the plugin's package while one loads, else the top module."""
    module = cls.__module__
    if module == "zoo" or module.startswith("zoo."):
        return BUILT_IN
    if _state["loading"] is not None:
        return str(_state["loading"])
    return module.split(".")[0]


PLACEMENTS = Registry("placement")
NORMS = Registry("norm")
ATTENTIONS = Registry("attn")
POSITIONS = Registry("pos")
MLPS = Registry("mlp")
#: How each branch joins the residual stream; ``add`` when a config names none (configs from before the axis).
RESIDUALS = Registry("residual", default="add", paired=True)

#: Every axis of a block, in the order configs and test ids name them.
AXES: dict[str, Registry] = {
    "placement": PLACEMENTS,
    "norm": NORMS,
    "attn": ATTENTIONS,
    "pos": POSITIONS,
    "mlp": MLPS,
    "residual": RESIDUALS,
}
