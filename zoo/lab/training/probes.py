"""``train.probe_every=N``: how a run trains, not only where it ends (0, the default: no probes).

Every N steps and at the last, on a fixed probe batch (the first validation batch, so the values can be
recomputed from the saved weights), the trainer logs a ``probe`` record to ``metrics.jsonl`` with the
keys of :data:`PROBE_KEYS` (besides ``kind``, ``step`` and ``tokens``):

- per layer, as lists in layer order (None for a mixer without softmax logits, named in ``no_logits``):
  ``attn_logit_max`` (the largest pre-softmax attention score over batch, heads and positions, after
  qk-norm and positions, at the kernel's score scale), ``attn_entropy`` (the attention weights' mean
  entropy over batch, heads and queries, nats, of the softmax over the keys), ``attn_first`` (the mean
  attention weight on the first position over batch, heads and the queries after the first: the
  "attention sink" of Qiu et al. 2025; a learned sink, ``block.attn.sink``, is one more term in each
  head's denominator, as in the forward), ``resid_rms`` (the residual stream's RMS after the block) and
  ``resid_max`` (its largest absolute value there: the "massive activations");
- the output logits' largest value ``logit_max``, their mean log-partition ``log_z`` (what z-loss
  penalizes) and the ``loss``, over the batch's scored tokens;
- ``grad_norm`` and ``update_ratio`` of the step just taken: the gradient's norm (before clipping, as
  the train records' ``grad_norm``) and the update's RMS over the weight's RMS before it, each for
  ``total``, per parameter group (``group0``, ...) and per matrix (each parameter of 2 or more
  dimensions, by name).

Probes run without gradients, in float32 without autocast, the model in eval mode (each module's mode
restored after), on rank 0 only; the attention scores come from each mixer's ``attention_logits`` hook
(zoo.core.interface), which reuses the probe forward's queries and keys (:func:`shared_projections`).
They draw no random numbers and change no weight, so a run with probes trains exactly as one without.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from einops import rearrange
from torch import nn

from zoo.assembly.block import Block
from zoo.core.interface import hook
from zoo.lab.tasks import IGNORE, Batch

#: The keys of a probe record besides ``kind``, ``step`` and ``tokens`` (other tools read them).
PROBE_KEYS = ("attn_logit_max", "attn_entropy", "attn_first", "resid_rms", "resid_max", "no_logits", "logit_max",
              "log_z", "loss", "grad_norm", "update_ratio")  # fmt: skip
#: The per-layer keys (lists in layer order).
LAYER_KEYS = ("attn_logit_max", "attn_entropy", "attn_first", "resid_rms", "resid_max")


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode for the block; every module's own mode back after it."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def blocks_of(model: nn.Module) -> list[Block]:
    """The model's blocks in layer order (an encoder's first)."""
    return [m for m in model.modules() if isinstance(m, Block)]


#: The mixers' projection steps a probe forward computes once per input: softmax attention's and MLA's
#: ``project(x, positions)`` (queries and keys), MLA's ``keys_values(latent, rope_key)``.
SHARED_STEPS = ("project", "keys_values")


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether tensors ``a`` and ``b`` are one tensor, or hold the same numbers in the same shape."""
    if a is b:
        return True
    tensors = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    return tensors and a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)


