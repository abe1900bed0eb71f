"""Mamba-2: the selective state-space model in its state-space duality (SSD) form, a scalar-decay linear attention
whose queries and keys are the state-space model's C and B, after a short causal convolution, with a skip D and a
gated RMSNorm over each group's features.

Two forms of the same function (zoo.parts.linear_attention's): the chunked form (``backend: sdpa``: quadratic inside
chunks of ``chunk`` tokens, a state carried across them) and the recurrent form (``backend: math``, the reference,
and every decoding step of one token); the short convolution and the decoding state are Gated DeltaNet's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from zoo.core.dims import BlockDims
from zoo.core.errors import ConfigError
from zoo.core.interface import hook
from zoo.core.registry import ATTENTIONS
from zoo.core.reshape import rearrange, repeat
from zoo.parts.convolution import add_kernel, short_convolution
from zoo.parts.documents import Documents
from zoo.parts.gated_deltanet import SCAN_RESET, DeltaState, check_scan, initial_rates
from zoo.parts.linear_attention import chunked, recurrent
from zoo.parts.positions import Position
from zoo.parts.state import LayerState, query_slots

#: The default epsilon of the gated output RMSNorm (mamba_ssm's and transformers' Mamba2 layer_norm_epsilon).
NORM_EPS = 1e-5


@ATTENTIONS.register(
    "mamba2",
    summary="Mamba-2 (SSD): a (d_state, head_dim) state per head, decayed by exp(dt A) and written dt B x^T, read by "
    "C, after a short causal convolution on x, B and C; chunked for training, recurrent for decoding.",
    formula="h_i = exp(dt_i A) h_{i-1} + dt_i B_i x_i^T, y_i = h_i^T C_i + D x_i, out = W_o (rmsnorm_g(y * silu(z)) "
    "* w); x, B, C = silu(conv(W_x u), conv(W_bc u)) (B, C one per group, n_groups groups of heads), z = W_z u, dt = "
    "softplus(W_dt u + dt_bias), A = -exp(A_log) per head; rmsnorm_g over each group's n_heads / n_groups x head_dim "
    "features; mixing cost per token 6 n_heads (chunk (d_state + head_dim) + 2 d_state head_dim) training FLOPs",
    reference="Dao & Gu 2024, Transformers are SSMs: Generalized Models and Efficient Algorithms Through Structured "
    "State Space Duality, arXiv:2405.21060; state-spaces/mamba's Mamba2Simple and ssd_minimal; transformers' "
    "Mamba2Mixer (torch_forward)",
    variants={"groups": {"n_groups": 2}},
)
class Mamba2(nn.Module):
    """Mamba-2's mixer: per head a (d_state, head_dim) state h, h_i = exp(dt_i A) h_{i-1} + dt_i B_i x_i^T read
    by C_i, plus a skip D x_i: linear attention with q = C, k = dt B, v = x and the scalar log decay dt A
    (zoo.parts.linear_attention's chunked and recurrent forms).

    ``n_heads`` heads of ``head_dim`` features (d_model / n_heads by default: Mamba-2's expand 2 is head_dim =
    2 d_model / n_heads), ``d_state`` (N) state rows per head; B and C per group of heads (``n_groups``, default 1:
    one B and C for every head, as Mamba-2's multi-value form). Projections: ``x`` and ``gate`` (z) d_model ->
    n_heads x head_dim, ``bc`` d_model -> 2 n_groups d_state (every group's B, then every group's C), ``step`` d_model
    -> n_heads (dt before softplus and ``dt``, its bias). A short causal depthwise convolution of ``conv`` taps (with
    ``conv_bias``; its kernel stored less the identity, as Gated DeltaNet's) runs over x, B, C in that order, then
    SiLU. A = -exp(``a_log``) and ``dt`` start as Gated DeltaNet's (:func:`initial_rates`: mamba's ranges, spread
    evenly rather than drawn); ``skip`` (D) starts at 1. The output y * silu(z) is RMS-normalized over each group's
    features (epsilon ``norm_eps``, gain ``norm``, mamba's norm_before_gate=False) and ``out`` mixes it.

    ``backend``: ``sdpa`` computes the chunked form (chunks of ``chunk`` tokens, at most the call's), ``math`` the
    recurrent one. The ``pos`` axis rotates C and B (queries and keys); a score bias is refused, and so are encoder
    blocks (the scan reads tokens in order). It has no tensor-parallel plan (its norm spans each group's heads, its B
    and C are shared by them), so ``parallel.tp`` > 1 is refused by name.
    """

    part_name: ClassVar[str] = "mamba2"
    doc_reset: ClassVar[str | None] = SCAN_RESET
    conflicts: ClassVar[dict[str, str]] = {
        "score bias": "Mamba-2 never forms the score matrix a score bias is added to; use pos=none or pos=rotary "
        "(its convolution and decay carry order)"
    }

    @classmethod
    def check(cls, dims: BlockDims, **options: Any) -> None:
        if options["d_state"] < 1:
            raise ConfigError("block.attn.d_state", options["d_state"], "must be a positive integer")
        groups = options["n_groups"]
        if groups < 1 or dims.n_heads % groups:
            raise ConfigError("block.attn.n_groups", groups, f"must divide block.n_heads={dims.n_heads}")
        check_scan(cls.part_name, dims, options)

    def __init__(
        self,
        dims: BlockDims,
        position: Position,
        *,
        d_state: int = 64,
        n_groups: int = 1,
        head_dim: int | None = None,
        conv: int = 4,
        chunk: int = 64,
        norm_eps: float = NORM_EPS,
        backend: Literal["sdpa", "math"] = "sdpa",
    ) -> None:
        super().__init__()
        if head_dim is not None:  # the assembly has set it already; a direct build gets it here
            dims = replace(dims, head_dim=head_dim)
        self.n_heads, self.head_dim, self.d_state, self.n_groups = dims.n_heads, dims.d_head, d_state, n_groups
        self.backend, self.chunk, self.norm_eps = backend, chunk, norm_eps
        rotated = hook(position, "rotated")
        if rotated is not None and rotated > d_state:
            raise ConfigError(
                "block.attn.d_state", d_state, f"must be at least the {rotated} features per head the position rotates"
            )
        self.position = position
        inner = self.n_heads * self.head_dim
        self.channels = inner + 2 * n_groups * d_state  # the convolution's: x, every group's B, every group's C
        self.x = nn.Linear(dims.d_model, inner, bias=dims.bias)
        self.bc = nn.Linear(dims.d_model, 2 * n_groups * d_state, bias=dims.bias)
        self.conv: nn.Parameter  # (channels, 1, conv): the kernel less the identity
        self.present: torch.Tensor  # (conv,): the identity kernel
        add_kernel(self, self.channels, conv)
        self.conv_bias = nn.Parameter(torch.zeros(self.channels))
        self.step = nn.Linear(dims.d_model, self.n_heads, bias=False)  # ``dt`` is its bias
        a_log, dt = initial_rates(self.n_heads)
        self.a_log, self.dt = nn.Parameter(a_log), nn.Parameter(dt)
        self.skip = nn.Parameter(torch.ones(self.n_heads))
        self.gate = nn.Linear(dims.d_model, inner, bias=dims.bias)
        self.norm = nn.Parameter(torch.ones(inner))
        self.out = nn.Linear(inner, dims.d_model, bias=dims.bias)

    def matrix_blocks(self) -> dict[str, dict[str, torch.Tensor]]:
        """``bc``'s rows as the B and C matrices (every group's B, then every group's C); ``x``, ``gate``, ``step``
        and ``out`` are one matrix each; the convolution's kernel is none (one short filter per channel)."""
        rows = torch.arange(2 * self.n_groups * self.d_state)
        b, c = rows.chunk(2)
        return {"bc.weight": {"b": b, "c": c}}

    def state_size(self, length: int) -> int:
        """Numbers one sample's decoding state holds: a (d_state, head_dim) matrix per head and the convolution's
        last conv - 1 inputs."""
        return self.n_heads * self.d_state * self.head_dim + (self.conv.shape[-1] - 1) * self.channels

    def mixing_flops(self, seq_len: int) -> int:
        """Training FLOPs per token of the chunked form's products: per head and token, chunk x d_state for C B^T,
        chunk x head_dim for its product with x, d_state x head_dim for each of the chunk's state and the state read,
        with ``chunk`` the sequence when shorter; x 2 FLOPs, x 3 for forward and backward."""
        chunk = min(self.chunk, seq_len)
        return 6 * self.n_heads * (chunk * (self.d_state + self.head_dim) + 2 * self.d_state * self.head_dim)

    def attention_logits(self, x: torch.Tensor) -> torch.Tensor | None:
        """None: no softmax, so no attention logits (probes skip this mixer by name)."""
        return None

    def gated_norm(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """rmsnorm(y * silu(z)) * ``norm`` over each group's features: y, z (b, t, n_heads x head_dim)."""
        y = rearrange(y * F.silu(z), "b t (g f) -> b t g f", g=self.n_groups)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        return rearrange(y, "b t g f -> b t (g f)") * self.norm

    def forward(self, x: torch.Tensor, *, key_mask: torch.Tensor | None = None, cache: LayerState | None = None,
                positions: torch.Tensor | None = None, documents: Documents | None = None) -> torch.Tensor:  # fmt: skip
        """x: (b, t, d_model) -> (b, t, d_model). key_mask, cache, positions, documents: as Gated DeltaNet's (a
        padding token enters the convolution as zeros and neither writes nor decays the state)."""
        time = x.shape[1]
        state = None if cache is None else cache.mixer_state(DeltaState)
        slots = query_slots(state, time, x.device)
        real = None if key_mask is None else key_mask.index_select(1, slots).bool()  # (b, t): the new tokens
        mixed = torch.cat([self.x(x), self.bc(x)], dim=-1)
        if real is not None:
            mixed = mixed * real[..., None]
        taps = None if documents is None else documents.taps(slots, self.conv.shape[-1])
        mixed, tail = short_convolution(mixed, self.conv + self.present, None if state is None else state.conv, taps)
        work = torch.promote_types(x.dtype, torch.float32)  # the scan in at least float32
        mixed = F.silu(mixed + self.conv_bias).to(work)
        v, b, c = mixed.split([self.n_heads * self.head_dim, self.n_groups * self.d_state,
                               self.n_groups * self.d_state], dim=-1)  # fmt: skip
        v = rearrange(v, "b t (h p) -> b h t p", p=self.head_dim)
        heads = self.n_heads // self.n_groups
        c, b = (repeat(t, "b t (g n) -> b (g r) t n", g=self.n_groups, r=heads) for t in (c, b))
        c, b = self.position.rotate(c, b, slots if positions is None else positions)
        # contiguous before the softplus, as Gated DeltaNet's log_decay: torch.compile's backward views its gradient
        logits = rearrange(self.step(x).to(work), "b t h -> b h t").contiguous()
        dt = F.softplus(logits + rearrange(self.dt.to(work), "h -> h 1"))
        if real is not None:  # padding: no write, no decay
            dt = dt * rearrange(real, "b t -> b 1 t")
        log_decay = -rearrange(torch.exp(self.a_log.to(work)), "h -> h 1") * dt
        k = b * dt[..., None]
        start = None if state is None else state.matrix
        if self.backend == "math" or (time == 1 and start is not None):
            y, end = recurrent(c, k, v, log_decay, start, None if documents is None else documents.fresh(slots))
        else:
            segments = None if documents is None else documents.segments(slots)
            y, end = chunked(c, k, v, log_decay, start, min(self.chunk, time), segments)
        if state is not None:
            state.hold(end, tail, time)
        y = y + rearrange(self.skip.to(work), "h -> h 1 1") * v
        y = self.gated_norm(rearrange(y, "b h t p -> b t (h p)"), self.gate(x).to(work))
        return self.out(y.to(x.dtype))
