"""The block contract: the properties every combination of parts must have, in one shared module.

Each property is a function of a :class:`Subject` (one combination; its blocks and the outputs
several properties read are built or computed once) registered with ``@prop``.
:func:`run_contract` runs them all and returns one message per failing property, named, with the
values that failed, so one broken property never hides another. Equality of two paths is tested in
float64, where a real difference cannot hide in rounding.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from einops import repeat
from torch import nn
from torch.nn.attention import flex_attention as torch_flex

from zoo.parts.residuals import Residual, Streams
from zoo.parts.state import LayerState
from zoo.testing.combos import block_config, build, context_of, randomize

B, T, D = 2, 6, 16
PADS = (2, 0)  # left padding of each sample: sample 0's queries 0 and 1 see no real key at all
CHUNKS = (3, 2, 1)  # cached decoding: a 3-token prompt, a 2-token chunk, then a single token
BACKENDS = ("sdpa", "math")
FLEX = "flex"  # compared with math by "backends agree" alone (it has no CPU backward)
DROPOUT = 0.5
HUGE = 1e4  # "finite on huge inputs": the inputs' scale (standard normal inputs times this), in float32

#: Blocks are built, and gradients taken, outside the inference mode most properties run in (their parameters and
#: inputs are then tensors autograd can use).
OUTSIDE_INFERENCE = torch.inference_mode(False)


def check_mode(grad: bool) -> AbstractContextManager[Any]:
    """The autograd mode a check runs in: gradients recorded (``grad``), else inference_mode."""
    return torch.enable_grad() if grad else torch.inference_mode()


#: bfloat16 keeps 8 mantissa bits (~0.4% per rounding); a block compounds a few dozen roundings.
BF16_RELATIVE_ERROR = 0.05

Property = Callable[["Subject"], "str | None"]
PROPERTIES: dict[str, Property] = {}
NEEDS_GRAD: set[str] = set()


def prop(name: str, grad: bool = False) -> Callable[[Property], Property]:
    """Register a property. It raises AssertionError when violated, and may return a note
    ("not applicable: ...") when the combination has nothing to check. Without ``grad`` it runs
    under inference_mode (no autograd bookkeeping: the blocks it reads are built outside it)."""

    def register(check: Property) -> Property:
        PROPERTIES[name] = check
        if grad:
            NEEDS_GRAD.add(name)
        return check

    return register


@dataclass
class Subject:
    """One combination: its config, the context it runs in, and its blocks (built once each)."""

    combo: dict[str, str]
    cfg: dict[str, Any]
    context: str
    backends: list[str]  # the configured backend first, then the others the config allows
    flex: bool = False  # whether the config allows block.attn.backend=flex
    x: torch.Tensor = field(default_factory=lambda: torch.randn(B, T, D, dtype=torch.float64))
    key_mask: torch.Tensor = field(init=False)
    _blocks: dict[Any, nn.Module] = field(default_factory=dict)
    _cached: dict[Any, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.key_mask = torch.ones(B, T, dtype=torch.bool)
        for i, pad in enumerate(PADS):
            self.key_mask[i, :pad] = False

    @classmethod
    def of(cls, combo: dict[str, str]) -> Subject | str:
        """The subject of ``combo``, or the reason the combination is invalid."""
        cfg = block_config(combo)
        context, reason = context_of(cfg)
        if context is None:
            return str(reason)
        configured = cfg["attn"].get("backend", "sdpa")
        others = [b for b in BACKENDS if b != configured and context_of(with_backend(cfg, b))[0] is not None]
        flex = configured != FLEX and context_of(with_backend(cfg, FLEX))[0] is not None
        return cls(combo, cfg, context, [configured, *others], flex=flex)

    @OUTSIDE_INFERENCE
    def build(self, **overrides: Any) -> nn.Module:
        """A fresh float64 block of this combination (``attn={...}`` or size overrides), in eval()."""
        cfg = {**self.cfg, **{k: ({**self.cfg[k], **v} if isinstance(v, dict) else v) for k, v in overrides.items()}}
        return build(cfg, self.context).double().eval()

    @OUTSIDE_INFERENCE
    def block(self, backend: str | None = None) -> nn.Module:
        """The block with ``backend`` (default: configured); every backend shares the same weights."""
        backend = backend or self.backends[0]
        if backend not in self._blocks:
            block = self.build(attn={"backend": backend})
            if backend == self.backends[0]:
                randomize(block)
            else:  # the configured block's weights (built first if it was not)
                block.load_state_dict(self.block().state_dict())
            self._blocks[backend] = block
        return self._blocks[backend]

    @OUTSIDE_INFERENCE
    def reloaded(self) -> nn.Module:
        """A fresh build with ``block.dropout`` = DROPOUT, loaded with the block's state_dict (once)."""
        if "reloaded" not in self._blocks:
            block = self.build(dropout=DROPOUT)
            block.load_state_dict(self.block().state_dict())
            self._blocks["reloaded"] = block
        return self._blocks["reloaded"]

    @OUTSIDE_INFERENCE
    def float32(self, consume: bool = False) -> nn.Module:
        """A float32 block with the same weights (made from the reloaded block, if one was built, so
        no other property gets that one afterwards). ``consume``: the caller converts it further,
        so the next call makes a new one."""
        if "float32" not in self._blocks:
            self._blocks["float32"] = self.reloaded().float()
            del self._blocks["reloaded"]
        return self._blocks.pop("float32") if consume else self._blocks["float32"]

    def y(self, backend: str | None = None, masked: bool = False) -> torch.Tensor:
        """The block's output on ``x`` (with ``key_mask`` when masked), computed once."""
        key = (backend or self.backends[0], masked)
        if key not in self._cached:
            self._cached[key] = self.block(key[0])(self.x, key_mask=self.key_mask if masked else None)
        return self._cached[key]

    @OUTSIDE_INFERENCE
    def causal(self, backend: str) -> dict[str, Any]:
        """One forward and one backward, computed once per backend, read by the causality properties
        (and, for the configured backend, by "gradients reach ...").

        Inputs (2T - 1, T, D): rows 0..T-1 are copies of sample 0, row t answering for output t
        (batched, as samples are independent: "samples do not see each other" checks that); row
        T + t has every token after t replaced. Backward from a random projection of output t of
        row t, for every t: d/d(row t) is that output's Jacobian.
        """
        key = ("causal", backend)
        if key not in self._cached:
            rows = [self.x[0]] * T
            for t in range(T - 1):
                changed = self.x[0].clone()
                changed[t + 1 :] = torch.randn_like(changed[t + 1 :]) * 3
                rows.append(changed)
            x = torch.stack(rows).requires_grad_()
            block = self.block(backend)
            params = dict(block.named_parameters())
            with torch.enable_grad():
                y = block(x)
                picked = y[torch.arange(T), torch.arange(T)]  # (T, D): output t of row t
                grads = torch.autograd.grad(
                    (picked * torch.randn_like(picked)).sum(), [x, *params.values()], allow_unused=True
                )
            self._cached[key] = {"y": y.detach(), "dx": grads[0], "dparams": dict(zip(params, grads[1:], strict=True))}
        return self._cached[key]


