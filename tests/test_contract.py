"""The block contract (zoo/testing/contract.py), checked for every combination of registered parts.

One test per combination: its blocks are built once and every property runs against them; a
failure names each property that failed. Invalid combinations are skipped with the reason
(zoo.check_combination), and the run ends with a count (conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from zoo.testing.combos import every_combination, every_pair
from zoo.testing.contract import PROPERTIES, Subject, run_contract
from zoo.testing.exceptions import conclude, declared_exceptions


@every_combination
def test_block_contract(combo, record_property):
    subject = Subject.of(combo)
    if isinstance(subject, str):
        pytest.skip(subject)
    record_property("context", subject.context)
    failures, notes = run_contract(subject)
    for note in notes:
        record_property("note", note)
    conclude(failures, declared_exceptions(combo), PROPERTIES, record_property, combo)


# --- Models, cross-attention and encoder blocks ----------------------------------------------------
# Checked for every combination in one test: each combination's model and blocks are built once,
# every check runs on them, and a failure names each check that failed.

import torch  # noqa: E402

from zoo import LayerState, StaticDecoder, build_block, check_combination  # noqa: E402
from zoo.testing.combos import (  # noqa: E402
    MODEL_OPTION_CASES,
    MODEL_OPTIONS,
    PATTERN_CASES,
    PATTERNS,
    VOCAB,
    block_config,
    combo_id,
    make_model,
    pattern_id,
    randomize,
)
from zoo.testing.contract import OUTSIDE_INFERENCE, check_gradients, check_mode, close  # noqa: E402

B, T, D = 2, 6, 16
S = 5  # source (encoder memory) length
#: Logits compared at float32 tolerance; computed in float64 so only a real difference can exceed it.
FLOAT32 = 1e-5


class Built:
    """One combination's 2-layer model (with a ``pattern``: one layer per entry, zoo.testing.combos.PATTERNS),
    cross-attention block and encoder block, each built on first use."""

    def __init__(self, combo: dict[str, str], pattern: list[dict] | None = None, options: dict | None = None) -> None:
        self.combo, self.pattern, self.options = combo, pattern, options
        self._made: dict[str, torch.nn.Module] = {}

    def _get(self, key: str, make: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        if key not in self._made:
            with OUTSIDE_INFERENCE:  # parameters autograd can use, whichever check builds them
                self._made[key] = make()
        return self._made[key]

    @property
    def model(self) -> torch.nn.Module:
        layers = len(self.pattern) if self.pattern else 2
        return self._get("model", lambda: make_model(self.combo, n_layers=layers, pattern=self.pattern,
                                                     options=self.options))  # fmt: skip

    @property
    def cross(self) -> torch.nn.Module:
        return self._get("cross", lambda: self.bare_block(cross_attention=True))

    @property
    def encoder(self) -> torch.nn.Module:
        return self._get("encoder", lambda: self.bare_block(causal=False))

    def bare_block(self, **overrides: object) -> torch.nn.Module:
        """The block alone (absolute positions, if any, are a model's: here they add nothing)."""
        block = build_block(block_config(self.combo, **overrides), context="model").double()
        randomize(block)
        return block.eval()


MODEL_CHECKS: dict[str, Callable[[Built], None]] = {}  # run for every combination
PAIR_CHECKS: dict[str, Callable[[Built], None]] = {}  # run for every pair of parts (combos.every_pair)
PATTERN_CHECKS: dict[str, Callable[[Built], None]] = {}  # run for each layer pattern (combos.PATTERN_CASES)
#: The checks that take gradients (@takes_gradients); every other runs under inference_mode (the eval-mode models
#: compute the same function either way, and autograd's bookkeeping of each tiny forward took 40% of the checks' time).
GRAD_CHECKS: set[str] = set()


def model_check(check: Callable[[Built], None]) -> Callable[[Built], None]:
    MODEL_CHECKS[check.__name__.replace("_", " ")] = check
    return check


def pair_check(check: Callable[[Built], None]) -> Callable[[Built], None]:
    PAIR_CHECKS[check.__name__.replace("_", " ")] = check
    return check


def pattern_check(check: Callable[[Built], None]) -> Callable[[Built], None]:
    PATTERN_CHECKS[check.__name__.replace("_", " ")] = check
    return check


def takes_gradients(check: Callable[[Built], None]) -> Callable[[Built], None]:
    GRAD_CHECKS.add(check.__name__.replace("_", " "))
    return check


def run_checks(combo: dict[str, str], checks: dict[str, Callable[[Built], None]], record_property) -> None:
    subject = Subject.of(combo)
    if isinstance(subject, str):
        pytest.skip(subject)
    built, failures = Built(combo), {}
    refused = check_combination(block_config(combo, cross_attention=True), "model")
    if refused is not None:  # an attention without a cross-attention (zoo.core.interface) has no cross checks
        record_property("note", f"cross-attention checks not run: {refused}")
        checks = {name: check for name, check in checks.items() if not name.startswith("cross attention")}
    refused = check_combination(block_config(combo, causal=False), "model")
    if refused is not None:  # a causal-only mixer (Gated DeltaNet) refuses encoder blocks by name
        record_property("note", f"encoder checks not run: {refused}")
        checks = {name: check for name, check in checks.items() if not name.startswith("encoder")}
    for name, check in checks.items():
        try:
            run_check(name, check, built)
        except AssertionError as error:
            failures[name] = str(error)
    conclude(failures, declared_exceptions(combo), checks, record_property, combo)


def run_check(name: str, check: Callable[[Built], None], built: Built) -> None:
    """``check`` on ``built``, under inference_mode unless it is one of GRAD_CHECKS."""
    with check_mode(name in GRAD_CHECKS):
        check(built)


@every_combination
def test_model_contract(combo, record_property):
    run_checks(combo, MODEL_CHECKS, record_property)


@every_pair
def test_model_contract_pairwise(combo, record_property):
    run_checks(combo, PAIR_CHECKS, record_property)


@pytest.mark.parametrize("case", PATTERN_CASES, ids=[pattern_id(case) for case in PATTERN_CASES])
def test_pattern_model_contract(case, record_property):
    """A model whose layers differ by a pattern (mixers, windows, positions): decoding with caches across
    its mixed layers, left padding, causality and gradients, as every combination's model."""
    name, combo = case
    run_model_checks(Built(combo, PATTERNS[name]), PATTERN_CHECKS, record_property, {"pattern": name, **combo})


@pytest.mark.parametrize("combo", MODEL_OPTION_CASES, ids=[combo_id(c) for c in MODEL_OPTION_CASES])
def test_model_options_contract(combo, record_property):
    """A model with its own options outside the blocks (zoo.testing.combos.MODEL_OPTIONS: the embedding's scale and
    norm, the logits' cap): every model check, and left padding."""
    run_model_checks(Built(combo, options=MODEL_OPTIONS), {}, record_property, combo)


def run_model_checks(built: Built, more: dict[str, Callable[[Built], None]], record_property, shown: dict) -> None:
    """Every model check, left padding and ``more`` on ``built``'s model; a failure names ``shown``."""
    checks = {**MODEL_CHECKS, "left padded batch equals each prompt alone": left_padded_batch_equals_each_prompt_alone}
    checks |= more
    failures = {}
    for check_name, check in checks.items():
        try:
            run_check(check_name, check, built)
        except AssertionError as error:
            failures[check_name] = str(error)
    conclude(failures, declared_exceptions(built.combo), checks, record_property, shown)


def inputs(batch: int = B, time: int = T) -> torch.Tensor:
    return torch.randn(batch, time, D, dtype=torch.float64)


@model_check
def prefill_in_chunks_then_cached_decoding_equals_full_forward(built: Built) -> None:
    model = built.model
    ids = torch.randint(0, VOCAB, (B, 7))
    caches = model.new_caches(max_len=4)  # smaller than the sequence: the cache must grow
    steps, start = [], 0
    for size in (2, 3, 1, 1):  # a prefill, a chunk, then single tokens
        steps.append(model(ids[:, start : start + size], caches=caches))
        start += size
    assert all(cache.length == ids.shape[1] for cache in caches)
    close(torch.cat(steps, dim=1), model(ids), FLOAT32, "logits")
    # Only what each layer says its state holds (its mixer's: softmax attention a key and a value per kv head
    # and slot, none in a layer reading its group's first layer's under model.kv_share; and its canon layers' last
    # inputs), the smear its last embedding and the n-gram table its last n - 1 ids, for every sample, 8 bytes each.
    sizes = [
        block.state_size(cache.mixer.capacity if hasattr(cache.mixer, "capacity") else cache.mixer.length)
        for block, cache in zip(model.blocks, caches, strict=True)
    ] + [0 if getattr(model, name, None) is None else getattr(model, name).state_size() for name in ("smear", "ngram")]
    held_bytes = sum(cache.nbytes for cache in caches)
    assert held_bytes == B * sum(sizes) * 8, "the state holds more than the mixers say"


@model_check
def static_cache_steps_equal_full_forward(built: Built) -> None:
    """StaticDecoder's step (uncompiled: the same graph compile sees) over a preallocated cache of
    max_len slots, written at a device-side cursor, gives the full forward's logits at every step."""
    model = built.model
    ids = torch.randint(0, VOCAB, (B, 8))  # fills every slot: 8 = the tiny models' block.max_len
    decoder = StaticDecoder(model, max_len=8, compile=False)
    logits = [model.logits(model.hidden_states(ids[:, :3], caches=decoder.caches, positions=slots(3, 0)))]
    for t in range(3, ids.shape[1]):
        logits.append(decoder.step(ids[:, t : t + 1], slots(1, t), None)[:, None])
    assert all(cache.length == ids.shape[1] for cache in decoder.caches)
    close(torch.cat(logits, dim=1), model(ids), FLOAT32, "logits")


def slots(time: int, start: int) -> torch.Tensor:
    """Position ids (B, time) of tokens start..start + time - 1."""
    return torch.arange(start, start + time).expand(B, time)


@pair_check
def left_padded_batch_equals_each_prompt_alone(built: Built) -> None:
    model = built.model
    lengths, width, new = [3, 5], 5, 3
    prompts = [torch.randint(0, VOCAB, (1, n)) for n in lengths]
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    key_mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for i, prompt in enumerate(prompts):
        ids[i, width - prompt.shape[1] :] = prompt
        key_mask[i, width - prompt.shape[1] :] = True
    positions = (key_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(ids, key_mask=key_mask, positions=positions)
    for i, prompt in enumerate(prompts):
        close(logits[i, width - prompt.shape[1] :], model(prompt)[0], FLOAT32, "logits")
    batched = model.generate(ids, new, key_mask=key_mask)
    alone = torch.cat([model.generate(prompt, new) for prompt in prompts])
    assert torch.equal(batched, alone)
    assert torch.equal(model.generate(ids, new, key_mask=key_mask, use_cache=False), alone)
    static = StaticDecoder(model, max_len=width + new, compile=False)
    assert torch.equal(static.generate(ids, new, key_mask=key_mask), alone)


@model_check
def packed_documents_equal_each_document_alone(built: Built) -> None:
    """``task.doc_mask``: two documents packed in one row (``doc_ids``) give the logits each gives alone (so the
    second's never move with the first's tokens), and a cached prefill and decoding across the boundary the packed
    forward's; a model whose mixer states no reset (its ``doc_reset``) refuses document ids by name instead."""
    from zoo.core.errors import ConfigError
    from zoo.core.interface import hook

    model = built.model
    first, second = torch.randint(0, VOCAB, (B, 3)), torch.randint(0, VOCAB, (B, 3))
    packed, doc_ids = torch.cat([first, second], dim=1), torch.tensor([[0, 0, 0, 1, 1, 1]]).expand(B, -1)
    try:
        logits = model(packed, doc_ids=doc_ids)
    except ConfigError as error:
        assert error.field == "task.doc_mask", error
        assert any(hook(block.attn, "doc_reset") is None for block in model.blocks), f"refused: {error}"
        return
    close(logits, torch.cat([model(first), model(second)], dim=1), FLOAT32, "packed logits")
    caches, steps = model.new_caches(max_len=4), []
    for start, end in ((0, 2), (2, 5), (5, 6)):  # the second chunk holds the boundary
        steps.append(model(packed[:, start:end], caches=caches, doc_ids=doc_ids[:, :end]))
    close(torch.cat(steps, dim=1), logits, FLOAT32, "cached logits across the boundary")


@pattern_check
def later_tokens_change_no_earlier_logit(built: Built) -> None:
    model = built.model
    ids = torch.randint(0, VOCAB, (B, 7))
    logits = model(ids)
    changed = ids.clone()
    changed[:, 4:] = (changed[:, 4:] + 1 + torch.randint(0, VOCAB - 1, (B, 3))) % VOCAB  # every one differs
    close(model(changed)[:, :4], logits[:, :4], 1e-12, "logits before the change")
    assert not torch.allclose(model(changed)[:, 4:], logits[:, 4:]), "the changed tokens change nothing"


@takes_gradients
@pattern_check
def gradients_reach_every_parameter(built: Built) -> None:
    model = built.model
    model.zero_grad(set_to_none=True)
    ids = torch.randint(0, VOCAB, (B, 7))
    (model(ids) * torch.randn(B, 7, VOCAB, dtype=torch.float64)).sum().backward()
    check_gradients({name: p.grad for name, p in model.named_parameters()})


def memory_inputs(batch: int = B) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder memory (b, S, D) and its padding mask: the first sample's last 2 positions are padding."""
    memory_mask = torch.ones(batch, S, dtype=torch.bool)
    memory_mask[0, -2:] = False
    return torch.randn(batch, S, D, dtype=torch.float64), memory_mask


@pair_check
def cross_attention_reads_real_memory_never_its_padding_nor_the_future(built: Built) -> None:
    block, x = built.cross, inputs()
    memory, memory_mask = memory_inputs()
    y = block(x, memory=memory, memory_mask=memory_mask)
    changed = memory.clone()
    changed[0, -2:] = torch.randn(2, D, dtype=memory.dtype) * 5  # padding only
    close(block(x, memory=changed, memory_mask=memory_mask), y, 1e-12, "outputs")
    changed[:, 0] += torch.randn(D, dtype=memory.dtype)  # a real source token
    assert not torch.allclose(block(x, memory=changed, memory_mask=memory_mask), y), "memory is ignored"
    future = x.clone()
    future[:, 3:] = torch.randn_like(future[:, 3:]) * 3
    out = block(future, memory=memory, memory_mask=memory_mask)
    close(out[:, :3], y[:, :3], 1e-12, "outputs")


@pair_check
def cross_attention_cached_decoding_equals_full_forward(built: Built) -> None:
    block, x = built.cross, inputs()
    memory, memory_mask = memory_inputs()
    cache = LayerState()
    steps = [block(x[:, :3], cache=cache, memory=memory, memory_mask=memory_mask)]
    # Later steps get no memory: its keys and values were computed once, at the first step.
    steps += [block(x[:, t : t + 1], cache=cache, memory_mask=memory_mask) for t in range(3, T)]
    full = block(x, memory=memory, memory_mask=memory_mask)
    close(torch.cat(steps, dim=1), full, 1e-10, "outputs")


@takes_gradients
@pair_check
def cross_attention_gradients_reach_memory_and_every_parameter(built: Built) -> None:
    block = built.cross
    x = inputs().requires_grad_()
    memory, memory_mask = memory_inputs()
    memory.requires_grad_()
    block.zero_grad(set_to_none=True)
    (block(x, memory=memory, memory_mask=memory_mask) * torch.randn(B, T, D, dtype=x.dtype)).sum().backward()
    assert memory.grad is not None and memory.grad[:, :-2].abs().sum() > 0
    assert torch.all(memory.grad[0, -2:] == 0), "gradient flows into padded memory"
    check_gradients({name: p.grad for name, p in block.named_parameters()})


@pair_check
def encoder_block_sees_both_directions_and_ignores_padding(built: Built) -> None:
    block, x = built.encoder, inputs()
    key_mask = torch.ones(B, T, dtype=torch.bool)
    key_mask[:, -2:] = False  # right padding
    y = block(x, key_mask=key_mask)
    assert torch.isfinite(y).all()
    future = x.clone()
    future[:, 1] += torch.randn(D, dtype=x.dtype)  # a later real token (in any window) changes an earlier output
    assert not torch.allclose(block(future, key_mask=key_mask)[:, 0], y[:, 0]), "encoder block is causal"
    padded = x.clone()
    padded[:, -2:] = torch.randn_like(padded[:, -2:]) * 5
    close(block(padded, key_mask=key_mask)[:, :-2], y[:, :-2], 1e-12, "outputs")


def test_declared_exceptions_name_real_checks():
    """A part's ``contract_exceptions`` may only name a property or model check that exists (a typo
    would otherwise excuse nothing, silently), each with a reason, limited (``only_with``) to axes
    that exist."""
    from zoo import AXES
    from zoo.core.options import option_defaults
    from zoo.testing.exceptions import exception_entry, part_exceptions

    known = set(PROPERTIES) | set(MODEL_CHECKS) | set(PAIR_CHECKS)
    assert GRAD_CHECKS <= known | set(PATTERN_CHECKS), GRAD_CHECKS - known - set(PATTERN_CHECKS)
    for axis, registry in AXES.items():
        for part in registry.parts():
            for name, value in part_exceptions(part.cls, option_defaults(part)).items():
                assert name in known, f"{axis} {part.name} declares an exception for {name!r}: not a contract check"
                why, _ = exception_entry(value)  # raises ValueError on a malformed entry
                assert why.strip(), f"{axis} {part.name}: {name!r} needs a reason"
