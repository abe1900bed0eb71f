"""The part interface (zoo.core.interface): every hook a part may define, read through one place; the
cross-attention an attention declares (or the refusal when it declares none); one norm builder; the
attention kernels in their own module."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import registered
from torch import nn

import zoo
from zoo import ATTENTIONS, NORMS, ConfigError, build_block, check_combination
from zoo.core.dims import BlockDims
from zoo.core.errors import IncompatibleParts
from zoo.core.interface import DEFAULTS, HOOKS, PROTOCOLS, defines, every_part_error, hook, hook_errors
from zoo.parts import kernels, logits
from zoo.parts.attention import Attention
from zoo.parts.norms import LayerNorm, RMSNorm, build_norm
from zoo.parts.positions import Position
from zoo.testing.combos import TINY

ZOO = Path(zoo.__file__).parent


def block_cfg(**axes: Any) -> dict[str, Any]:
    return {**TINY, "placement": "pre", "norm": "layernorm", "attn": "mha", "pos": "none", "mlp": "gelu", **axes}


# --- The interface -----------------------------------------------------------------------------------


def test_every_registered_part_matches_its_axis_protocol():
    assert every_part_error() == []
    assert set(PROTOCOLS) == {"placement", "norm", "attn", "pos", "mlp", "residual"}


def test_every_hook_has_a_docstring_or_a_comment_and_the_known_ones_are_there():
    assert {"needs", "provides", "conflicts", "check", "check_tp", "aux_losses", "active_parameters"} <= HOOKS
    assert {"cross_attention", "shares_block_norm", "state_size", "tp_plan", "contract_exceptions"} <= HOOKS
    source = (ZOO / "core" / "interface.py").read_text()
    for name in HOOKS:  # a method has a docstring; an attribute a #: comment on the line above it
        declared = re.search(rf"#:[^\n]*\n(?:    #:[^\n]*\n)*    {name}: |def {name}\([^)]*\)[^:]*:\n\s+\"\"\"", source)
        assert declared, f"hook {name} is not documented in zoo/core/interface.py"


class BadNorm(nn.Module):
    """A norm whose hooks do not match the protocol."""

    needs = ["embedding"]  # a list, not {need: why}

    @classmethod
    def check(cls, dims: BlockDims) -> None:  # cannot take the options (eps)
        pass

    def tp_plan(self) -> dict:  # takes no sequence_parallel
        return {}

    def __init__(self, dims: BlockDims, *, eps: float = 1e-5) -> None:
        super().__init__()


class BadAttention(nn.Module):
    """An attention whose hooks do not match the protocol."""

    shares_block_norm = "yes"

    def cross_attention(self, dims):  # noqa: ANN001, ANN201  (an instance method, not a classmethod)
        return None

    def state_size(self, length: int, batch: int) -> int:  # one argument too many
        return length

    def __init__(self, dims: BlockDims, position: Position) -> None:
        super().__init__()


@pytest.fixture
def bad_parts():
    with registered((NORMS, "badnorm", BadNorm), (ATTENTIONS, "badattn", BadAttention)):
        yield


def test_a_hook_with_a_wrong_signature_is_reported_with_the_part_and_the_hook(bad_parts):
    errors = every_part_error()
    assert len(errors) == 6, errors
    for label in (
        "norm badnorm: hook needs: must be Mapping[str, str], got list",
        "norm badnorm: hook check: check(cls, dims: 'BlockDims') -> 'None' cannot be called as check(cls, dims",
        "norm badnorm: hook tp_plan: tp_plan(self) -> 'dict' cannot be called as tp_plan(self, sequence_parallel",
        "attn badattn: hook shares_block_norm: must be bool, got str",
        "attn badattn: hook cross_attention: must be a classmethod cross_attention(cls, dims",
        "attn badattn: hook state_size: state_size(self, length: 'int', batch: 'int')",
    ):
        assert any(error.startswith(label) for error in errors), (label, errors)


def test_the_check_is_made_with_the_parts_own_options():
    class Fine(nn.Module):
        @classmethod
        def check(cls, dims: BlockDims, *, eps: float) -> None:  # names its one option: fine
            pass

    assert hook_errors("norm", Fine, {"eps": 1e-5}) == []
    assert hook_errors("norm", Fine, {"eps": 1e-5, "gain": 1.0})[0].startswith("norm Fine: hook check:")


def test_a_hook_nobody_defines_reads_its_default_defined_once():
    class Bare(nn.Module):
        pass

    assert hook(Bare, "needs") == {} and hook(Bare, "provides") == frozenset() and hook(Bare, "conflicts") == {}
    assert hook(Bare, "aux_losses") == {} and hook(Bare, "uses_norm") is True
    assert hook(Bare, "check")(BlockDims(), anything=1) is None
    assert hook(Bare, "cross_attention")(BlockDims()) is None
    assert hook(Bare(), "active_parameters")() is None and hook(Bare(), "causal") is True
    assert not defines(Bare, "needs") and defines(Position, "needs")
    assert hook(nn.Linear(2, 2), "rotated") is None
    with pytest.raises(KeyError, match="not a part hook"):
        hook(Bare, "neds")
    with pytest.raises(AttributeError, match="final_norm"):
        hook(Bare, "final_norm")  # no default: every placement says
    assert "final_norm" not in DEFAULTS


def test_code_reads_hooks_only_through_the_interface():
    """No getattr/hasattr of a hook name anywhere in zoo but zoo/core/interface.py."""
    names = "|".join(sorted(HOOKS))
    pattern = re.compile(rf"(getattr|hasattr)\([^)]*[\"']({names})[\"']")
    found = [
        f"{path.relative_to(ZOO)}:{i}: {line.strip()}"
        for path in ZOO.rglob("*.py")
        if path.name != "interface.py"
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []


# --- Cross-attention: declared by the attention, or refused ----------------------------------------


@pytest.mark.parametrize("attn", ["mla", "linear"])
def test_an_attention_without_cross_attention_is_refused_by_name(attn, monkeypatch):
    built = []
    monkeypatch.setattr(torch.nn.Linear, "__init__", lambda *a, **k: built.append(1))  # no tensor work either
    message = check_combination(block_cfg(attn=attn, cross_attention=True), "model")
    assert message == (
        f"block.cross_attention=True: attn={attn} has no cross-attention (its class declares none); "
        "use attn=mha|gqa|mqa with block.cross_attention=true"
    )
    with pytest.raises(IncompatibleParts, match=f"attn={attn} has no cross-attention") as error:
        build_block(block_cfg(attn=attn, cross_attention=True))
    assert error.value.field == "block.cross_attention" and built == []
    assert check_combination(block_cfg(attn=attn), "model") is None  # without cross-attention it builds


def test_a_seq2seq_model_refuses_it_too():
    with pytest.raises(ConfigError, match="block.cross_attention=True: attn=linear has no cross-attention"):
        zoo.build_seq2seq(zoo.compose(["attn=linear", "block.d_model=16", "block.n_heads=2"]))


@pytest.mark.parametrize(("attn", "kv_heads"), [("mha", 4), ("gqa", 2), ("mqa", 1)])
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_softmax_attentions_keep_their_cross_attention(attn, kv_heads, backend):
    block = build_block(block_cfg(attn={"name": attn, "backend": backend}, cross_attention=True))
    cross = block.cross_attn
    assert type(cross).__name__ == "CrossAttention" and cross.backend == backend and cross.n_kv_heads == kv_heads
    d_head = TINY["d_model"] // TINY["n_heads"]
    shapes = {name: tuple(p.shape) for name, p in cross.named_parameters()}
    assert shapes["q.weight"] == (TINY["d_model"], TINY["d_model"])
    assert shapes["kv.weight"] == (2 * kv_heads * d_head, TINY["d_model"])
    assert len(block.placement.norms) == 3


def test_an_attention_declaring_its_own_cross_attention_gets_it():
    class Mine(Attention):
        @classmethod
        def cross_attention(cls, dims: BlockDims, **options: Any):  # noqa: ANN206
            return lambda: nn.Linear(dims.d_model, dims.d_model)

    ATTENTIONS.register("mine_cross")(Mine)
    try:
        assert every_part_error() == []
        assert isinstance(build_block(block_cfg(attn="mine_cross", cross_attention=True)).cross_attn, nn.Linear)
        message = check_combination(block_cfg(attn="mla", cross_attention=True))
        assert "use attn=mha|gqa|mqa|mine_cross with" in message
    finally:
        ATTENTIONS.unregister("mine_cross")


# --- One norm builder ------------------------------------------------------------------------------


def test_build_norm_takes_its_defaults_then_the_shared_options_it_has():
    dims = BlockDims(d_model=8)
    assert build_norm("rmsnorm", dims).eps == 1e-6
    assert build_norm("rmsnorm", dims, shared={"eps": 1e-3, "elementwise": True}).eps == 1e-3  # unknown key left out
    norm = build_norm("layernorm", dims, width=4, shared={"eps": 1e-2})
    assert isinstance(norm, LayerNorm) and norm.normalized_shape == (4,) and norm.eps == 1e-2
    assert isinstance(build_norm("none", dims), nn.Identity)


def test_every_norm_of_a_model_comes_from_build_norm(monkeypatch):
    made = []
    real = build_norm

    def counting(name: str, dims: BlockDims, **kwargs: Any) -> nn.Module:
        made.append(name)
        return real(name, dims, **kwargs)

    for module in ("zoo.parts.norms", "zoo.parts.attention", "zoo.parts.latent_attention", "zoo.assembly.spec"):
        monkeypatch.setattr(f"{module}.build_norm", counting, raising=False)
    overrides = ["block.d_model=16", "block.n_heads=2", "model.n_layers=1", "norm=rmsnorm"]
    qk = zoo.build_model(zoo.compose([*overrides, "block.attn.qk_norm=layernorm"]))
    n_norms = sum(isinstance(m, (RMSNorm, LayerNorm)) for m in qk.modules())
    assert sorted(made) == ["layernorm", "layernorm", "rmsnorm", "rmsnorm", "rmsnorm"] and n_norms == 5
    made.clear()
    mla = zoo.build_model(zoo.compose([*overrides, "attn=mla", "block.attn.q_rank=4"]))
    assert len(made) == sum(isinstance(m, RMSNorm) for m in mla.modules()) == 5  # 2 block, 2 latent, final


def test_latent_norms_keep_their_own_defaults_where_the_qk_norm_shares_the_block_norms():
    """The documented choice: a qk-norm normalizes heads of the residual stream and takes block.norm's
    options; latent attention's latent norms normalize a latent and take their own defaults."""
    cfg = block_cfg(norm={"name": "rmsnorm", "eps": 1e-3})
    qk = build_block({**cfg, "attn": {"name": "mha", "qk_norm": "rmsnorm"}})
    assert qk.attn.q_norm.eps == qk.attn.k_norm.eps == 1e-3
    mla = build_block({**cfg, "attn": {"name": "mla", "q_rank": 4}})
    assert mla.attn.kv_norm.eps == mla.attn.q_norm.eps == 1e-6 and mla.placement.norms[0].eps == 1e-3


