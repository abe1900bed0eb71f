"""``optim.qk_clip=tau``: QK-clip (Kimi K2's MuonClip), over any optimizer (docs/muon.md, "QK-clip").

Each training step measures every head's largest pre-softmax logit on the step's batch, with the weights
the forward used (each mixer's ``attention_logits`` hook on the input its training forward saw, the
score probes read; the largest over ranks under DDP). After the optimizer step, every head whose largest
logit exceeded tau gets gamma = tau / max_logit (1 otherwise), and its mixer's ``clip_qk`` hook rescales
its query and key weights so that its q . k products are multiplied by gamma: sqrt(gamma) to each under
MHA; under GQA the shared key by sqrt(gamma_min) over the heads sharing it and each query by gamma_h /
sqrt(gamma_min); under MLA the content query and key by sqrt(gamma), the rotary query by gamma, the shared
rotary key left as it is. It is checked before any tensor work: every block's mixer has softmax logits,
no qk-norm (whose normalized scores the weights' scale cannot move), no FSDP2 or tensor parallelism
(each head's rows whole on a rank) and no ``compile`` (the forward's inputs are read through hooks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from einops import reduce
from torch import nn

from zoo.assembly.block import Block
from zoo.core.errors import ConfigError
from zoo.core.interface import defines, hook

KEY = "optim.qk_clip"


def check_tau(tau: Any) -> float | None:
    """``optim.qk_clip``: null (off) or a number > 0 (the largest logit a head keeps)."""
    if tau is None:
        return None
    if isinstance(tau, bool) or not isinstance(tau, int | float) or not tau > 0:
        raise ConfigError(KEY, tau, "null (off) or a number > 0: the largest pre-softmax logit a head keeps")
    return float(tau)


def check_run(tau: float | None, *, sharded: bool, compile: bool) -> None:
    """The run's mesh and ``compile`` against QK-clip (a ConfigError naming the key)."""
    if tau is not None and sharded:
        raise ConfigError(KEY, tau, "null under FSDP2 or tensor parallelism (it rescales each head's whole rows)")
    if tau is not None and compile:
        raise ConfigError(KEY, tau, "null with compile=true (it reads each mixer's training input through a hook)")


def mixers(model: nn.Module, tau: float) -> list[nn.Module]:
    """Every block's mixer, each checked to have softmax logits to clip and no qk-norm (a ConfigError)."""
    found = []
    for i, block in enumerate(m for m in model.modules() if isinstance(m, Block)):
        attn = block.attn
        if not defines(attn, "clip_qk"):
            raise ConfigError(KEY, tau, f"needs softmax attention in every block: block {i}'s mixer "
                              f"{type(attn).__name__} has no softmax logits to clip")  # fmt: skip
        if getattr(attn, "q_norm", None) is not None and hasattr(attn, "k_norm"):
            raise ConfigError(KEY, tau, f"null with block.attn.qk_norm (block {i}): normalized queries and keys "
                              "bound the logits already, and rescaling the weights would not move them")  # fmt: skip
        found.append(attn)
    if not found:
        raise ConfigError(KEY, tau, "needs a model of blocks with softmax attention")
    return found


def check_on_meta(build: Callable[[], nn.Module], tau: float | None) -> None:
    """The mixers of the run's model, built on the meta device (no tensor work), checked for QK-clip."""
    if tau is not None:
        with torch.device("meta"):
            mixers(build(), tau)


def clip_factors(max_logits: torch.Tensor, tau: float) -> torch.Tensor:
    """gamma = min(1, tau / max_logit) per head (1 where the largest logit is at most tau)."""
    top = max_logits.float()
    return torch.where(top > tau, tau / top, torch.ones_like(top))


class QKClip:
    """QK-clip of one model's mixers: :meth:`measure` (after the backward, before the optimizer step) reads each
    head's largest logit on the inputs the training forward gave each mixer; :meth:`rescale` (after the step)
    applies the clip. It keeps no state between steps."""

    def __init__(self, model: nn.Module, tau: float) -> None:
        self.tau, self.mixers = tau, mixers(model, tau)
        self.inputs: dict[int, torch.Tensor] = {}
        self.maxima: list[torch.Tensor] = []
        for i, mixer in enumerate(self.mixers):
            mixer.register_forward_pre_hook(lambda m, args, i=i: self.keep(i, m, args[0]))

    def keep(self, i: int, mixer: nn.Module, x: torch.Tensor) -> None:
        """Keep mixer ``i``'s input of a training forward (not an evaluation's or a probe's)."""
        if mixer.training and torch.is_grad_enabled():
            self.inputs[i] = x.detach()

    @torch.no_grad()
    def measure(self) -> None:
        """Each mixer's per-head largest logit (h,) on its kept input, with the weights as they are now."""
        maxima = []
        for i, mixer in enumerate(self.mixers):
            scores = hook(mixer, "attention_logits")(self.inputs.pop(i).float())
            maxima.append(reduce(scores.float(), "b h q k -> h", "max"))
        if dist.is_initialized() and dist.get_world_size() > 1:  # every rank's batch: the same weights on each
            flat = torch.cat(maxima)
            dist.all_reduce(flat, op=dist.ReduceOp.MAX)
            maxima = list(flat.split([m.numel() for m in maxima]))
        self.maxima = maxima

    @torch.no_grad()
    def rescale(self) -> None:
        """Each mixer's query and key weights rescaled by its heads' gamma (:func:`clip_factors`)."""
        for mixer, top in zip(self.mixers, self.maxima, strict=True):
            hook(mixer, "clip_qk")(clip_factors(top, self.tau))  # x 1 leaves a weight as it was
        self.maxima = []