def with_backend(cfg: dict[str, Any], backend: str) -> dict[str, Any]:
    return {**cfg, "attn": {**cfg["attn"], "backend": backend}}


def run_contract(subject: Subject) -> tuple[dict[str, str], list[str]]:
    """Run every property: (failures by property name, notes), each note starting with the property's
    name; a failure's message is one line naming the values that failed."""
    failures, notes = {}, []
    for name, check in PROPERTIES.items():
        try:
            with check_mode(name in NEEDS_GRAD):
                note = check(subject)
        except AssertionError as error:
            failures[name] = one_line(str(error) or "failed (the assertion gave no message)")
        except Exception as error:  # noqa: BLE001  (every property reports, whatever it raised)
            failures[name] = one_line(f"{type(error).__name__}: {error}")
        else:
            if note:
                notes.append(f"{name}: {note}")
    return failures, notes


def one_line(message: str) -> str:
    return "; ".join(line.strip() for line in message.splitlines() if line.strip())


def where(index: tuple[int, ...], names: tuple[str, ...] = ("sample", "position", "feature")) -> str:
    """``(0, 3, 5)`` -> ``sample 0, position 3, feature 5`` (the last names for fewer dimensions)."""
    names = names[len(names) - len(index) :] if len(index) <= len(names) else tuple(f"dim {i}" for i in index)
    return ", ".join(f"{name} {i}" for name, i in zip(names, index, strict=True))


