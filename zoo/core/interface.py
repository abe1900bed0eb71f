"""The part interface: every hook a part may define, per axis, with its signature, its meaning and
its default, written once.

A part is a class registered on an axis (zoo.core.registry). Beyond its constructor and ``forward``,
zoo reads optional *hooks* from it: class attributes and class methods read before anything is
built (``needs``, ``check``, ...), and methods or attributes of the built module read afterwards
(``tp_plan``, ``state_size``, ...). Each axis's protocol below names them: :class:`PartHooks` (any
axis), :class:`PlacementHooks`, :class:`NormHooks`, :class:`AttentionHooks`, :class:`PositionHooks`,
:class:`MLPHooks` and :class:`ResidualHooks`. The value given in a protocol's body is the hook's
default, what a part that does not define it gets.

Code that reads a hook does it through :func:`hook` (``hook(cls, "needs")``), which returns the
part's own or else that default; :func:`hook_errors` checks a part's hooks against the protocol
(a test runs it over every registered part).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from zoo.core.channel import ChannelUse
from zoo.core.dims import BlockDims
from zoo.core.options import option_defaults
from zoo.core.registry import AXES
from zoo.core.tp import Plan


class PartHooks(Protocol):
    """Hooks any part may define, on any axis."""

    #: What the part needs from its surroundings, each with the reason: ``{"embedding": "why"}``.
    #: A lone ``block`` provides nothing, a ``model`` provides ``embedding`` (zoo.assembly.compat).
    needs: ClassVar[Mapping[str, str]] = {}
    #: What the part provides to the other parts of its block (a position: ``rotation``, ``score bias``).
    provides: ClassVar[frozenset[str]] = frozenset()
    #: What no other part of its block may provide, each with the reason: ``{"score bias": "why"}``.
    conflicts: ClassVar[Mapping[str, str]] = {}
    #: Auxiliary losses the part may record (zoo.core.auxiliary.record_aux), with their default weights.
    aux_losses: ClassVar[Mapping[str, float]] = {}
    #: The canon sites (``block.canon``, zoo.parts.canon) the part applies inside itself, building its layer
    #: from ``dims.canon_sites``: ``b`` for an attention (on its queries, keys and values), ``d`` for an MLP
    #: (on its hidden units). A block refuses those sites with a part that does not apply them.
    canon_sites: ClassVar[frozenset[str]] = frozenset()
    #: Contract properties that cannot hold for the part, each with the reason (or a classmethod
    #: ``contract_exceptions(cls, **options)`` returning that mapping; zoo.testing.contract).
    contract_exceptions: ClassVar[Mapping[str, Any]] = {}

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        """Reject the part's own bad options and sizes with a ConfigError naming the field, before
        anything is built. Receives every option, defaults filled in."""

    @classmethod
    def check_tp(cls, dims: BlockDims, tp: int, **options: Any) -> None:
        """Under ``parallel.tp`` > 1: reject sizes that do not split between ``tp`` ranks (a ConfigError
        naming ``parallel.tp``). Only read when the part has a ``tp_plan``."""

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        """The built part's tensor-parallel plan: sub-module names -> DTensor styles (zoo.core.tp). No
        default: a part without one of its own (zoo.core.tp.has_plan) is refused under tp > 1."""
        raise NotImplementedError

    def active_parameters(self) -> int | None:
        """Parameters one token uses, when fewer than all (a mixture of experts); None (the default):
        every parameter (zoo.assembly.match.active_count)."""
        return None

    def extra_flops(self, seq_len: int) -> int:
        """Training FLOPs (forward + backward) per token at context ``seq_len`` that the built part spends
        beyond what the model counts for it (6 x the parameters one token uses, and softmax attention's
        6 x seq_len x d_model of scores and weighted values): elementwise products, gates, sinks.
        0 (the default): none (zoo.models.base.TokenModel.training_flops)."""
        return 0

    def after_step(self) -> None:
        """Update the built part's state outside the gradient after each optimizer step (a router's
        balancing bias from the step's load: zoo.parts.moe). The training step calls it on every module
        that defines it (zoo.core.auxiliary.after_step_hooks); nothing by default."""
        return None

    def matrix_blocks(self) -> Mapping[str, Mapping[str, torch.Tensor]] | None:
        """How the built part's fused weights split into logical matrices, for an optimizer that treats
        each matrix whole (Muon): parameter name relative to the part (``"qkv.weight"``) -> {block name:
        the indices of its rows (dim -2), over every column}; the blocks tile the rows exactly once. A
        3-D parameter (an expert bank) splits each leading index alike. Every other 2-D parameter of
        the part is one logical matrix. None (the default): the part declares nothing, and such an
        optimizer gives all its parameters the conservative treatment (AdamW)."""
        return None


class PlacementHooks(PartHooks, Protocol):
    """A placement: built as ``cls(dims, make_norm, n_branches, **options)``; ``forward(x, branches)``."""

    #: Whether a model stacking this placement puts a norm after its last block (no default: every
    #: placement says; :class:`zoo.parts.placements.Placement` requires it).
    final_norm: ClassVar[bool]
    #: False for a norm-free placement (with ``final_norm`` False and no norms): a run records no norm.
    uses_norm: ClassVar[bool] = True

    @classmethod
    def norm_count(cls, n_branches: int) -> int:
        """How many ``norms`` the placement owns for ``n_branches`` branches (one per branch)."""
        return n_branches

    @classmethod
    def update_count(cls, n_branches: int) -> int:
        """How many additions to the stream :meth:`updates` makes for ``n_branches`` branches (one per branch)."""
        return n_branches

    def updates(self, branches: Any) -> Any:
        """The placement as additions to the residual stream: functions ``u_i(x)``, each applied in turn as
        ``x = x + u_i(x)`` (pre: ``drop(f_i(norm_i(x)))``), so that a ``block.residual`` other than ``add``
        can own the addition (zoo.parts.residuals). No default: a placement that is not a sum of such terms
        (post: the norm of the sum) is refused with those residuals by name (zoo.assembly.compat)."""
        raise NotImplementedError


class ResidualHooks(PartHooks, Protocol):
    """A residual (how the branches join the stream): built as ``cls(dims, n_updates, layer, **options)``,
    ``n_updates`` the placement's :meth:`PlacementHooks.update_count`, ``layer`` the block's index in its stack;
    ``forward(x, x0, placement, branches)`` (zoo.parts.residuals.Residual)."""

    #: Whether the block's forward needs ``x0``, the stack's embedding output (the stack passes it then).
    uses_x0: ClassVar[bool] = False
    #: Whether it needs the placement's :meth:`PlacementHooks.updates` (it owns the addition itself).
    owns_add: ClassVar[bool] = False

    @classmethod
    def stream_count(cls, **options: Any) -> int:
        """How many residual streams a block of this residual keeps (1: the stream is (b, t, d_model); n: the
        stack's stream is (b, t, n, d_model), expanded from the embedding and summed before the final norm)."""
        return 1


class NormHooks(PartHooks, Protocol):
    """A norm: built as ``cls(dims, **options)`` over ``dims.d_model`` features (zoo.parts.norms.build_norm)."""


class AttentionHooks(PartHooks, Protocol):
    """An attention (sequence mixer): built as ``cls(dims, position, **options)``, or with the block
    norm's options as a third argument when ``shares_block_norm``;
    ``forward(x, *, key_mask, cache, positions)``."""

    #: True: built as ``cls(dims, position, norm_options, **options)``, ``norm_options`` the block norm's
    #: options, which the norms it builds over its own widths share (Attention's qk-norm takes its eps).
    shares_block_norm: ClassVar[bool] = False
    #: Whether the built attention masks later tokens (False in encoder blocks); read on the module.
    causal: bool = True
    #: Features of the values a value embedding adds to (``n_kv_heads * d_head``), read on the built module;
    #: None (the default): the mixer takes no value embedding, and ``model.value_embeddings`` is refused by name.
    value_width: int | None = None
    #: How the mixer keeps documents packed in one sequence apart (``task.doc_mask``), one sentence for the
    #: catalogue (docs/parts.md); a mixer that states one gets ``documents=`` (zoo.parts.documents.Documents: every
    #: token's document, keys included) in its forward, and the model contract checks that a packed batch equals its
    #: documents run one by one. None (the default): it cannot, and a model given document ids refuses it by name.
    doc_reset: ClassVar[str | None] = None

    @classmethod
    def cross_attention(cls, dims: BlockDims, **options: Any) -> Callable[[], nn.Module] | None:
        """How a decoder block with this self-attention builds its cross-attention to encoder memory:
        a function making the module (no tensor work until called), from the self-attention's options.
        None (the default): it has none, and ``block.cross_attention=true`` is refused by name."""
        return None

    def state_size(self, length: int) -> int:
        """Numbers one sample's decoding state holds after ``length`` tokens (the model contract checks
        the state's bytes against it)."""
        raise NotImplementedError

    def join_channel(self, layer: int, provided: frozenset[str]) -> ChannelUse:
        """Called once by the stack the built mixer sits in, before initialization: its layer index and the
        side-channel entries the stack and the layers before it provide (zoo.core.channel). Returns what it
        reads and writes; a mixer that uses the channel gets ``channel=`` in its forward, and may add the
        parameters it needs here (value residual's weights on every layer after the first). The default:
        it uses nothing, and its forward gets no channel. A mixer alone (outside a stack) is never told."""
        return ChannelUse()

    def mixing_flops(self, seq_len: int) -> int | None:
        """Training FLOPs (forward + backward) per token of the mixing itself at context ``seq_len``: the
        products between tokens, beyond the matmuls of its parameters (the model counts those as 6 x
        parameters). None (the default): softmax attention's 6 x seq_len x d_model
        (zoo.models.base.TokenModel.training_flops)."""
        return None

    def attention_logits(self, x: torch.Tensor) -> torch.Tensor | None:
        """The pre-softmax attention scores of ``x`` (b, t, d_model) read as one sequence from position 0
        (no cache, no padding), computed on the math path: (b, h, t, t), q k^T times the score scale the
        forward hands its kernel, after qk-norm and positions (with the position's score bias), blocked
        keys -inf (zoo.parts.logits.masked_logits; zoo.lab.training.probes reads them). None (the default): the
        mixer has no softmax logits, and probes skip it by name."""
        return None

    def clip_qk(self, gamma: torch.Tensor) -> None:
        """QK-clip (``optim.qk_clip``, zoo.lab.recipe.qk_clip): rescale the query and key weights in place so that
        every q . k product of head h is multiplied by ``gamma[h]`` ((h,), in (0, 1]). Not defined (the default):
        the mixer has no softmax logits to clip, and ``optim.qk_clip`` is refused by name."""
        raise NotImplementedError


class PositionHooks(PartHooks, Protocol):
    """A position scheme: built as ``cls(dims, **options)``, called by the attention."""

    #: Features per head the scheme rotates, read on the module (None: it rotates none, or all).
    rotated: int | None = None

    def rotate(self, q: Any, k: Any, positions: Any) -> tuple[Any, Any]:
        """q (b, h, t, d), k (b, g, t, d) at ``positions`` (t,) or (b, t) -> rotated q, k (none: unchanged)."""
        return q, k

    def score_bias(self, q_positions: Any, k_positions: Any) -> Any:
        """An additive bias on the scores, (h, t_q, t_k) or (b, h, t_q, t_k); None (the default): none."""
        return None

    def embedding(self) -> nn.Module | None:
        """The module ``(x, positions) -> x + pe`` a model applies to its token embeddings, or None.
        The module's ``token_init_std`` (:class:`EmbeddingHooks`) gives the token embedding's init std."""
        return None


class EmbeddingHooks(Protocol):
    """The module a position's ``embedding()`` returns."""

    #: The std a model draws its token embedding with when the module scales it (None: the model's own).
    token_init_std: float | None = None


class MLPHooks(PartHooks, Protocol):
    """An MLP: built as ``cls(dims, **options)`` with hidden width ``dims.d_ff`` (or its default)."""

    #: The built MLP's hidden width, read on the module (zoo.param_report's ``d_ff``).
    hidden: int | None = None


#: Each axis's protocol.
PROTOCOLS: dict[str, type] = {
    "placement": PlacementHooks,
    "norm": NormHooks,
    "attn": AttentionHooks,
    "pos": PositionHooks,
    "mlp": MLPHooks,
    "residual": ResidualHooks,
}
_ALL = (*PROTOCOLS.values(), EmbeddingHooks)
_MISSING = object()


def _members(protocol: type) -> dict[str, Any]:
    """A protocol's hooks: name -> its declaration (a function, a classmethod or an annotation)."""
    found: dict[str, Any] = {}
    for klass in reversed(protocol.__mro__):
        if klass in (object, Protocol) or not getattr(klass, "_is_protocol", False):
            continue
        found.update(klass.__dict__.get("__annotations__", {}))
        found.update({n: v for n, v in vars(klass).items() if isinstance(v, classmethod) or inspect.isfunction(v)})
    return {name: value for name, value in found.items() if not name.startswith("_")}


#: Every hook's default, once: the value (or method) the protocols give it.
DEFAULTS: dict[str, Any] = {
    name: vars(klass)[name]
    for protocol in _ALL
    for klass in protocol.__mro__
    for name in _members(protocol)
    if name in vars(klass)
}
#: Every hook a part may define.
HOOKS: frozenset[str] = frozenset(name for protocol in _ALL for name in _members(protocol))


def hook(obj: Any, name: str) -> Any:
    """The hook ``name`` of a part class or a built module: its own, else the protocol's default.

    Class methods come bound (``hook(cls, "check")(dims, **options)``); a default method is bound to
    ``obj`` too. An unknown hook name is a programming error (KeyError), not a silent default.
    """
    if name not in HOOKS:
        raise KeyError(f"{name!r} is not a part hook; hooks: {', '.join(sorted(HOOKS))}")
    value = getattr(obj, name, _MISSING)
    if value is not _MISSING:
        return value
    default = DEFAULTS.get(name, _MISSING)
    if default is _MISSING:
        raise AttributeError(f"{obj!r} defines no {name!r}, and the part interface gives it no default")
    if isinstance(default, classmethod):
        return default.__get__(None, obj if isinstance(obj, type) else type(obj))
    if inspect.isfunction(default):
        return default.__get__(obj)
    return default


def defines(obj: Any, name: str) -> bool:
    """Whether a part class (or module) defines the hook ``name`` itself, rather than taking its default."""
    if name not in HOOKS:
        raise KeyError(f"{name!r} is not a part hook; hooks: {', '.join(sorted(HOOKS))}")
    return inspect.getattr_static(obj, name, _MISSING) is not _MISSING


def every_part_error() -> list[str]:
    """:func:`hook_errors` over every registered part of every axis (zoo's and the plugins')."""
    return [
        error
        for axis, registry in AXES.items()
        for part in registry.parts()
        for error in hook_errors(axis, part.cls, option_defaults(part), part.name)
    ]


def hook_errors(axis: str, cls: type, options: Mapping[str, Any], name: str = "") -> list[str]:
    """Each hook ``cls`` defines that does not match ``axis``'s protocol, as ``<axis> <name>: hook
    <hook>: <why>``: a method that cannot be called as the protocol calls it (with the part's
    ``options`` as keywords where the protocol passes ``**options``), a class attribute of another type."""
    label = f"{axis} {name or cls.__name__}"
    errors = []
    for hook_name, declared in _members(PROTOCOLS[axis]).items():
        if hook_name not in _defined(cls, axis):
            continue
        why = _mismatch(cls, hook_name, declared, options)
        if why:
            errors.append(f"{label}: hook {hook_name}: {why}")
    return errors


def _defined(cls: type, axis: str) -> set[str]:
    """The hooks of ``axis`` that ``cls`` defines (itself or by inheritance), rather than taking their default."""
    return {name for name in _members(PROTOCOLS[axis]) if inspect.getattr_static(cls, name, _MISSING) is not _MISSING}


def _mismatch(cls: type, name: str, declared: Any, options: Mapping[str, Any]) -> str | None:
    value = inspect.getattr_static(cls, name)
    if name == "contract_exceptions" and isinstance(value, classmethod):
        declared = _exceptions_for  # the other form of this hook: a classmethod of the options
    if not (isinstance(declared, classmethod) or inspect.isfunction(declared)):
        return _type_mismatch(value, declared)
    wants_class = isinstance(declared, classmethod)
    if wants_class and not isinstance(value, classmethod):
        return f"must be a classmethod {name}{_shown(declared)}"
    if not wants_class and not inspect.isfunction(value):
        return f"must be a method {name}{_shown(declared)}"
    expected = inspect.signature(declared.__func__ if wants_class else declared)
    positional = [p for p in list(expected.parameters.values())[1:] if p.kind is p.POSITIONAL_OR_KEYWORD]
    keywords = dict(options) if any(p.kind is p.VAR_KEYWORD for p in expected.parameters.values()) else {}
    function = value.__func__ if wants_class else value
    try:
        inspect.signature(function).bind(None, *(None for _ in positional), **keywords)
    except TypeError as error:
        return f"{name}{inspect.signature(function)} cannot be called as {name}{_shown(declared)}: {error}"
    return None


@classmethod  # type: ignore[misc]
def _exceptions_for(cls: type, **options: Any) -> Mapping[str, Any]:
    """``contract_exceptions`` as a classmethod: the mapping for the part's options."""
    return {}


def _shown(declared: Any) -> str:
    function = declared.__func__ if isinstance(declared, classmethod) else declared
    return str(inspect.signature(function))


def _type_mismatch(value: Any, annotation: Any) -> str | None:
    """Why a class attribute's value does not fit its annotation (``ClassVar[...]``), or None."""
    if isinstance(value, (classmethod, staticmethod, property)) or inspect.isfunction(value):
        return f"must be a value ({annotation}), not a method"
    expected = {
        "ClassVar[Mapping[str, str]]": (Mapping, str),
        "ClassVar[Mapping[str, float]]": (Mapping, (int, float)),
        "ClassVar[Mapping[str, Any]]": (Mapping, object),
        "ClassVar[frozenset[str]]": ((frozenset, set), None),
        "ClassVar[bool]": (bool, None),
    }.get(str(annotation))
    if expected is None:
        return None
    kind, items = expected
    if not isinstance(value, kind):
        return f"must be {annotation.removeprefix('ClassVar[').removesuffix(']')}, got {type(value).__name__}"
    if isinstance(value, Mapping) and items is not None:
        wrong = [key for key, item in value.items() if not isinstance(key, str) or not isinstance(item, items)]
        if wrong:
            return f"entry {wrong[0]!r} is not {annotation.removeprefix('ClassVar[').removesuffix(']')}"
    return None


__all__ = [
    "DEFAULTS", "HOOKS", "PROTOCOLS", "AttentionHooks", "EmbeddingHooks", "MLPHooks", "NormHooks", "PartHooks",
    "PlacementHooks", "PositionHooks", "ResidualHooks", "defines", "every_part_error", "hook", "hook_errors",
]  # fmt: skip
