"""What every model shares: the stack's initialization, parameter counts, the LM head and FLOPs per token
(the stack itself: :mod:`zoo.models.stack`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo.assembly.block import Block
from zoo.assembly.init import seeded_parameters
from zoo.assembly.match import active_count
from zoo.core import tp
from zoo.core.auxiliary import collect_aux
from zoo.core.interface import defines, hook
from zoo.parts.canon import Canon, init_canon
from zoo.parts.residuals import Residual

#: Parameters whose output is added to the residual stream (scaled down at init by depth).
RESIDUAL_OUTPUTS = ("attn.out.weight", "mlp.down.weight")  # also matches cross_attn.out.weight


def init_stack(
    module: nn.Module,
    n_residual_branches: int | Callable[[str], int],
    seed: int | None = None,
    stds: Mapping[str, float] | None = None,
) -> None:
    """Normal(0, 0.02) weights, zero biases, norm gains untouched, canon kernels as torch's Conv1d draws them
    (zoo.parts.canon.init_canon); residual-output projections
    (``attn.out``, ``cross_attn.out``, ``mlp.down``) get std 0.02 / sqrt(number of residual branches),
    i.e. 0.02 / sqrt(2 n_layers) for a decoder-only stack (GPT-2), so the stream's variance stays
    independent of depth. ``n_residual_branches``: that number, or a function of the parameter's name
    (an encoder-decoder's two stacks have their own depths). ``stds``: the std of named matrices
    that differ (the token embedding under sinusoidal positions: d_model^-0.5, :func:`token_init_stds`).
    A residual part's parameters (``block.residual``: scalars, hyper-connections' weights) take its own initial
    values (its ``reset_parameters``), never a draw.

    Each draw is seeded from (seed, full parameter name, shape) (zoo.assembly.init; seed: the last
    torch.manual_seed), so variants built after the same seed share the weights of every parameter
    they have in common, and no two parameters of one model share a draw.
    """
    branches = n_residual_branches if callable(n_residual_branches) else lambda name: n_residual_branches
    stds = stds or {}
    canon = {name for name, m in module.named_modules() if isinstance(m, Canon)}
    residuals = {name: m for name, m in module.named_modules() if isinstance(m, Residual)}
    for m in residuals.values():
        m.reset_parameters()
    for name, p in seeded_parameters(module, seed):
        if name.rpartition(".")[0] in residuals:
            continue
        if name.rpartition(".")[0] in canon:
            init_canon(p)  # the reference's draw of a canon layer's kernel
        elif name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.ndim >= 2:
            if name in stds:
                std = stds[name]
            elif name.endswith(RESIDUAL_OUTPUTS):
                std = 0.02 / math.sqrt(branches(name))
            else:
                std = 0.02
            nn.init.normal_(p, std=std)


def mixing_flops(module: nn.Module, seq_len: int) -> int | None:
    """A sequence mixer's own training FLOPs per token (its ``mixing_flops`` hook), or None: a module
    that is no mixer, or one counted as softmax attention."""
    return hook(module, "mixing_flops")(seq_len) if defines(type(module), "mixing_flops") else None


def token_init_stds(pos_embed: nn.Module | None) -> dict[str, float]:
    """``{"embed.weight": std}`` when the position embedding scales the token embeddings and asks for
    its own init std (``token_init_std``: sinusoidal positions), else nothing."""
    std = hook(pos_embed, "token_init_std")
    return {} if std is None else {"embed.weight": std}


def residual_branches(blocks: Sequence[Block]) -> int:
    return sum(3 if block.cross_attn is not None else 2 for block in blocks)


def component_of(name: str) -> str:
    """The component a parameter belongs to, from its name (``blocks.0.attn.qkv.weight`` -> attention;
    ``value_embeds.*``, value embedding tables, -> embedding; ``mtp.*``, multi-token prediction's extra
    heads, -> mtp; ``*.residual.*``, ``block.residual``'s -> residual)."""
    if name.startswith("mtp."):
        return "mtp"
    if name.startswith("embedding_norm."):  # model.embedding_norm: a norm, not a table
        return "norms"
    if ".residual." in name or name.startswith(("smear.", "backout.")):  # model.smear, model.backout: on the stream
        return "residual"
    if name.startswith(("embed", "pos_embed", "head", "value_embeds.")) or ".pos_embed." in name:
        return "embedding"
    if name.startswith("ngram."):  # model.ngram: hashed n-gram tables and their per-layer scales, counted apart
        return "ngram"
    if ".attn." in name or ".cross_attn." in name or ".canon.a." in name or ".out_conv.attn." in name:
        return "attention"
    if ".mlp." in name or ".canon.c." in name or ".out_conv.mlp." in name:
        return "mlp"
    return "norms"


class TokenModel(nn.Module):
    """What the language and encoder-decoder models share: parameter counts by component, the LM
    head (``head``, or the embedding matrix ``embed`` when tied) and training FLOPs per token."""

    embed: nn.Embedding
    head: nn.Linear | None
    #: The logits' multiplier (μP: base width / width, zoo.assembly.mup); None: none.
    logit_scale: float | None = None
    #: ``model.logit_softcap`` c: logits -> c tanh(logits / c) after the multiplier; None: no cap.
    logit_softcap: float | None = None

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def parameter_counts(self) -> dict[str, int]:
        """Parameters by component: embedding (and untied head), attention, mlp, norms, mtp (the extra heads
        of ``objective=mtp``), residual (``block.residual``'s scalars and weights) and ngram (``model.ngram``'s
        tables and per-layer scales, apart so a comparison can match parameters with or without them), each of
        those three only when there are some, total (ngram's included)."""
        counts = {"embedding": 0, "attention": 0, "mlp": 0, "norms": 0}
        for name, p in self.named_parameters():
            component = component_of(name)
            counts[component] = counts.get(component, 0) + p.numel()
        counts["total"] = sum(counts.values())
        return counts

    def num_active_parameters(self) -> int:
        """Parameters one token uses (zoo.assembly.match.active_count): the total, less the experts a
        mixture of experts does not route it to."""
        return active_count(self)

    def take_aux_losses(self) -> dict[str, torch.Tensor]:
        """The auxiliary losses the parts recorded in the last training forward (zoo.core.auxiliary):
        each name's mean over the layers that recorded it. Clears the records."""
        return collect_aux(self)

    def take_future_logits(self) -> list[torch.Tensor]:
        """The extra heads' logits of the last training forward (``objective=mtp``: head j's (b, t - j, vocab),
        position i predicting token i + j + 1), then cleared; empty for a model without extra heads, and after
        a forward in eval() or without gradients (only the next-token head runs then)."""
        return self.__dict__.pop("_future_logits", [])

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(..., d_model) -> (..., vocab) through the head (the embedding matrix when tied).

        Under tensor parallelism the matrix is a DTensor split by vocabulary rows: each rank computes
        its slice of the logits from the whole ``h`` (the same on every rank), then they are gathered.
        """
        weight = self.embed.weight if self.head is None else self.head.weight
        if tp.is_dtensor(weight):
            h = tp.DTensor.from_local(h, weight.device_mesh, [tp.Replicate()], run_check=False)
            logits = F.linear(h, weight).full_tensor()
        else:
            logits = F.linear(h, weight)
        if self.logit_scale is not None:
            logits = logits * self.logit_scale
        if self.logit_softcap is not None:
            logits = self.logit_softcap * torch.tanh(logits / self.logit_softcap)
        return logits

    def training_flops(self, seq_len: int, attention_layers: int, heads: int = 1) -> int:
        """Training FLOPs (forward + backward) per token at context ``seq_len``.

        6 x the non-embedding parameters one token uses (each weight: one multiply-add forward, two
        backward; a mixture of experts counts its router, top_k and shared experts), the LM head's
        matmul included even when tied (once per head that reads it: ``heads``, multi-token prediction's
        extra heads too), plus attention scores and weighted values:
        6 x seq_len x d_model per attention layer (Kaplan et al. 2020, without halving for the causal mask),
        or the mixer's own count where it gives one (its ``mixing_flops`` hook: Gated DeltaNet's chunked form,
        a sliding window's min(window, seq_len) keys per query, heads of block.attn.head_dim features: n_heads x
        head_dim in place of d_model), each layer by its own mixer,
        plus what each part counts beyond those (its ``extra_flops`` hook: an output gate, a sink).
        """
        counts = self.parameter_counts()
        active = self.num_active_parameters() - counts["embedding"] - counts.get("ngram", 0)  # lookups, not matmuls
        dense = active + heads * self.embed.weight.numel()  # the LM head matmul counts, once per head
        own = [flops for flops in (mixing_flops(m, seq_len) for m in self.modules()) if flops is not None]
        softmax = attention_layers - len(own)
        extra = sum(hook(m, "extra_flops")(seq_len) for m in self.modules() if defines(m, "extra_flops"))
        return 6 * dense + 6 * softmax * seq_len * self.embed.embedding_dim + sum(own) + extra