def first(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0])


def close(actual: torch.Tensor, expected: torch.Tensor, atol: float, what: str) -> None:
    """assert |actual - expected| <= atol everywhere, else one line: what, the largest difference, where
    the first one past ``atol`` is, and how many there are (computed only on failure)."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} {actual.dtype}, expected "
                             f"{tuple(expected.shape)} {expected.dtype}")  # fmt: skip
    difference = (actual - expected).abs()
    if bool(difference.max() <= atol):
        return
    bad = ~(difference <= atol)  # NaN counts as a difference
    index = first(bad)
    raise AssertionError(
        f"{what}: max |difference| {difference.max().item():.3g} > {atol:g} allowed; {int(bad.sum())} of "
        f"{bad.numel()} values differ, first at {where(index)} ({actual[index].item():.6g} vs "
        f"{expected[index].item():.6g})"
    )


def check_finite(y: torch.Tensor, what: str) -> None:
    """assert every value of ``y`` is finite, else: how many are not, and the first one and where."""
    bad = ~torch.isfinite(y)
    if bool(bad.any()):
        index = first(bad)
        raise AssertionError(f"{what}: {int(bad.sum())} of {y.numel()} outputs are not finite, first "
                             f"{y[index].item()} at {where(index)}")  # fmt: skip


@prop("shape kept")
def shape_kept(s: Subject) -> None:
    for x in (s.x[:, :1], s.x):
        y = s.block()(x) if x.shape[1] == 1 else s.y()
        assert y.shape == x.shape, f"T={x.shape[1]}: input {tuple(x.shape)} -> output {tuple(y.shape)}"


@prop("future tokens do not change the past")
def future_tokens(s: Subject) -> None:
    for backend in s.backends:
        y = s.causal(backend)["y"]
        for t in range(T - 1):
            close(y[T + t, : t + 1], y[0, : t + 1], 1e-12,
                  f"{backend}: changing the tokens after position {t} changed outputs 0..{t}")  # fmt: skip


@prop("the Jacobian is zero on future inputs")
def jacobian(s: Subject) -> None:
    for backend in s.backends:
        grad = s.causal(backend)["dx"]
        for t in range(T):
            later = grad[t, t + 1 :].abs()
            if bool((later != 0).any()):
                position = t + 1 + int((later.sum(-1) != 0).nonzero()[0])
                raise AssertionError(f"{backend}: output {t} depends on later input {position}: "
                                     f"|d output/d input| sums to {later.sum().item():.3g}")  # fmt: skip
            assert grad[t, : t + 1].abs().sum() > 0, f"{backend}: output {t} ignores its own past (zero Jacobian)"


#: A gradient whose largest value is below this fraction of the largest of them all is float64 rounding, not a path
#: to the output: exactly 0 in one process, 1e-32 in another. Over every combination the smallest real one is 5e-8
#: of its block's largest, the rounding ones 6e-18 and below (mHC's mix in a lone block, zoo.parts.residuals.Hyper).
ROUNDING = 1e-12


def check_gradients(grads: dict[str, torch.Tensor | None]) -> None:
    """assert every gradient exists, is finite and exceeds rounding (:data:`ROUNDING` of the largest)."""
    for name, grad in grads.items():
        assert grad is not None, f"{name} gets no gradient (not used in the forward)"
        bad = int((~torch.isfinite(grad)).sum())
        assert bad == 0, f"{name}: {bad} of {grad.numel()} gradient values are not finite"
    largest = max(float(grad.abs().max()) for grad in grads.values())
    for name, grad in grads.items():
        value = float(grad.abs().max())
        assert value > ROUNDING * largest, (
            f"{name} has an all-zero gradient ({grad.numel()} values)" if value == 0 else
            f"{name}: its gradient is rounding, at most {value:.2g} where the largest is {largest:.2g}"
        )  # fmt: skip


@prop("gradients reach the input and every parameter")
def gradients(s: Subject) -> None:
    # The causality backward: a random projection of every output position (dropout is 0, so
    # train() and eval() compute the same function).
    result = s.causal(s.backends[0])
    check_gradients({"the input": result["dx"], **result["dparams"]})


@prop("samples do not see each other")
def batch_independence(s: Subject) -> None:
    y = s.y()
    # Sample 0 beside sample 1, and beside 10 other samples (the causality batch): the same output.
    close(s.causal(s.backends[0])["y"][0], y[0], 1e-12, "changing the other samples changed sample 0")
    close(s.block()(s.x[1:]), y[1:], 1e-12, "sample 1 alone differs from sample 1 in the batch")


@prop("backends agree")
def backends_agree(s: Subject) -> str | None:
    # flex (FlexAttention, uncompiled: the function its compiled kernel computes) is compared here only, against
    # math; the other per-backend properties run sdpa and math.
    others = [b for b in ("sdpa", FLEX) if b in s.backends or b == FLEX and s.flex]
    if "math" not in s.backends or not others:
        return f"not applicable: only {s.backends[0]} is valid"
    for backend in others:
        with flex_without_dynamo() if backend == FLEX else nullcontext():
            close(s.y(backend), s.y("math"), 1e-10, f"{backend} vs math, without a key mask")
            close(s.y(backend, masked=True), s.y("math", masked=True), 1e-10,
                  f"{backend} vs math, with left padding {PADS}")  # fmt: skip
    return None


@contextmanager
def flex_without_dynamo() -> Iterator[None]:
    """Uncompiled FlexAttention calls torch's unfused implementation directly (torch's switch for debugging a mask),
    not through the Dynamo trace torch wraps each such call in: the same function, without a trace per new
    combination of shapes and masks (56 traces over every third combination, in one process). That every mask and score
    modification traces under Dynamo, uncompiled and compiled, is tests/test_flex.py's."""
    before = torch_flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    torch_flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    try:
        yield
    finally:
        torch_flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = before


