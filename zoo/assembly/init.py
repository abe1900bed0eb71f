"""Controlled initialization: a parameter's initial value depends only on (seed, its name, its shape).

So two variants built with the same seed start with identical weights for every parameter they
share (same name, same shape), and an ablation changes only the part under study: adding a
``q_norm`` or widening the MLP does not shift the random draws of any other parameter.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from zoo.core.errors import ConfigError


def parameter_seed(seed: int, name: str, shape: torch.Size | tuple[int, ...]) -> int:
    """A 63-bit seed from (seed, name, shape), stable across processes and Python versions."""
    key = f"{seed}/{name}/{tuple(shape)}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def seeded_parameters(module: nn.Module, seed: int | None = None) -> Iterator[tuple[str, nn.Parameter]]:
    """``module.named_parameters()``, with torch's global generator reseeded from (seed, name, shape)
    before each parameter is handed out, so any ``nn.init`` call in the loop body draws the same
    values for the same parameter in every model. The generator's state is restored afterwards.

    ``seed`` defaults to ``torch.initial_seed()``: the seed of the last ``torch.manual_seed``.
    """
    seed = torch.initial_seed() if seed is None else seed
    cuda = sorted({p.device.index or 0 for p in module.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=cuda):
        for name, p in module.named_parameters():
            value = parameter_seed(seed, name, p.shape)
            if p.device.type == "cuda":
                with torch.cuda.device(p.device):
                    torch.cuda.manual_seed(value)
            else:
                torch.random.default_generator.manual_seed(value)
            yield name, p


# -- init=<scheme>: the weights' initial stds ------------------------------------------------------------------

#: ``init=<name>``: each scheme's options and their defaults (conf/init/<name>.yaml; docs/recipe.md#initialization).
INIT_SCHEMES: dict[str, dict[str, float]] = {
    "gpt2": {"std": 0.02},
    "olmo": {"embedding_std": 1.0},
    "zero_out": {"std": 0.02},
    "mitchell": {},
}
#: What the model's build draws (init_stack), left as it is: no redraw.
BUILT = {"name": "gpt2", "std": 0.02}
#: Projections whose output joins the residual stream (zoo.models.base.RESIDUAL_OUTPUTS).
OUTPUTS = ("attn.out.weight", "mlp.down.weight")
EMBEDDINGS = re.compile(r"(^|\.)(embed|pos_embed|value_embeds\.\d+)\.weight$")
LAYER = re.compile(r"(^|\.)blocks\.(\d+)\.")


def init_options(raw: Any) -> dict[str, Any]:
    """The ``init`` section (a name, or a mapping with ``name``) with its scheme's defaults; a ConfigError naming
    the key for an unknown scheme, an option the scheme does not read, or a std that is not a number > 0."""
    raw = {"name": raw} if isinstance(raw, str) else dict(raw or {"name": "gpt2"})
    name = raw.pop("name", "gpt2")
    if name not in INIT_SCHEMES:
        raise ConfigError("init.name", name, f"one of {', '.join(INIT_SCHEMES)}")
    options = dict(INIT_SCHEMES[name])
    for key, value in raw.items():
        if key not in options:
            reads = ", ".join(options) or "no option"
            raise ConfigError(f"init.{key}", value, f"init={name} reads {reads}")
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(f"init.{key}", value, "must be a number > 0")
        options[key] = float(value)
    return {"name": name, **options}


def scheme_std(options: Mapping[str, Any], name: str, shape: torch.Size, d_model: int) -> float:
    """The std ``options``' scheme draws the matrix or embedding ``name`` (of ``shape``) with.

    - ``gpt2``: ``std``; a residual-output projection ``std / sqrt(2 n_layers)`` (the build's draw, not redrawn
      at the defaults; with another ``std``, :func:`initialize` is given the branch count);
    - ``olmo`` (OLMo's "dirk"): embeddings ``embedding_std``, every matrix ``1 / sqrt(d_model)``;
    - ``zero_out``: GPT-2's, with the residual-output projections zero;
    - ``mitchell``: every matrix ``1 / sqrt(fan_in)``, a residual-output projection of layer ``i`` (0-based)
      ``1 / sqrt(2 fan_in (i + 1))``; embeddings GPT-2's 0.02.
    """
    scheme, embedding, output = options["name"], bool(EMBEDDINGS.search(name)), name.endswith(OUTPUTS)
    if scheme == "olmo":
        return options["embedding_std"] if embedding else d_model**-0.5
    if scheme == "mitchell":
        if embedding:
            return 0.02
        layer = LAYER.search(name)
        depth = 2 * (int(layer.group(2)) + 1) if output and layer else 1
        return (shape[-1] * depth) ** -0.5
    return 0.0 if scheme == "zero_out" and output else options["std"]


def initialize(
    model: nn.Module, options: Mapping[str, Any], d_model: int, branches: int, seed: int | None = None
) -> nn.Module:
    """``model`` (as built: GPT-2's draw) redrawn under ``init`` ``options``: every matrix and embedding that
    the build drew, from the same (seed, name, shape) stream, at :func:`scheme_std`'s std (a residual-output
    projection of ``gpt2``/``zero_out`` at ``std / sqrt(branches)``). Biases, gains, canon kernels, a residual
    part's parameters and a module's that sets ``keeps_init`` (the n-gram table's zeros) keep the build's values.
    Left as it is under the defaults (``gpt2``, 0.02)."""
    if dict(options) == BUILT:
        return model
    from zoo.parts.canon import Canon
    from zoo.parts.residuals import Residual

    kept = {n for n, m in model.named_modules() if isinstance(m, Canon | Residual) or getattr(m, "keeps_init", False)}
    with torch.no_grad():
        for name, p in seeded_parameters(model, seed):
            if p.ndim < 2 or name.endswith("bias") or name.rpartition(".")[0] in kept:
                continue
            std = scheme_std(options, name, p.shape, d_model)
            if options["name"] in ("gpt2", "zero_out") and name.endswith(OUTPUTS):
                std /= math.sqrt(branches)
            nn.init.normal_(p, std=std) if std > 0 else nn.init.zeros_(p)
    return model