# --- The kernels' module ---------------------------------------------------------------------------


def test_the_attention_kernels_live_in_their_own_module():
    for name in ("allowed_mask", "additive", "attend", "attend_at"):
        assert getattr(kernels, name).__module__ == "zoo.parts.kernels"
    defined = [
        p
        for p in (ZOO / "parts").glob("*.py")
        if re.search(r"^def (attend|additive|allowed_mask)\b", p.read_text(), re.M)
    ]
    assert [p.name for p in defined] == ["kernels.py"]


# --- Attention logits: what each attention's kernel scores, or a declared None ---------------------


def attention_cases() -> list[tuple[str, dict[str, Any]]]:
    """Every registered attention, as registered and in each of its variants."""
    return [(p.name, opts) for p in ATTENTIONS.parts() for opts in ({}, *p.variants.values())]


def kernel_scores(block: nn.Module, x: torch.Tensor, monkeypatch) -> torch.Tensor | None:
    """The pre-softmax scores the block's attention computes in its forward, from what it hands the kernel
    (q, k, scale, softcap, mask), rebuilt here: (b, h, t, t), blocked keys -inf; None: it calls no kernel."""
    seen = []
    real = kernels.attend
    monkeypatch.setattr(
        kernels, "attend", lambda q, k, v, mask, **kw: seen.append((q, k, mask, kw)) or real(q, k, v, mask, **kw)
    )
    block.attn(x)
    monkeypatch.setattr(kernels, "attend", real)
    if not seen:
        return None
    ((q, k, mask, kw),) = seen
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1).double()
    scale = kw["scale"] if kw.get("scale") is not None else q.shape[-1] ** -0.5
    scores = q.double() @ k.transpose(-1, -2) * scale
    if kw.get("softcap") is not None:
        scores = kw["softcap"] * torch.tanh(scores / kw["softcap"])
    t = scores.shape[-1]
    if kw["is_causal"]:
        mask = torch.zeros(t, t).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)
    if mask is not None:
        blocked = mask <= torch.finfo(mask.dtype).min / 4
        scores = (scores + mask.double().masked_fill(blocked, 0)).masked_fill(blocked, -torch.inf)
    return scores