def computed_once(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` with the result of the call before it for the same tensor arguments (``same``); trailing
    ``None`` arguments (an optional mask or cache left out) count as absent."""
    last: list[Any] = []  # [arguments, result] of the latest call

    def once(*args: torch.Tensor | None, **kwargs: Any) -> Any:
        if kwargs:  # not a call the forward or attention_logits makes: computed as it is
            return step(*args, **kwargs)
        while args and args[-1] is None:
            args = args[:-1]
        if not (last and len(last[0]) == len(args) and all(map(same, last[0], args))):
            last[:] = [args, step(*args)]
        return last[1]

    return once


@contextlib.contextmanager
def shared_projections(mixers: list[nn.Module]) -> Iterator[None]:
    """Within: each mixer's :data:`SHARED_STEPS` run once per input, so that its ``attention_logits`` on the
    forward's input reuses the forward's queries and keys (the same numbers, computed once)."""
    patched = [(m, name) for m in mixers for name in SHARED_STEPS if callable(getattr(m, name, None))]
    for mixer, name in patched:
        setattr(mixer, name, computed_once(getattr(mixer, name)))  # an instance attribute over the method
    try:
        yield
    finally:
        for mixer, name in patched:
            delattr(mixer, name)


def first_share(scores: torch.Tensor, sink: torch.Tensor | None) -> torch.Tensor:
    """The mean attention weight on key 0 over batch, heads and the queries after the first, of scores
    (b, h, t, t); ``sink`` (h,): a learned logit per head, one more term in each row's denominator."""
    rows = scores[:, :, 1:]  # query 0 sees key 0 alone
    lse = torch.logsumexp(rows, dim=-1)  # (b, h, t - 1)
    if sink is not None:
        lse = torch.logaddexp(lse, rearrange(sink.float(), "h -> 1 h 1"))
    return torch.exp(rows[..., 0] - lse).mean()


def layer_stats(block: Block, x: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """(max attention logit, mean attention entropy, mean attention on the first position, output RMS, output
    peak) of one block, on the device; the first three None when its mixer has no logits. ``x``: the mixer's
    input, ``out``: the block's output."""
    rms = torch.linalg.vector_norm(out.float()) / out.numel() ** 0.5
    peak = out.float().abs().max()
    scores = hook(block.attn, "attention_logits")(x)
    if scores is None:
        return None, None, None, rms, peak
    weights = torch.softmax(scores, dim=-1)  # over keys; blocked keys (-inf) get 0
    # (b, h, t): -sum p log p; p at least the smallest normal number in the log, so 0 log 0 = 0 (vectorized
    # clamp, log and product: faster than the element-wise torch.special.entr)
    entropy = weights.clamp_min(torch.finfo(weights.dtype).tiny).log_().mul_(weights).sum(-1).neg_()
    sink = getattr(block.attn, "sink", None)  # block.attn.sink=learned: (h,) logits
    first = first_share(scores.float(), sink if isinstance(sink, torch.Tensor) else None)
    return scores.max(), entropy.mean(), first, rms, peak


@torch.inference_mode()  # no gradients, no version counters: what it computes is read back and dropped
def forward_probe(model: nn.Module, logits_of: Callable[[nn.Module, Batch], torch.Tensor], batch: Batch) -> dict:
    """The per-layer and output values of a probe record for ``batch``."""
    blocks = blocks_of(model)
    seen: dict[int, list[torch.Tensor]] = {}  # block -> [mixer input, block output]
    handles = []
    for i, block in enumerate(blocks):
        handles.append(block.attn.register_forward_pre_hook(lambda m, a, i=i: seen.setdefault(i, []).append(a[0])))
        handles.append(block.register_forward_hook(lambda m, a, out, i=i: seen.setdefault(i, []).append(out)))
    try:
        with eval_mode(model), shared_projections([block.attn for block in blocks]):
            logits = logits_of(model, batch).float()
            stats = [layer_stats(block, *seen[i][:2]) if i in seen else (None,) * 5 for i, block in enumerate(blocks)]
    finally:
        for handle in handles:
            handle.remove()
    tail = output_stats(logits, batch.targets)
    known = [v for row in stats for v in row if v is not None] + tail
    values = iter(torch.stack(known).tolist())  # one read back
    layers = [[next(values) if v is not None else None for v in row] for row in stats]
    out: dict[str, Any] = {key: [row[k] for row in layers] for k, key in enumerate(LAYER_KEYS)}
    out["no_logits"] = {str(i): type(b.attn).__name__ for i, b in enumerate(blocks) if stats[i][0] is None}
    out["logit_max"], out["log_z"], out["loss"] = (next(values) for _ in tail)
    return out


def output_stats(logits: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
    """[largest logit, mean log-partition, cross-entropy] over the scored tokens of logits (b, t, v)."""
    scored = targets != IGNORE
    log_z = torch.logsumexp(logits, dim=-1)  # (b, t)
    target = logits.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (b, t); IGNORE rows unused
    count = scored.sum()
    loss = torch.where(scored, log_z - target, 0.0).sum() / count  # -log softmax at the target, as loss_fn
    return [logits.amax(-1).masked_fill(~scored, -torch.inf).max(), torch.where(scored, log_z, 0.0).sum() / count, loss]


def squared_norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Each tensor's squared L2 norm, in float32 at least, as one tensor (one fused call per device and dtype)."""
    return torch.stack([n.float() for n in torch._foreach_norm(tensors)]).square()


class Probes:
    """The probes of one run: ``due(step)`` says when; :meth:`snapshot` (after the backward of such a step,
    before clipping and the optimizer step) keeps the gradient norms and the weights before the update;
    :meth:`record` after the step."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, every: int, steps: int) -> None:
        self.model, self.optimizer, self.every, self.steps = model, optimizer, every, steps
        names = {id(p): name for name, p in model.named_parameters()}
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        #: Each key of ``grad_norm`` and ``update_ratio`` -> the indices in ``params`` it covers.
        self.keys: dict[str, list[int]] = {"total": list(range(len(self.params)))}
        at = 0
        for i, group in enumerate(optimizer.param_groups):
            self.keys[f"group{i}"] = list(range(at, at + len(group["params"])))
            at += len(group["params"])
        for i, p in enumerate(self.params):
            if p.ndim >= 2:
                self.keys[names.get(id(p), f"param{i}")] = [i]
        self.members: torch.Tensor | None = None
        self.grads: dict[str, float | None] = {}
        self.before: list[torch.Tensor] = []

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.steps

    def sums(self, squares: torch.Tensor) -> list[Any]:
        """Per key, in key order: the root of the sum of its parameters' ``squares`` ((params,) or
        (params, n): n sums per key)."""
        if self.members is None or self.members.device != squares.device:  # (keys, params): 1 where a key covers one
            self.members = torch.zeros(len(self.keys), len(self.params), dtype=torch.float64, device=squares.device)
            for row, index in enumerate(self.keys.values()):
                self.members[row, index] = 1.0
        return (self.members @ squares.double()).sqrt().tolist()  # one product, one read back

    @torch.no_grad()
    def snapshot(self) -> None:
        """Before the optimizer step: each key's gradient norm, and a copy of the weights."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        self.grads = dict(zip(self.keys, self.sums(squared_norms(grads)), strict=True))
        self.before = torch._foreach_mul([p.detach() for p in self.params], 1.0)  # copies

    @torch.no_grad()
    def update_ratios(self) -> dict[str, float | None]:
        """Per key: the RMS of the step's update over the RMS of the weights before it (None: zero weights)."""
        diffs = torch._foreach_sub([p.detach() for p in self.params], self.before)
        squares = squared_norms(self.before + diffs).view(2, -1).T  # (params, 2): weight, update
        pairs = zip(self.keys, self.sums(squares), strict=True)  # one fused norm, one product, one read back
        return {key: update / weight if weight else None for key, (weight, update) in pairs}

    def record(self, logits_of: Callable[[nn.Module, Batch], torch.Tensor], batch: Batch) -> dict[str, Any]:
        """The probe record's values after a step that took a :meth:`snapshot`."""
        values = forward_probe(self.model, logits_of, batch)
        values["grad_norm"], values["update_ratio"] = self.grads, self.update_ratios()
        self.before = []
        return values