@prop("state_dict round trip")
def state_dict_round_trip(s: Subject) -> None:
    # A fresh build (with dropout, inactive in eval(): the next property's block) loaded with the
    # state_dict computes the same function to the last bit.
    close(s.reloaded()(s.x), s.y(), 0, "a fresh build loaded with the state_dict differs")


@prop("dropout only in train()")
def dropout(s: Subject) -> None:
    block = s.reloaded()
    # eval(): equal to the dropout-free block to the last bit, so also deterministic.
    close(block(s.x), s.y(), 0, f"eval() at dropout {DROPOUT} differs from the dropout-free block")
    block.train()
    try:
        assert not torch.allclose(block(s.x), s.y()), f"train() at dropout {DROPOUT} equals eval(): dropout inactive"
    finally:
        block.eval()


@prop("finite on huge inputs")
def huge_inputs(s: Subject) -> None:
    check_finite(s.float32()(s.x.float() * HUGE), f"float32 inputs at scale {HUGE:.0e}".replace("e+0", "e"))


@prop("bfloat16 close to float32")
def bfloat16(s: Subject) -> None:
    block, x = s.float32(consume=True), s.x.float()
    reference = block(x)
    low = block.bfloat16()(x.bfloat16()).float()
    check_finite(low, "bfloat16")
    error = (low - reference).norm() / reference.norm()
    assert error < BF16_RELATIVE_ERROR, f"bfloat16 relative error {error:.3f} >= {BF16_RELATIVE_ERROR} allowed"


