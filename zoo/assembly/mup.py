"""The maximal update parametrization (μP, Yang et al. 2022, Tensor Programs V) for any model of parts.

Which dimensions of each parameter grow with width is found, not declared: the model is built on the
meta device at the base width and at another, and each parameter's shapes are compared (as the
``mup`` package's ``infshapes``), so a part is covered the day it is registered. Width is
``block.d_model``; every size a part derives from it grows with it (``d_ff: null``'s 4 x d_model,
the head size d_model / n_heads with ``n_heads`` as configured, MLA's default ``kv_rank`` of 4 d_head),
and every size set in the config stays fixed (an explicit ``d_ff``, ``n_kv_heads``, ``head_dim``, ``kv_rank``,
``q_rank``, ``n_experts``). Each parameter gets a :data:`Role`:

- ``vector``: one dimension, which grows (biases, norm gains);
- ``hidden``: both of its matrix dimensions grow (q/k/v, out, MLP up/down, experts);
- ``input``: only its fan-out grows (the token embedding and position tables, an up-projection from
  a fixed rank such as MLA's ``kv_up`` at a set ``kv_rank``);
- ``output``: only its fan-in grows, inside the model (a router, a down-projection to a fixed rank);
- ``readout``: the untied LM head (output-like, scaled by the logit multiplier instead);
- ``fixed``: nothing grows (scalar gains, tables of fixed size).

The rules (Tensor Programs V, Table 3 for the block's matrices, the ``mup`` package's readout
multiplier for the LM head), with ``m`` the growth of the dimension named (width / base width):

========  =======================  ===============  ==============
role      init std                 AdamW rate       SGD rate
========  =======================  ===============  ==============
hidden    x 1 / sqrt(m fan-in)     x 1 / m fan-in   x 1
output    x 1 / m fan-in           x 1 / m fan-in   x 1 / m fan-in
input     x 1                      x 1              x m fan-out
vector    x 1 (zeros, ones)        x 1              x m
readout   x 1                      x 1              x m fan-in
fixed     x 1                      x 1              x 1
========  =======================  ===============  ==============

plus logits x (base width / width) and softmax attention scores x sqrt(D_base) / D instead of
1 / sqrt(D) (D: a head's score features: d_head, MLA's 2 d_head), which equal the standard ones at
the base width. Weight decay is multiplied by the inverse of the rate multiplier, so the decay per
step (rate x decay) does not change with width (the ``mup`` package's default). At the base width
every multiplier is 1 and the model is the standard one, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from zoo.parts.gated_deltanet import GatedDeltaNet
from zoo.parts.linear_attention import LinearAttention
from zoo.parts.positions import LearnedEmbedding

Role = Literal["vector", "hidden", "input", "output", "readout", "fixed"]
ROLES: tuple[Role, ...] = ("vector", "hidden", "input", "output", "readout", "fixed")

#: Optimizers with μP rate rules: {optimizer: {role: "fan_in" | "fan_out" | "1/fan_in" | "1"}}.
LR_RULES: dict[str, dict[Role, str]] = {
    "adamw": {"hidden": "1/fan_in", "output": "1/fan_in", "input": "1", "vector": "1", "readout": "1", "fixed": "1"},
    "sgd": {"hidden": "1", "output": "1/fan_in", "input": "fan_out", "vector": "fan_out", "readout": "fan_in",
            "fixed": "1"},
}  # fmt: skip

#: Attentions without a softmax over scaled scores (nothing to rescale): linear attention's and Gated
#: DeltaNet's (KDA's, its subclass, with them) outputs are RMS-normalized per head and linear in q, so a multiplier
#: on q cancels.
NO_SCORES: tuple[type[nn.Module], ...] = (LinearAttention, GatedDeltaNet)


@dataclass(frozen=True)
class Scaling:
    """How one parameter grows: its role and the growth of its fan-in and fan-out (1 when fixed)."""

    role: Role
    fan_in: float = 1.0
    fan_out: float = 1.0

    def init_factor(self) -> float:
        """What the standard init's std is multiplied by."""
        if self.role == "hidden":
            return 1 / math.sqrt(self.fan_in)
        return 1 / self.fan_in if self.role == "output" else 1.0

    def lr_factor(self, optimizer: str) -> float:
        """The rate multiplier under ``optimizer`` (a name in :data:`LR_RULES`)."""
        rule = LR_RULES[optimizer][self.role]
        return {"1": 1.0, "fan_in": self.fan_in, "fan_out": self.fan_out, "1/fan_in": 1 / self.fan_in}[rule]


@dataclass(frozen=True)
class MuP:
    """A model's μP at ``width`` (base ``base_width``): every parameter's scaling, and the attention
    modules' score scales (module name -> scale; None: the standard 1 / sqrt(D))."""

    width: int
    base_width: int
    scalings: dict[str, Scaling]
    score_scales: dict[str, float | None]

    @property
    def logit_scale(self) -> float | None:
        return None if self.width == self.base_width else self.base_width / self.width


