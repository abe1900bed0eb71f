"""Multi-head latent attention (DeepSeek-V2): keys and values come from a low-rank latent, so the
decoding state keeps that latent and one shared rotary key per token instead of every head's keys
and values."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from zoo.core import tp
from zoo.core.dims import BlockDims
from zoo.core.errors import ConfigError
from zoo.core.registry import ATTENTIONS, NORMS
from zoo.core.reshape import rearrange, repeat
from zoo.core.tp import Plan, local, prefixed, require_whole_heads, row_output
from zoo.parts.attention import OUTPUT_VARIANTS, scale_rows
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
from zoo.parts.norms import build_norm
from zoo.parts.positions import Position
from zoo.parts.state import GrowingState, LayerState, query_slots


class LatentCache(GrowingState):
    """Latent attention's decoding state: per token, the normalized latent (batch, capacity, kv_rank)
    and the rotated shared key (batch, 1, capacity, rope_dim), in preallocated buffers written in place.
    Every head's keys and values are recomputed from the latent at each step."""

    @property
    def latent(self) -> torch.Tensor | None:
        return None if self.buffers is None else self.buffers[0]

    @property
    def rope_key(self) -> torch.Tensor | None:
        return None if self.buffers is None else self.buffers[1]

    def append(
        self, latent: torch.Tensor, rope_key: torch.Tensor, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (b, t_new, kv_rank) latents and (b, 1, t_new, rope_dim) rotary keys; return views of all held."""
        latents, keys = self.write(latent, rope_key, positions=positions)
        return latents, keys


@ATTENTIONS.register(
    "mla",
    summary="Multi-head latent attention: keys and values from a kv_rank latent; the cache keeps the latent "
    "and one rotary key.",
    formula="c = norm(W_dkv x); k_h = [W_uk,h c ; rotate(W_kr x)], v_h = W_uv,h c; "
    "q_h = [W_uq,h c_q ; rotate(W_qr,h c_q)], c_q = norm(W_dq x) or x; softmax(q k^T / sqrt(d_head + r)) v, "
    "r = rope_dim (default d_head) the rotary features of W_kr x and W_qr,h c_q",
    reference="DeepSeek-AI 2024, DeepSeek-V2, arXiv:2405.04434",
    variants={"qrank": {"q_rank": 8}, "ropedim": {"rope_dim": 2}, **OUTPUT_VARIANTS},
)
class LatentAttention(nn.Module):
    """Multi-head latent attention: every head's key and value are up-projected from one shared latent
        of ``kv_rank`` features; the position part acts on a separate shared key of ``rope_dim`` features
        (decoupled rotary key; default d_head), so the latent itself carries no position.

        Each head scores with a query of d_head + rope_dim features, a "content" part of d_head matching the key
        up-projected from the latent and a "position" part of rope_dim matching the shared rotary key (rotated by
        the ``pos`` axis, built at rope_dim features; with a position part that does not rotate it is an
        unrotated shared key). Scale 1/sqrt(d_head + rope_dim) (DeepSeek-V3's qk_head_dim^-0.5: its
        qk_nope_head_dim is d_head, its qk_rope_head_dim rope_dim).
        Score biases (``pos=alibi``) apply as for multi-head attention.

        ``kv_rank``: latent width (default 4 d_head, DeepSeek-V2's 512 for heads of 128). ``q_rank``: queries
        through a latent of that width too (null: projected directly). ``latent_norm``: the norm on the
        latents (DeepSeek-V2: RMSNorm), ``none`` or a registered norm, built with its own defaults
    (:func:`zoo.parts.norms.build_norm`; unlike the qk-norm of :class:`~zoo.parts.attention.Attention`,
    it shares no option with ``block.norm``: the latent is not the residual stream). The decoding state
        (:class:`LatentCache`) holds kv_rank + rope_dim numbers per token, against 2 x n_heads x d_head
        for multi-head attention.

        Parameters: ``kv_down`` (d_model -> kv_rank latent, then the rope_dim rotary key), ``kv_norm``,
        ``kv_up`` (kv_rank -> per head: d_head key, d_head value), ``q`` (or ``q_down``, ``q_norm``,
        ``q_up``; per head: d_head content, rope_dim position features) and ``out``.

        The output options ``gate``, ``sink`` and ``xsa`` act as in :class:`~zoo.parts.attention.Attention`
        (:mod:`zoo.parts.head_outputs`); XSA removes each head's own up-projected value.
    """

    doc_reset: ClassVar[str | None] = "a block-diagonal causal mask: a query sees only its own document's keys"

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        for name in ("kv_rank", "q_rank"):
            if options[name] is not None and options[name] < 1:
                raise ConfigError(f"block.attn.{name}", options[name], "must be a positive integer, or null")
        rope_dim = options["rope_dim"]
        if rope_dim is not None and (rope_dim < 2 or rope_dim % 2):
            raise ConfigError("block.attn.rope_dim", rope_dim, "must be a positive even integer, or null (d_head)")
        if options["latent_norm"] != "none" and options["latent_norm"] not in NORMS:
            raise ConfigError(
                "block.attn.latent_norm",
                options["latent_norm"],
                f"none or a registered norm: {', '.join(NORMS.names())}",
            )
        check_flex(dims, options["backend"])

    @classmethod
    def check_tp(cls, dims: BlockDims, tp: int, **options: Any) -> None:
        require_whole_heads(dims.n_heads, tp)

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        """The down-projections and latent norms run whole on every rank (the latent is shared by every
        head; the shared rotary key's gradient, summed over this rank's heads, is all-reduced); the
        per-head up-projections column-wise, ``out`` row-wise; the position part's own plan.
        Under sequence parallelism the input is gathered from the sequence shards and the output
        reduce-scattered back to them."""
        plan: Plan = {
            "kv_down": tp.Chain(tp.Replicated(), tp.PartialGradient(self.rope_dim)),
            "kv_up": tp.ColwiseParallel(),
            "out": row_output(sequence_parallel),
            **prefixed("position", self.position.tp_plan(sequence_parallel)),  # type: ignore[attr-defined]
        }
        if self.q_rank is None:
            plan["q"] = tp.ColwiseParallel()
        else:
            plan.update({"q_down": tp.Replicated(), "q_up": tp.ColwiseParallel()})
        for name in ("kv_norm", "q_norm"):
            if not isinstance(getattr(self, name, nn.Identity()), nn.Identity):  # latent_norm: none is Identity
                plan[name] = tp.Replicated()
        return {**plan, **output_plan(self, sequence_parallel)}

    def __init__(
        self,
        dims: BlockDims,
        position: Position,
        *,
        kv_rank: int | None = None,
        q_rank: int | None = None,
        rope_dim: int | None = None,
        latent_norm: str = "rmsnorm",
        backend: Backend = "sdpa",
        gate: Gate = "none",
        sink: Sink = "none",
        xsa: bool = False,
    ) -> None:
        super().__init__()
        self.n_heads, self.d_head = dims.n_heads, dims.d_head
        #: The softmax's score multiplier; None: 1 / sqrt(2 d_head) (μP sets sqrt(2 d_head_base) / (2 d_head)).
        self.score_scale: float | None = None
        self.rope_dim = self.d_head if rope_dim is None else rope_dim
        self.score_features = self.d_head + self.rope_dim  # q . k sums over content and position (μP scales by it)
        self.kv_rank = 4 * self.d_head if kv_rank is None else kv_rank
        self.causal, self.dropout, self.backend = dims.causal, dims.dropout, backend
        self.position = position
        heads = self.n_heads * 2 * self.d_head  # per head: a d_head key and a d_head value
        queries = self.n_heads * self.score_features  # per head: d_head content, rope_dim position features
        self.kv_down = nn.Linear(dims.d_model, self.kv_rank + self.rope_dim, bias=dims.bias)
        self.kv_norm = build_norm(latent_norm, dims, width=self.kv_rank)
        self.kv_up = nn.Linear(self.kv_rank, heads, bias=dims.bias)
        self.q_rank = q_rank
        if q_rank is None:
            self.q = nn.Linear(dims.d_model, queries, bias=dims.bias)
        else:
            self.q_down = nn.Linear(dims.d_model, q_rank, bias=dims.bias)
            self.q_norm = build_norm(latent_norm, dims, width=q_rank)
            self.q_up = nn.Linear(q_rank, queries, bias=dims.bias)
        self.out = nn.Linear(self.n_heads * self.d_head, dims.d_model, bias=dims.bias)
        self.gate, self.sink, self.xsa = build_gate(gate, dims), build_sink(sink, self.n_heads), xsa
        self.output_options = {"gate": gate, "sink": sink, "xsa": xsa}

    def matrix_blocks(self) -> dict[str, dict[str, torch.Tensor]]:
        """``kv_down``'s rows as the latent's and the shared rotary key's down-projections; ``kv_up``'s
        as every head's key and value up-projections; the query projection's (``q`` or ``q_up``) as
        every head's content and position features. ``q_down`` and ``out`` are one matrix each."""
        rows = torch.arange(self.kv_rank + self.rope_dim)
        blocks = {"kv_down.weight": {"latent": rows[: self.kv_rank], "rope_key": rows[self.kv_rank :]}}
        halves = rearrange(torch.arange(self.kv_up.out_features), "(h two d) -> two (h d)", two=2, d=self.d_head)
        blocks["kv_up.weight"] = {"key": halves[0], "value": halves[1]}
        query = "q.weight" if self.q_rank is None else "q_up.weight"
        per_head = rearrange(torch.arange(self.n_heads * self.score_features), "(h f) -> h f", h=self.n_heads)
        content, position = per_head.split([self.d_head, self.rope_dim], dim=-1)
        blocks[query] = {"content": content.flatten(), "position": position.flatten()}
        return blocks

    def state_size(self, length: int) -> int:
        """Numbers one sample's decoding state holds after ``length`` tokens: the latent and the shared
        rotary key."""
        return (self.kv_rank + self.rope_dim) * length

    def extra_flops(self, seq_len: int) -> int:
        """The output options' FLOPs per token (:func:`zoo.parts.head_outputs.output_flops`); every head has
        its own value."""
        return output_flops(self.n_heads, self.n_heads, self.d_head, **self.output_options)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """x: (b, t, d_model) -> (b, t, n_heads * 2 d_head)."""
        if self.q_rank is None:
            return self.q(x)
        return self.q_up(self.q_norm(self.q_down(x)))

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: (b, t, d_model) -> queries (b, h, t, d_head + rope_dim: content, then rotated position features),
        the normalized latents (b, t, kv_rank) and the rotated shared key (b, 1, t, rope_dim), at ``positions``."""
        latent, rope_key = self.kv_down(x).split([self.kv_rank, self.rope_dim], dim=-1)
        latent = self.kv_norm(latent)  # (b, t, kv_rank)
        q = rearrange(self.queries(x), "b t (h f) -> b h t f", f=self.score_features)  # h: this rank's heads
        q_content, q_position = q.split([self.d_head, self.rope_dim], dim=-1)  # (b, h, t, d_head), (b, h, t, r)
        rope_key = rearrange(rope_key, "b t d -> b 1 t d")  # one key shared by every head
        q_position, rope_key = self.position.rotate(q_position, rope_key, positions)
        return torch.cat([q_content, q_position], dim=-1), latent, rope_key

    def keys_values(self, latent: torch.Tensor, rope_key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Latents (b, s, kv_rank) and shared keys (b, 1, s, rope_dim) -> every head's keys (b, h, s, d_head +
        rope_dim) and values (b, h, s, d_head)."""
        k_content, v = rearrange(self.kv_up(latent), "b s (h two d) -> two b h s d", d=self.d_head, two=2)
        return torch.cat([k_content, rope_key.expand(-1, k_content.shape[1], -1, -1)], dim=-1), v

    @torch.no_grad()
    def clip_qk(self, gamma: torch.Tensor) -> None:
        """The ``clip_qk`` hook (MLA's split): head h's content query and content key rows (``q`` or ``q_up``;
        ``kv_up``'s key half) times sqrt(gamma_h), its rotary query rows times gamma_h; the rotary key, shared
        by every head, is left as it is. Head h's q . k is multiplied by gamma_h."""
        root = gamma.float().sqrt()
        ones = torch.ones_like(root)
        content, position = repeat(root, "h -> h d", d=self.d_head), repeat(gamma.float(), "h -> h r", r=self.rope_dim)
        query = torch.cat([content, position], 1)  # (h, d_head + rope_dim): each head's query rows in order
        key = repeat(torch.stack([root, ones], 1), "h two -> (h two d)", d=self.d_head)  # key, then value rows
        projection = self.q if self.q_rank is None else self.q_up
        scale_rows(projection, query.flatten())
        scale_rows(self.kv_up, key)

    def attention_logits(self, x: torch.Tensor) -> torch.Tensor | None:
        """Pre-softmax scores of ``x`` (b, t, d_model) as one sequence (the ``attention_logits`` hook): content
        and rotary features together, q k^T at the kernel's ``scale``, with the score bias and mask. -> (b, h, t, t)."""
        slots = torch.arange(x.shape[1], device=x.device)
        q, latent, rope_key = self.project(x, slots)
        k, _ = self.keys_values(latent, rope_key)
        bias = self.position.score_bias(slots, slots)
        return masked_logits(q, k, scale=self.score_scale, causal=self.causal, bias=bias)

    def forward(self, x: torch.Tensor, *, key_mask: torch.Tensor | None = None, cache: LayerState | None = None,
                positions: torch.Tensor | None = None, documents: Documents | None = None) -> torch.Tensor:  # fmt: skip
        """x: (b, t, d_model) -> (b, t, d_model); arguments as in :meth:`zoo.parts.attention.Attention.forward`."""
        state = None if cache is None else cache.mixer_state(LatentCache)
        time = x.shape[1]
        slots = query_slots(state, time, x.device)  # (t,)
        q, latent, rope_key = self.project(x, slots if positions is None else positions)
        k_positions = positions
        if state is not None:
            latent, rope_key = state.append(latent, rope_key, positions)
            k_positions = state.key_positions()
        k, v = self.keys_values(latent, rope_key)  # (b, h, s, d + r), (b, h, s, d)
        own = v[:, :, slots]  # each query's own value (XSA): the cache holds it at the query's slot
        if self.backend != "math":  # fused kernels want values as wide as keys: zeros, sliced off below
            v = F.pad(v, (0, self.rope_dim))
        y = attend_at(
            q,
            k,
            v,
            slots=slots,
            preallocated=state is not None and state.static,
            positions=positions,
            k_positions=k_positions,
            key_mask=key_mask,
            causal=self.causal,
            position=self.position,
            backend=self.backend,
            dropout=self.dropout if self.training else 0.0,
            scale=self.score_scale,
            sink=None if self.sink is None else local(self.sink),
            documents=None if documents is None else documents.same(slots, k.shape[-2]),
        )
        y = y[..., : self.d_head]
        if self.xsa:
            y = exclude_own_value(y, own)
        return self.out(rearrange(gated(y, self.gate, x), "b h t d -> b t (h d)"))