@prop("cached decoding equals the full forward")
def cached_decoding(s: Subject) -> None:
    for backend in s.backends:
        block, cache, steps = s.block(backend), LayerState(), []
        for start, length in zip(itertools.accumulate(CHUNKS, initial=0), CHUNKS, strict=False):
            steps.append(block(s.x[:, start : start + length], cache=cache))
        close(torch.cat(steps, dim=1), s.y(backend), 1e-10, f"{backend}: cached decoding in chunks {CHUNKS}")


@prop("padding never changes real positions and stays finite")
def padding(s: Subject) -> None:
    y = s.y(masked=True)
    check_finite(y, f"left padding {PADS}")
    changed = s.x.clone()
    for i, pad in enumerate(PADS):
        changed[i, :pad] = torch.randn_like(changed[i, :pad]) * 5
    y_changed = s.block()(changed, key_mask=s.key_mask)
    for i, pad in enumerate(PADS):
        close(y_changed[i, pad:], y[i, pad:], 1e-12, f"sample {i}: changing its {pad} padded positions")


def residual_of(block: nn.Module) -> Residual:
    """The block's residual part (``block.residual``)."""
    return next(m for m in block.modules() if isinstance(m, Residual))


@prop("hyper-connections mix the streams, doubly stochastic under Sinkhorn")
def stream_mixing(s: Subject) -> str | None:
    residual = residual_of(s.block())
    if not isinstance(residual, Streams):
        return "not applicable: one residual stream"
    n = residual.n_streams
    streams = torch.randn(B, T, n, D, dtype=torch.float64)
    nothing = torch.zeros(B, T, D, dtype=torch.float64)
    linear = torch.randn(D, D, dtype=torch.float64)
    for i in range(residual.n_updates):
        read, mix, write = residual.weights(streams, i)
        if residual.sinkhorn_iters:
            for dim, what in ((-1, "row"), (-2, "column")):
                worst = float((mix.sum(dim=dim) - 1).abs().max())
                assert worst <= 1e-4, (
                    f"term {i}: a {what} of the mixing matrix sums to 1 {worst:+.2e} off (1e-4 allowed)"
                )
        mixed = torch.einsum("...jk,...jd->...kd", mix, streams)  # stream k <- sum_j mix[j, k] H_j
        close(residual.update(streams, i, lambda h: nothing), mixed, 1e-12, f"term {i}: the streams with a zero branch")
        h = torch.einsum("...j,...jd->...d", read, streams)
        written = torch.einsum("...k,...d->...kd", write, h @ linear)
        got = residual.update(streams, i, lambda h: h @ linear)
        close(got, mixed + written, 1e-12, f"term {i}: the streams after a linear branch (read, then written)")
    return None


@prop("at its initial values the residual equals add")
def initial_residual(s: Subject) -> str | None:
    if s.cfg["residual"]["name"] == "add":
        return "not applicable: add itself"
    block = s.build()
    residual = residual_of(block)
    if getattr(residual, "sinkhorn_iters", 0):
        return "not applicable: mHC's constrained read cannot be one-hot (sigmoid)"
    if residual.streams == 0:
        return "not applicable: attnres reads the mean of its sources at init, not their sum (tests/test_attnres.py)"
    residual.reset_parameters()
    plain = s.build(residual="add")
    missing, unexpected = plain.load_state_dict(block.state_dict(), strict=False)
    assert not missing and all(".residual." in f".{k}" for k in unexpected), (missing, unexpected)
    expected = plain(s.x)
    if residual.streams == 1:
        close(block(s.x), expected, 0.0, "the block at its initial values")
        return None
    inner = block.block if hasattr(block, "pos_embed") and hasattr(block, "block") else block
    x = s.x if inner is block else block.pos_embed(s.x, torch.arange(T))
    streams = inner(repeat(x, "b t d -> b t n d", n=residual.streams))
    for k in range(residual.streams):  # 1e-12: under parallel, x + (a + b) where add's own sum is (x + a) + b
        close(streams[:, :, k], expected, 1e-12, f"stream {k} of the block at its initial values")
    return None