def owner(model: nn.Module, name: str) -> nn.Module:
    return model.get_submodule(name.rpartition(".")[0])


def role_of(base: torch.Size, grown: torch.Size, *, table: bool, readout: bool) -> Role:
    """A parameter's role from its shapes at two widths. ``table``: a lookup table (an embedding:
    rows are the fan-in, columns the fan-out); else a torch matrix (out, in). ``readout``: the LM head."""
    grows = [a != b for a, b in zip(base, grown, strict=True)]
    if not any(grows):
        return "fixed"
    if len(grows) == 1 or (len(grows) > 2 and not any(grows[-2:])):  # a gain, or one set-size filter per channel
        return "vector"
    fan_out, fan_in = (grows[-1], grows[-2]) if table else (grows[-2], grows[-1])
    if fan_in and fan_out:
        return "hidden"
    if fan_out:
        return "input"
    return "readout" if readout else "output"


def growth(model: nn.Module, base: nn.Module, name: str, role: Role) -> tuple[float, float]:
    """(fan-in growth, fan-out growth) of parameter ``name`` from ``base`` to ``model``."""
    now, then = dict(model.named_parameters())[name].shape, dict(base.named_parameters())[name].shape
    if len(now) < 2:
        return 1.0, now[0] / then[0] if now else 1.0
    if role == "vector":  # a bank of set-size filters (a depthwise convolution's kernel): its channels grow
        return 1.0, now.numel() / then.numel()
    table = is_table(model, name)
    in_dim, out_dim = (-2, -1) if table else (-1, -2)
    return now[in_dim] / then[in_dim], now[out_dim] / then[out_dim]


def is_table(model: nn.Module, name: str) -> bool:
    return isinstance(owner(model, name), (nn.Embedding, LearnedEmbedding))


def infer(build: Callable[[int], nn.Module], width: int, base_width: int) -> MuP:
    """Every parameter's :class:`Scaling` and every attention's score scale at ``width``, from models
    ``build(w)`` built on the meta device at ``base_width``, at ``width`` and (to tell what grows when
    ``width`` is the base) at twice the base. Raises ValueError for a model whose parameters differ by
    name between widths, or a softmax attention that exposes no ``score_scale``."""
    with torch.device("meta"):
        base, model = build(base_width), build(width)
        grown = model if width != base_width else build(2 * base_width)
    names = [n for n, _ in base.named_parameters()]
    for other in (model, grown):
        if [n for n, _ in other.named_parameters()] != names:
            raise ValueError("the model's parameters differ by name between widths: μP cannot pair them")
    base_shapes, grown_shapes = dict(base.named_parameters()), dict(grown.named_parameters())
    head = {"head.weight"} if getattr(model, "head", None) is not None else set()
    scalings = {}
    for name in names:
        role = role_of(
            base_shapes[name].shape, grown_shapes[name].shape, table=is_table(model, name), readout=name in head
        )
        fan_in, fan_out = growth(model, base, name, role)
        scalings[name] = Scaling(role, fan_in, fan_out)
    return MuP(width, base_width, scalings, score_scales(model, base))


def score_scales(model: nn.Module, base: nn.Module) -> dict[str, float | None]:
    """sqrt(D_base) / D for each softmax attention module whose head size grew (None where it did not)."""
    scales: dict[str, float | None] = {}
    bases = dict(base.named_modules())
    for name, module in model.named_modules():
        if not hasattr(module, "d_head") or isinstance(module, NO_SCORES) or not name:
            continue
        if not hasattr(module, "score_scale") or not hasattr(module, "score_features"):
            raise ValueError(
                f"{name} ({type(module).__name__}) has heads but no score_scale and score_features attributes for μP"
            )
        features, then = score_features(module), score_features(bases[name])
        scales[name] = None if features == then else math.sqrt(then) / features
    return scales


def score_features(module: nn.Module) -> int:
    """The features one query head scores with (the part's ``score_features``: d_head, MLA's 2 d_head)."""
    return module.score_features


def apply(model: nn.Module, mup: MuP) -> None:
    """Rescale ``model``'s initialized weights, set its logit multiplier and its attentions' score
    scales, and record ``mup`` on it (``model.mup``: the optimizer reads the rate multipliers there).
    Multiplies only where a factor is not 1: at the base width the model is left bit for bit."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            factor = mup.scalings[name].init_factor()
            if factor != 1.0:
                p.mul_(factor)
    model.logit_scale = mup.logit_scale
    for name, scale in mup.score_scales.items():
        model.get_submodule(name).score_scale = scale
    model.mup = mup


def lr_ratios(model: nn.Module, optimizer: str) -> dict[int, float] | None:
    """{id(parameter): μP rate multiplier} for a model :func:`apply` was applied to (None for any other)."""
    mup: MuP | None = getattr(model, "mup", None)
    if mup is None:
        return None
    return {id(p): mup.scalings[name].lr_factor(optimizer) for name, p in model.named_parameters()}
