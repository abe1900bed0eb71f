"""block.attn.backend=flex (zoo/parts/flex.py): FlexAttention gives the math backend's output with every mask
and score modification together (windows, padding, documents, ALiBi, soft-cap, sinks), decodes with a cache as
its full forward does, is refused by name where it cannot compute a part, and compiled computes the same.

The contract compares flex with math over every combination where it is valid ("backends agree")."""

from __future__ import annotations

import itertools

import pytest
import torch

from zoo import build_block
from zoo.core.errors import ConfigError
from zoo.parts.documents import Documents
from zoo.parts.flex import BLOCK, block_mask_of, flex_attend, slot_mask
from zoo.parts.kernels import additive, allowed_mask, attend
from zoo.parts.state import LayerState
from zoo.testing.combos import TINY

B, T = 3, 7
#: Sample 0: two padding tokens first (its queries 0 and 1 see no real key); sample 2: three documents.
PADS = (2, 0, 0)
IDS = torch.tensor([[0] * T, [0] * T, [0, 0, 1, 1, 1, 2, 2]])


def pair(attn: dict, pos: str = "none", backends: tuple[str, ...] = ("flex", "math")) -> list[torch.nn.Module]:
    """Tiny float64 blocks, one per backend, with the same random weights (sinks away from zero)."""
    blocks = []
    for backend in backends:
        cfg = {**TINY, "placement": "pre", "norm": "layernorm", "pos": pos, "mlp": "gelu",
               "attn": {**attn, "backend": backend}}  # fmt: skip
        blocks.append(build_block(cfg).double().eval())
    torch.manual_seed(0)
    for p in blocks[0].parameters():
        p.data.normal_(0, 0.5)
    for block in blocks[1:]:
        block.load_state_dict(blocks[0].state_dict())
    return blocks


def key_mask() -> torch.Tensor:
    mask = torch.ones(B, T, dtype=torch.bool)
    for i, pad in enumerate(PADS):
        mask[i, :pad] = False
    return mask


CASES = [
    ({"name": "mha"}, "none"),
    ({"name": "gqa", "window": 3}, "alibi"),
    ({"name": "mqa", "softcap": 2.0, "sink": "learned"}, "rotary"),
    ({"name": "gqa", "window": 2, "softcap": 1.5, "sink": "learned"}, "alibi"),
    ({"name": "mla", "sink": "learned"}, "none"),
]


@pytest.mark.parametrize(("attn", "pos"), CASES, ids=[f"{a['name']}-{p}-{len(a)}" for a, p in CASES])
def test_flex_equals_math_with_padding_and_documents(attn, pos):
    """Every mask and modification at once: with and without left padding and packed documents, flex gives math's
    output to 1e-10, the padding queries that see no real key included."""
    flex, math_ = pair(attn, pos)
    x = torch.randn(B, T, TINY["d_model"], dtype=torch.float64)
    with torch.no_grad():
        for mask, ids in itertools.product((None, key_mask()), (None, IDS)):
            docs = None if ids is None else Documents(ids)
            got, want = (b(x, key_mask=mask, documents=docs) for b in (flex, math_))
            torch.testing.assert_close(got, want, rtol=0, atol=1e-10, msg=f"key mask {mask is not None}, docs {ids}")


