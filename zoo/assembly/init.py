"""Controlled initialization: a parameter's initial value depends only on (seed, its name, its shape).

So two variants built with the same seed start with identical weights for every parameter they
share (same name, same shape), and an ablation changes only the part under study: adding a
``q_norm`` or widening the MLP does not shift the random draws of any other parameter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch
from torch import nn


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