@pytest.mark.parametrize(("attn", "options"), attention_cases(), ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("pos", ["none", "rotary", "alibi"])
def test_every_attention_declares_the_logits_its_kernel_scores_or_none(attn, options, pos, monkeypatch):
    """The ``attention_logits`` hook gives the scores the forward's kernel softmaxes (after qk-norm,
    positions, the score scale, softcap, bias and mask); a part calling no softmax kernel declares None.
    A score scale set on the part (muP's 1/d) is followed; a planted scale in the hook is caught."""
    cfg = block_cfg(attn={"name": attn, **options}, pos=pos)
    if check_combination(cfg) is not None:
        pytest.skip(check_combination(cfg))
    torch.manual_seed(0)
    block = build_block(cfg).eval()
    x = torch.randn(2, 6, TINY["d_model"]) * 3
    with torch.no_grad():
        got, want = hook(block.attn, "attention_logits")(x), kernel_scores(block, x, monkeypatch)
        assert (got is None) == (want is None), attn
        if got is None:
            return
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
        block.attn.score_scale = 1 / block.attn.d_head  # the part's scale: forward and the hook alike
        torch.testing.assert_close(
            hook(block.attn, "attention_logits")(x).double(), kernel_scores(block, x, monkeypatch), rtol=1e-5, atol=1e-5
        )
        block.attn.score_scale = None
        monkeypatch.setattr(logits, "scaled", lambda s, d, scale: s / d)  # planted: 1/d for the kernel's 1/sqrt(d)
        with pytest.raises(AssertionError):
            torch.testing.assert_close(hook(block.attn, "attention_logits")(x).double(), want, rtol=1e-5, atol=1e-5)