def test_the_block_mask_skips_hidden_blocks_when_compiled_and_eager_flex_never_evaluates_it_twice(monkeypatch):
    """Compiled (``torch.compiler.is_compiling()``), the block mask is torch's ``create_block_mask``: with a window
    of one block, a query block sees at most two key blocks of four. Uncompiled, every block is partial (torch's
    unfused implementation reads only ``mask_mod``), ``mask_mod`` is not evaluated to build it, and flex gives the
    same output with either mask."""
    import zoo.parts.flex as flex

    t = 4 * BLOCK
    mod = slot_mask(torch.arange(t), causal=True, window=BLOCK, key_mask=None, documents=None)
    calls = []

    def counted(b, h, q, kv):
        calls.append(1)
        return mod(b, h, q, kv)

    sparse = block_mask_of(mod, None, t, t, torch.device("cpu"), sparse=True)
    dense = block_mask_of(counted, None, t, t, torch.device("cpu"), sparse=False)
    assert not calls, "the eager block mask evaluated mask_mod"
    assert int(dense.kv_num_blocks.sum()) == 16 and dense.full_kv_num_blocks is None
    seen = sparse.kv_num_blocks + (0 if sparse.full_kv_num_blocks is None else sparse.full_kv_num_blocks)
    assert seen.flatten().tolist() == [1, 2, 2, 2], "the compiled block mask skips no block the window hides"
    made = []
    record = lambda *args, sparse: made.append(sparse) or block_mask_of(*args, sparse=sparse)  # noqa: E731
    monkeypatch.setattr(flex, "block_mask_of", record)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    q, k, v = torch.randn(3, 1, 2, t, 4, dtype=torch.float64)
    with torch.no_grad():
        compiled_mask = flex_attend(q, k, v, mask_mod=mod)
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
        eager_mask = flex_attend(q, k, v, mask_mod=mod)
    assert made == [True, False]
    torch.testing.assert_close(eager_mask, compiled_mask, rtol=0, atol=0)


@pytest.mark.parametrize(("attn", "pos"), CASES[1:4:2])
def test_flex_decodes_with_a_cache_as_its_full_forward(attn, pos):
    """Cached decoding through flex (a 3-token prompt, a 2-token chunk, then single tokens) equals its full forward
    at every real position, with left padding, and the full forward equals math's."""
    flex, math_ = pair(attn, pos)
    x, mask = torch.randn(B, T, TINY["d_model"], dtype=torch.float64), key_mask()
    with torch.no_grad():
        full = flex(x, key_mask=mask)
        cache, steps = LayerState(), []
        for start, end in ((0, 3), (3, 5), (5, 6), (6, 7)):
            steps.append(flex(x[:, start:end], key_mask=mask[:, :end], cache=cache))
        real = mask[..., None]  # a padding query's output (uniform weights over the call's keys) depends on them
        torch.testing.assert_close(torch.cat(steps, dim=1) * real, full * real, rtol=0, atol=1e-10)
        torch.testing.assert_close(full, math_(x, key_mask=mask), rtol=0, atol=1e-10)


def test_flex_cross_attention_equals_math():
    """A decoder block's cross-attention takes the block's backend: flex with a memory mask gives math's output."""
    cross = []
    for backend in ("flex", "math"):
        torch.manual_seed(1)
        cfg = {**TINY, "placement": "pre", "norm": "layernorm", "pos": "none", "mlp": "gelu", "cross_attention": True,
               "attn": {"name": "gqa", "backend": backend}}  # fmt: skip
        cross.append(build_block(cfg).double().eval())
    cross[1].load_state_dict(cross[0].state_dict())
    x, memory = torch.randn(2, 4, TINY["d_model"], dtype=torch.float64), torch.randn(2, 6, TINY["d_model"]).double()
    memory_mask = torch.ones(2, 6, dtype=torch.bool)
    memory_mask[1, 4:] = False
    with torch.no_grad():
        got, want = (b(x, memory=memory, memory_mask=memory_mask) for b in cross)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    ("cfg", "field", "allowed"),
    [
        ({"dropout": 0.1}, "block.attn.backend", "sdpa or math with block.dropout=0.1"),
        ({"attn": {"name": "mha", "softcap": 2.0, "backend": "sdpa"}}, "block.attn.softcap", "math or flex"),
        ({"attn": {"name": "gated_deltanet", "backend": "flex"}}, "block.attn.backend", "flex"),
    ],
)
def test_flex_is_refused_by_name_where_it_cannot_compute(cfg, field, allowed):
    """Dropout (FlexAttention has none), a linear mixer's backend; and softcap names flex as an alternative."""
    full = {**TINY, "placement": "pre", "norm": "layernorm", "pos": "none", "mlp": "gelu",
            "attn": {"name": "mha", "backend": "flex"}, **cfg}  # fmt: skip
    with pytest.raises(ConfigError, match=field) as error:
        build_block(full)
    assert allowed in str(error.value)


