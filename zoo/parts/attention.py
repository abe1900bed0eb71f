"""Self-attention from projections and tensor ops: MHA, GQA and MQA in one class, and its KV cache
(its decoding state).

The kernels it computes with (masks, SDPA or explicit math) are in :mod:`zoo.parts.kernels`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from zoo.core import tp
from zoo.core.channel import Channel, ChannelUse
from zoo.core.dims import BlockDims
from zoo.core.errors import ConfigError
from zoo.core.registry import ATTENTIONS, NORMS
from zoo.core.reshape import rearrange, reduce, repeat
from zoo.core.tp import Plan, has_plan, heads_norm, local, prefixed, row_output
from zoo.parts.canon import KERNEL, Canon
from zoo.parts.cross_attention import CrossAttention
from zoo.parts.documents import Documents
from zoo.parts.flex import check_flex
from zoo.parts.head_outputs import (
    Gate,
    Sink,
    build_gate,
    build_sink,
    exclude_own_value,
    gated,
    output_flops,
    output_plan,
)
from zoo.parts.kernels import Backend, attend_at
from zoo.parts.logits import masked_logits
from zoo.parts.norms import build_norm, ungated
from zoo.parts.positions import Position
from zoo.parts.qkv_rows import fuse_qkv, scale_rows, split_qkv  # noqa: F401  (fuse_qkv, split_qkv: re-exported)
from zoo.parts.state import KVCache, LayerState, SharedKV, query_slots  # noqa: F401  (KVCache: re-exported)
from zoo.parts.values import ValueGate, ValueResidual, build_mix

QKNormScope = Literal["head", "all_heads"]


#: The output options' contract variants, on every softmax attention (zoo.parts.head_outputs).
OUTPUT_VARIANTS: dict[str, dict[str, Any]] = {
    "headgate": {"gate": "headwise"},
    "gate": {"gate": "elementwise"},
    "sink": {"sink": "learned"},
    "xsa": {"xsa": True},
}


@ATTENTIONS.register(
    "mha",
    summary="Multi-head attention: one key/value head per query head (n_kv_heads = n_heads).",
    formula="softmax(q k^T / sqrt(d_head) + mask) v per head; out(concat heads)",
    reference="Vaswani et al. 2017, Attention Is All You Need, arXiv:1706.03762",
    # Tiny values, so the contract suite's 6-token sequences exercise them.
    variants={
        "window": {"window": 3},
        "softcap": {"softcap": 2.0, "backend": "math"},
        "qknorm": {"qk_norm": "rmsnorm"},
        "qknorm_all": {"qk_norm": "rmsnorm", "qk_norm_scope": "all_heads"},
        "headdim": {"head_dim": 8, "scale_dim": 6},  # heads wider than d_model / n_heads, scores at 6^-0.5
        **OUTPUT_VARIANTS,
        "vres": {"value_residual": "learned"},  # in a model: layer 1 mixes layer 0's values
    },
    n_kv_heads=None,
)
class Attention(nn.Module):
    """Multi-head causal self-attention with ``n_kv_heads`` key/value heads shared by groups of queries.

    Parameters (a stable API): ``qkv`` (the fused q, k, v projection) and ``out``. ``qkv``'s rows are
    grouped by key/value head (Megatron-LM's layout): for each of the n_kv_heads groups, its
    r = n_heads / n_kv_heads query heads, then its key head, then its value head, d_head rows each.
    Query head h = g * r + i reads key/value head g. A contiguous slice of whole groups thus holds
    the queries and the keys and values they read, which is what a tensor-parallel shard needs;
    :func:`fuse_qkv` and :func:`split_qkv` convert from and to separate q, k, v weights.

    Backends: ``sdpa`` (torch's fused scaled_dot_product_attention), ``math`` (explicit scores,
    mask, float32 softmax, weights @ v) and ``flex`` (torch's FlexAttention: causality, the window, padding and
    documents as one block mask, ALiBi and the soft-cap as score modifications; zoo.parts.flex).

    Options: ``head_dim`` (each head's width, d_model / n_heads by default: Gemma's, Qwen3-Next's and gpt-oss's
    heads are wider or narrower; the assembly builds the position part at that width too), ``scale_dim`` (the
    scores are scaled by scale_dim^-0.5 instead of d_head^-0.5: Gemma 3's ``query_pre_attn_scalar``),
    ``qk_norm`` (a registered norm applied to each head's queries and keys before the
    position part; parameters ``q_norm``, ``k_norm``; built with the options of ``block.norm`` it
    shares, such as ``eps``, passed by the builder as ``norm_options``), ``qk_norm_scope`` (``head``: over
    each head's d_head features; ``all_heads``: over all the queries' n_heads d_head features jointly, and the
    keys' n_kv_heads d_head, as OLMo 2 and 3), ``window`` (sliding-window
    attention: each query sees at most ``window`` keys, itself included; a float mask keeps SDPA on its
    fused kernels), ``softcap`` (scores become softcap * tanh(scores / softcap); math and flex backends), and
    the output options of :mod:`zoo.parts.head_outputs`: ``gate`` (``headwise`` or ``elementwise``: heads'
    outputs times sigmoid(x W_g), parameter ``gate``), ``sink`` (``learned``: a logit per head in the
    softmax's denominator, parameter ``sink``) and ``xsa`` (each head's output less its component along
    its own value), and ``value_residual`` (in a stack: every layer after the first mixes layer 0's values into
    its own, :mod:`zoo.parts.values`; parameter ``value_mix``).

    In a stack (zoo.core.channel) the attention may also add a value embedding to its values
    (``model.value_embeddings``; parameter ``value_gate``).
    """

    #: Built as ``Attention(dims, position, block_norm_options, ...)``: its qk-norm shares block.norm's options.
    shares_block_norm: ClassVar[bool] = True
    #: Canon site b: a canon layer on q, k and v after qk-norm, before the rotation (``canon``).
    canon_sites: ClassVar[frozenset[str]] = frozenset({"b"})
    doc_reset: ClassVar[str | None] = "a block-diagonal causal mask: a query sees only its own document's keys"

    @classmethod
    def cross_attention(cls, dims: BlockDims, **options: Any) -> Callable[[], nn.Module]:
        """A decoder block's cross-attention: softmax multi-head attention to memory with this
        attention's key/value heads and backend (:class:`~zoo.parts.cross_attention.CrossAttention`)."""
        return partial(CrossAttention, dims, n_kv_heads=options["n_kv_heads"], backend=options["backend"])

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        n_kv_heads, backend, qk_norm = options["n_kv_heads"], options["backend"], options["qk_norm"]
        scope = options["qk_norm_scope"]
        window, softcap = options["window"], options["softcap"]
        for key in ("head_dim", "scale_dim"):
            if options[key] is not None and options[key] < 1:
                raise ConfigError(f"block.attn.{key}", options[key], "must be a positive integer, or null")
        kv = dims.n_heads if n_kv_heads is None else n_kv_heads
        if kv < 1 or dims.n_heads % kv:
            divisors = [d for d in range(1, dims.n_heads + 1) if dims.n_heads % d == 0]
            raise ConfigError(
                "block.attn.n_kv_heads",
                n_kv_heads,
                f"must divide n_heads={dims.n_heads}: one of {divisors} (or null for n_heads)",
            )
        if qk_norm != "none" and qk_norm not in NORMS:
            raise ConfigError("block.attn.qk_norm", qk_norm, f"none or a registered norm: {', '.join(NORMS.names())}")
        if scope != "head" and qk_norm == "none":
            raise ConfigError("block.attn.qk_norm_scope", scope, "head unless block.attn.qk_norm names a norm")
        if window is not None and window < 1:
            raise ConfigError("block.attn.window", window, "must be a positive integer, or null for no window")
        if window is not None and dims.max_len is not None and window >= dims.max_len:
            raise ConfigError(
                "block.attn.window",
                window,
                f"must be smaller than block.max_len={dims.max_len} (a window over the whole context is no window)",
            )
        if softcap is not None and not softcap > 0:
            raise ConfigError("block.attn.softcap", softcap, "must be > 0, or null for no cap")
        if softcap is not None and backend == "sdpa":
            raise ConfigError(
                "block.attn.softcap", softcap,
                "needs block.attn.backend=math or flex (SDPA has no hook to cap the scores)",
            )  # fmt: skip
        check_flex(dims, backend)

    @classmethod
    def check_tp(cls, dims: BlockDims, tp: int, **options: Any) -> None:
        kv = dims.n_heads if options["n_kv_heads"] is None else options["n_kv_heads"]
        if dims.n_heads % tp or kv % tp:
            raise ConfigError(
                "parallel.tp",
                tp,
                f"must divide block.n_heads={dims.n_heads} and the key/value heads (block.attn.n_kv_heads={kv}): "
                "each rank holds whole groups of query heads with the key/value head they read",
            )
        if options["value_residual"] != "none":
            raise ConfigError(
                "block.attn.value_residual",
                options["value_residual"],
                f"none under parallel.tp={tp}: its weights mix every key/value head, which no rank holds whole",
            )
        qk_norm = options["qk_norm"]
        if qk_norm != "none" and options["qk_norm_scope"] != "head":
            raise ConfigError(
                "block.attn.qk_norm_scope",
                options["qk_norm_scope"],
                f"head under parallel.tp={tp}: a norm over all heads' features needs every head, which no rank holds",
            )
        if qk_norm != "none" and not has_plan(NORMS.get(qk_norm).cls):
            raise ConfigError(
                "block.attn.qk_norm", qk_norm, f"has no tensor-parallel plan, so it cannot run under parallel.tp={tp}"
            )

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        """Column-wise ``qkv`` (whole key/value groups per rank: the grouped layout) and output gate (its
        rows in head order), row-wise ``out``; per-head q/k norms and sinks sharded on heads; the position
        part's own plan. Under sequence parallelism the input is gathered from the sequence shards and the
        output reduce-scattered back to them."""
        plan: Plan = {
            "qkv": tp.ColwiseParallel(),
            "out": row_output(sequence_parallel),
            **prefixed("position", self.position.tp_plan(sequence_parallel)),  # type: ignore[attr-defined]
        }
        if self.q_norm is not None:
            plan["q_norm"] = plan["k_norm"] = heads_norm()
        return {**plan, **output_plan(self, sequence_parallel)}

    def __init__(
        self,
        dims: BlockDims,
        position: Position,
        norm_options: Mapping[str, Any] | None = None,
        *,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        scale_dim: int | None = None,
        backend: Backend = "sdpa",
        qk_norm: str = "none",
        qk_norm_scope: QKNormScope = "head",
        window: int | None = None,
        softcap: float | None = None,
        gate: Gate = "none",
        sink: Sink = "none",
        xsa: bool = False,
        value_residual: ValueResidual = "none",
    ) -> None:
        super().__init__()
        if head_dim is not None:  # the assembly has set it already; a direct build gets it here
            dims = replace(dims, head_dim=head_dim)
        self.n_heads = dims.n_heads
        self.n_kv_heads = dims.n_heads if n_kv_heads is None else n_kv_heads
        self.d_head = dims.d_head
        #: μP's score multiplier (sqrt(d_head_base) / d_head), None: the standard 1 / sqrt(d_head); the kernel's is
        #: :meth:`kernel_scale`, which ``scale_dim`` changes too.
        self.score_scale: float | None = None
        self.score_features = self.d_head  # what q . k sums over (μP scales by it)
        self.scale_dim = scale_dim
        self.causal = dims.causal
        self.dropout = dims.dropout
        self.backend = backend
        self.position = position
        width = (self.n_heads + 2 * self.n_kv_heads) * self.d_head
        self.qkv = nn.Linear(dims.d_model, width, bias=dims.bias)
        self.out = nn.Linear(self.n_heads * self.d_head, dims.d_model, bias=dims.bias)
        self.window, self.softcap = window, softcap
        self.q_norm = self.k_norm = None
        self.qk_norm_scope = qk_norm_scope
        if qk_norm != "none":  # over d_head features (or all heads'), sharing the block norm's options (eps)
            joint = qk_norm_scope == "all_heads"
            for name, heads in (("q_norm", self.n_heads), ("k_norm", self.n_kv_heads)):
                features = heads * self.d_head if joint else self.d_head
                setattr(self, name, build_norm(qk_norm, dims, width=features, shared=ungated(norm_options or {})))
        self.gate, self.sink, self.xsa = build_gate(gate, dims), build_sink(sink, self.n_heads), xsa
        self.output_options = {"gate": gate, "sink": sink, "xsa": xsa}
        self.canon = Canon(width, "b") if "b" in dims.canon_sites else None
        self.dims, self.value_residual = dims, value_residual
        self.value_width = self.n_kv_heads * self.d_head
        #: Set by join_channel in a stack: whether it writes its values (layer 0 with value residual), the
        #: mixing of layer 0's values into its own (later layers), the gate of its value embedding.
        self.writes_first = False
        self.value_mix: nn.Module | None = None
        self.value_gate: ValueGate | None = None
        #: Set by a stack under model.kv_share: "writes" (a group's first layer: its keys and values to the side
        #: channel), "reads" (the group's later layers: those instead of their own, no key/value projection).
        self.kv_role: str | None = None

    def share_kv(self, role: str) -> None:
        """Under ``model.kv_share``: ``writes`` its keys and values to the side channel, or ``reads`` them there
        (its projection then makes the queries alone, ``qkv`` of n_heads d_head rows, and it has no key norm)."""
        self.kv_role = role
        if role == "reads":
            self.qkv = nn.Linear(self.dims.d_model, self.n_heads * self.d_head, bias=self.dims.bias)
            self.k_norm = None

    def join_channel(self, layer: int, provided: frozenset[str]) -> ChannelUse:
        """In a stack: a value embedding's gate where the stack provides one (``value_embedding``); with
        ``value_residual``, layer 0 writes its values (``first_values``) and every later layer builds its
        mixing and reads them; under ``model.kv_share`` (:meth:`share_kv`) the shared keys and values."""
        if self.kv_role == "writes":
            return ChannelUse({}, frozenset({"shared_keys", "shared_values"}))
        if self.kv_role == "reads":
            return ChannelUse({"shared_keys": "kv_share", "shared_values": "kv_share"})
        reads: dict[str, str] = {}
        if "value_embedding" in provided:
            self.value_gate = ValueGate(self.dims, self.n_kv_heads)
            reads["value_embedding"] = "attn"
        if self.value_residual == "none":
            return ChannelUse(reads)
        if layer == 0:
            self.writes_first = True
            return ChannelUse(reads, frozenset({"first_values"}))
        self.value_mix = build_mix(self.value_residual, self.dims, self.n_kv_heads)
        return ChannelUse({**reads, "first_values": "attn.value_residual"})

    def side_values(self, v: torch.Tensor, x: torch.Tensor, channel: Channel) -> torch.Tensor:
        """The new tokens' values v (b, g, t, d) with the value embedding added, then written (layer 0) or
        mixed with layer 0's (value residual); x: the attention's input (b, t, d_model)."""
        if self.value_gate is not None:
            v = self.value_gate(v, channel.read("value_embedding"), x)
        if self.writes_first:
            channel.write("first_values", v)
        elif self.value_mix is not None:
            v = self.value_mix(v, channel.read("first_values"), x)
        return v

    def matrix_blocks(self) -> dict[str, dict[str, torch.Tensor]]:
        """``qkv``'s rows as the query, key and value matrices (:func:`split_qkv` of its row indices);
        ``out`` is one matrix."""
        if self.kv_role == "reads":
            return {}
        q, k, v = split_qkv(torch.arange(self.qkv.out_features), self.n_heads, self.n_kv_heads)
        return {"qkv.weight": {"q": q, "k": k, "v": v}}

    def state_size(self, length: int) -> int:
        """Numbers one sample's decoding state holds after ``length`` tokens: a key and a value per
        key/value head (none where it reads an earlier layer's, ``model.kv_share``)."""
        return 0 if self.kv_role == "reads" else 2 * self.n_kv_heads * self.d_head * length

    def mixing_flops(self, seq_len: int) -> int | None:
        """Each query's scores and weighted values over the keys it sees: 6 x keys x n_heads x d_head training
        FLOPs per token (causal products not halved, as in softmax attention's count), keys = min(window,
        seq_len) with a ``window`` (2 window - 1 both sides in an encoder block), else seq_len; None where that
        is softmax attention's 6 x seq_len x d_model (no window, n_heads d_head = d_model)."""
        if self.window is None and self.n_heads * self.d_head == self.dims.d_model:
            return None
        keys = seq_len if self.window is None else min(self.window if self.causal else 2 * self.window - 1, seq_len)
        return 6 * keys * self.n_heads * self.d_head

    def kernel_scale(self) -> float | None:
        """The scores' multiplier the kernel applies (None: its 1 / sqrt(d_head)): μP's ``score_scale``, and under
        ``scale_dim`` scale_dim^-0.5 instead of d_head^-0.5 (times μP's sqrt(d_head_base / d_head) when set)."""
        if self.scale_dim is None:
            return self.score_scale
        if self.score_scale is None:
            return self.scale_dim**-0.5
        return self.score_scale * math.sqrt(self.d_head / self.scale_dim)

    def extra_flops(self, seq_len: int) -> int:
        """The output options' FLOPs per token (:func:`zoo.parts.head_outputs.output_flops`), and the value
        embedding's gate and the value residual's mixing where the stack built them (zoo.parts.values)."""
        values = sum(m.flops(self.value_width) for m in (self.value_gate, self.value_mix) if m is not None)
        return output_flops(self.n_heads, self.n_kv_heads, self.d_head, **self.output_options) + values

    def project(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        real: torch.Tensor | None = None,
        cache: LayerState | None = None,
        taps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: (b, t, d_model) -> queries (b, h, t, d), keys and values (b, g, t, d): after qk-norm, the canon
        layer (site b; ``real`` (b, t): the new tokens' padding mask, ``cache``: its decoding state, ``taps``: its
        document mask) and the
        position's rotation at ``positions`` (slots (t,) or per-sample ids (b, t))."""
        # One reshape for all heads: per key/value group g, n = r query heads + its key + its value.
        # g is n_kv_heads, or this rank's share of them under tensor parallelism (whole groups).
        group = self.n_heads // self.n_kv_heads + 2
        heads = rearrange(self.qkv(x), "b t (g n d) -> b g n t d", n=group, d=self.d_head)
        q = rearrange(heads[:, :, :-2], "b g r t d -> b (g r) t d")  # query head g * r + i
        k, v = heads[:, :, -2], heads[:, :, -1]  # (b, g, t, d) each
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.qk_normed(q, k)
        if self.canon is not None:
            q, k, v = self.canon_qkv(q, k, v, real, cache, taps)
        q, k = self.position.rotate(q, k, positions)
        return q, k, v

    def qk_normed(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The qk-norm of queries (b, h, t, d) and keys (b, g, t, d): per head over d, or over all heads jointly."""
        if self.qk_norm_scope == "head":
            return self.q_norm(q), self.k_norm(k)  # type: ignore[misc]
        joint = [norm(rearrange(x, "b h t d -> b t (h d)")) for norm, x in ((self.q_norm, q), (self.k_norm, k))]
        q, k = (rearrange(x, "b t (h d) -> b h t d", d=self.d_head) for x in joint)
        return q, k

    def canon_qkv(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, real: torch.Tensor | None, cache: LayerState | None,
        taps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The canon layer over q (b, h, t, d), k and v (b, g, t, d) as one tensor of channels in ``qkv``'s
        row order (each key/value group's query heads, then its key and its value), so that without qk-norm
        it is the layer on ``qkv``'s output."""
        group = self.n_heads // self.n_kv_heads
        heads = torch.cat([rearrange(q, "b (g r) t d -> b g r t d", r=group), k[:, :, None], v[:, :, None]], dim=2)
        mixed = self.canon(rearrange(heads, "b g n t d -> b t (g n d)"), real, cache, taps)  # type: ignore[misc]
        heads = rearrange(mixed, "b t (g n d) -> b g n t d", n=group + 2, d=self.d_head)
        return rearrange(heads[:, :, :-2], "b g r t d -> b (g r) t d"), heads[:, :, -2], heads[:, :, -1]

    @torch.no_grad()
    def clip_qk(self, gamma: torch.Tensor) -> None:
        """The ``clip_qk`` hook: head h's query rows of ``qkv`` (weight and bias) times gamma_h / sqrt(gamma_min),
        its key/value group's key rows times sqrt(gamma_min), gamma_min the least gamma over the query heads
        sharing that key (MHA: sqrt(gamma_h) each), so that head h's q . k is multiplied by gamma_h."""
        shared = reduce(gamma.float(), "(g r) -> g", "min", g=self.n_kv_heads).sqrt()  # (g,)
        query = gamma.float() / repeat(shared, "g -> (g r)", r=self.n_heads // self.n_kv_heads)
        ones = torch.ones_like(shared)
        rows = torch.cat([rearrange(query, "(g r) -> g r", g=self.n_kv_heads), shared[:, None], ones[:, None]], 1)
        factor = repeat(rows, "g n -> (g n d)", d=self.d_head)  # qkv's row order: per group r queries, key, value
        scale_rows(self.qkv, factor)

    def attention_logits(self, x: torch.Tensor) -> torch.Tensor | None:
        """Pre-softmax scores of ``x`` (b, t, d_model) as one sequence (the ``attention_logits`` hook): q k^T at
        the kernel's ``scale`` after qk-norm and positions, with the score bias, softcap and mask. -> (b, h, t, t)."""
        slots = torch.arange(x.shape[1], device=x.device)
        q, k, _ = self.project(x, slots)
        bias = self.position.score_bias(slots, slots)
        return masked_logits(q, k, scale=self.kernel_scale(), causal=self.causal, bias=bias, window=self.window,
                             softcap=self.softcap)  # fmt: skip

    def forward(self, x: torch.Tensor, *, key_mask: torch.Tensor | None = None, cache: LayerState | None = None,
                positions: torch.Tensor | None = None, channel: Channel | None = None,
                documents: Documents | None = None) -> torch.Tensor:  # fmt: skip
        """x: (b, t, d_model) -> (b, t, d_model).

        key_mask: (b, t_k) bool, True at real keys (t_k counts cached keys too).
        cache: this layer's state; its :class:`KVCache` holds the keys and values of earlier positions,
            and the new ones are written into it.
        positions: (b, t) position ids per sample, for left-padded batches; by default the query at
            cache slot ``s`` has position ``s``. The causal mask always follows slots.
        channel: the stack's side channel (zoo.core.channel), given when :meth:`join_channel` said it uses it:
            the new tokens' values take their value embedding and value residual before they are cached.
        documents: every token's document (keys included, zoo.parts.documents): a query sees its own document's.
        """
        if self.kv_role == "reads":
            if channel is None:
                raise ValueError("this attention reads an earlier layer's keys and values (model.kv_share): run it "
                                 "in its stack")  # fmt: skip
            return self.forward_shared(x, key_mask=key_mask, cache=cache, positions=positions, channel=channel,
                                       documents=documents)  # fmt: skip
        time = x.shape[1]
        state = None if cache is None else cache.mixer_state(KVCache)
        slots = query_slots(state, time, x.device)  # absolute indices of the queries (t,)
        real = None if key_mask is None or self.canon is None else key_mask.index_select(1, slots).bool()
        taps = None if documents is None or self.canon is None else documents.taps(slots, KERNEL)
        q, k, v = self.project(x, slots if positions is None else positions, real, cache, taps)
        if channel is not None:
            v = self.side_values(v, x, channel)
        own = v  # the values at the queries' own positions (XSA)
        k_positions = positions
        if state is not None:
            k, v = state.append(k, v, positions)
            k_positions = state.key_positions()
        if self.kv_role == "writes" and channel is not None:
            channel.write("shared_keys", k)
            channel.write("shared_values", v)
            channel.write("shared_new_values", own)  # the new tokens' own values, for a reader's XSA
            if k_positions is not None:
                channel.write("shared_key_positions", k_positions)
        return self.attend(q, k, v, x, own, slots, state is not None and state.static, positions, k_positions,
                           key_mask, None if documents is None else documents.same(slots, k.shape[-2]))  # fmt: skip

    def forward_shared(self, x: torch.Tensor, *, key_mask: torch.Tensor | None, cache: LayerState | None,
                       positions: torch.Tensor | None, channel: Channel,
                       documents: Documents | None = None) -> torch.Tensor:  # fmt: skip
        """As :meth:`forward` with the keys and values its group's first layer wrote (cached ones included):
        its own queries, normed and rotated as the first layer's keys were."""
        time = x.shape[1]
        state = None if cache is None else cache.mixer_state(SharedKV)
        slots = query_slots(state, time, x.device)
        q = rearrange(self.qkv(x), "b t (h d) -> b h t d", d=self.d_head)
        if self.q_norm is not None:
            joint = self.qk_norm_scope == "all_heads"
            q = rearrange(self.q_norm(rearrange(q, "b h t d -> b t (h d)")), "b t (h d) -> b h t d",
                          d=self.d_head) if joint else self.q_norm(q)  # fmt: skip
        q, _ = self.position.rotate(q, q[:, :1], slots if positions is None else positions)
        k, v = channel.read("shared_keys"), channel.read("shared_values")
        k_positions = channel.read("shared_key_positions") if "shared_key_positions" in channel else positions
        if state is not None:
            state.advance(time)
        own = channel.read("shared_new_values")
        return self.attend(q, k, v, x, own, slots, state is not None and state.static, positions, k_positions,
                           key_mask, None if documents is None else documents.same(slots, k.shape[-2]))  # fmt: skip

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor, own: torch.Tensor,
               slots: torch.Tensor, preallocated: bool, positions: torch.Tensor | None,
               k_positions: torch.Tensor | None, key_mask: torch.Tensor | None,
               same: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """The attention of queries q over keys k and values v (``same``: the document mask), then XSA (``own``:
        the values at the queries' positions), the gate and the output projection."""
        y = attend_at(
            q,
            k,
            v,
            slots=slots,
            preallocated=preallocated,
            positions=positions,
            k_positions=k_positions,
            key_mask=key_mask,
            causal=self.causal,
            position=self.position,
            backend=self.backend,
            dropout=self.dropout if self.training else 0.0,
            window=self.window,
            softcap=self.softcap,
            scale=self.kernel_scale(),
            sink=None if self.sink is None else local(self.sink),
            documents=same,
        )
        if self.xsa:
            y = exclude_own_value(y, own)
        y = gated(y, self.gate, x)
        return self.out(rearrange(y, "b h t d -> b t (h d)"))