def test_flex_refuses_to_train_on_cpu():
    """torch has no FlexAttention backward on CPU: a forward that would need one is refused, naming the option."""
    (flex,) = pair({"name": "mha"}, backends=("flex",))
    with pytest.raises(ConfigError, match="block.attn.backend.*sdpa or math to train on CPU"):
        flex.train()(torch.randn(1, 3, TINY["d_model"], dtype=torch.float64))


@pytest.mark.slow
def test_compiled_flex_equals_math():
    """torch.compile(fullgraph=True) turns flex into one generated kernel (inductor, C++ on CPU): with a window, a
    soft-cap, an ALiBi bias, left padding and documents it computes math's output (float32). On CPU the kernel is
    compiled with the mask's tensors as the compiled function's inputs (inductor's CPU template takes no tensor
    made inside the compiled graph in a mask), and without a sink (it returns no log-sum-exp there)."""

    def kernel(q, k, v, slots, real, same, empty, bias):
        mod = slot_mask(slots, causal=True, window=3, key_mask=real, documents=same)
        return flex_attend(q, k, v, mask_mod=mod, batched=True, empty=empty, bias=bias, softcap=2.0)

    torch.manual_seed(0)
    q, (k, v) = torch.randn(B, 4, T, 8), torch.randn(2, B, 2, T, 8)
    slots, real = torch.arange(T), key_mask()
    same = Documents(IDS).same(slots, T)
    bias = -torch.rand(4, 1, 1) * (slots[:, None] - slots).abs()  # ALiBi's, slopes drawn
    seen = allowed_mask(slots, slots, True, real, 3) & same
    empty = ~seen.any(-1)[:, 0]
    assert empty.any(), "a query that sees no key is part of the check"
    with torch.no_grad():
        got = torch.compile(kernel, fullgraph=True)(q, k, v, slots, real, same, empty, bias)
    want = attend(q, k, v, additive(seen, bias, q.dtype), is_causal=False, backend="math", softcap=2.0)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_a_run_with_flex_on_cpu_is_refused_by_its_config_before_any_tensor_work(tmp_path, monkeypatch):
    """zoo-train with the flex backend on this CPU fails on the config, naming the option: no forward runs."""
    from helpers import tiny

    import zoo.parts.flex
    from zoo.lab.training.run import run

    def called(*args, **kwargs):
        raise AssertionError("FlexAttention ran before the config was refused")

    monkeypatch.setattr(zoo.parts.flex, "flex_attend", called)
    summary = run(tiny("block.attn.backend=flex"), tmp_path)
    assert summary["status"] == "failed"
    assert "block.attn.backend='flex': sdpa or math to train on CPU" in summary["error"]


def test_the_contracts_direct_flex_call_computes_the_traced_call_and_traces_nothing():
    """zoo.testing.contract.flex_without_dynamo: torch's unfused implementation called directly gives the output of the
    call through Dynamo's trace, to the bit, where that call traces anew (a soft-cap no other call uses: a constant
    Dynamo guards on); it traces nothing, and the switch is off again after it, an error inside included."""
    from torch._dynamo.utils import counters
    from torch.nn.attention import flex_attention as torch_flex

    from zoo.testing.contract import flex_without_dynamo

    flex, _ = pair({"name": "gqa", "window": 3, "softcap": 2.75}, "alibi")
    x, mask = torch.randn(B, T, TINY["d_model"], dtype=torch.float64), key_mask()
    with torch.no_grad():
        traces = counters["stats"]["unique_graphs"]
        with flex_without_dynamo():
            direct = flex(x, key_mask=mask)
        assert counters["stats"]["unique_graphs"] == traces, "the direct call traced with Dynamo"
        traced = flex(x, key_mask=mask)
        assert counters["stats"]["unique_graphs"] > traces, "the default call did not trace: nothing was compared"
    assert torch.equal(direct, traced)
    with pytest.raises(RuntimeError), flex_without_dynamo():
        raise RuntimeError
    assert torch_flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG is False
