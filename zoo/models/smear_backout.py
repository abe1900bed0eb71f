"""Two of a decoder-only model's own options on its residual stream (modded-nanogpt's, nanochat's): ``model.smear``,
each token's embedding plus a gated fraction of the previous token's, and ``model.backout``, the last layer's
output less a learned multiple of a middle layer's before the final norm."""

from __future__ import annotations

import torch
from torch import nn

from zoo.core.registry import OptionDoc
from zoo.parts.state import LayerState

#: The channels of a token's embedding the smear gate reads (nanochat's 24; all of them below 24).
SMEAR_GATE_CHANNELS = 24
#: The key under which the first layer's decoding state keeps the last embedding (LayerState.canon).
SMEAR_STATE = "smear"
#: Backout's multiple at initialization (nanochat's backout_lambda).
BACKOUT_INIT = 0.2

SMEAR_DOC = OptionDoc(
    "smear",
    values="false, true",
    formula="x_t <- x_t + lambda sigmoid(w . x_t[:k]) x_{t-1} on the token embeddings (after the scale and "
    "embedding_norm, before absolute positions), k = min(24, d_model), lambda a learned scalar (init 0), w (1, k); "
    "the first token, a token after padding and a document's first token (task.doc_mask) gain nothing; the first "
    "layer's decoding state keeps the last embedding (d_model numbers per sample); multi-token prediction's extra "
    "heads embed without it",
    cost="6 (k + 1): its parameters (the elementwise gate and sum uncounted)",
    reference="Jordan et al. 2024, modded-nanogpt (smear_gate); Karpathy 2025, nanochat (smear_gate, smear_lambda)",
)
BACKOUT_DOC = OptionDoc(
    "backout",
    values="false, true",
    formula="h <- h_L - lambda h_m before the final norm, h_m the output of layer m = n_layers // 2 (0-based), "
    "h_L the last layer's, lambda a learned scalar (init 0.2); residual streams (hyper, mhc) summed first",
    cost="6: its one parameter (the elementwise difference uncounted)",
    reference="Karpathy 2025, nanochat (backout_lambda); modded-nanogpt",
)


class Smear(nn.Module):
    """x_t + scale sigmoid(gate(x_t[:k])) x_{t-1}: a gated fraction of the previous token's embedding (``scale``
    starts at 0: no smear at initialization)."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model, self.channels = d_model, min(SMEAR_GATE_CHANNELS, d_model)
        self.gate = nn.Linear(self.channels, 1, bias=False)
        self.scale = nn.Parameter(torch.zeros(1))

    def state_size(self) -> int:
        """Numbers one sample's decoding state holds for it: the last token's embedding."""
        return self.d_model

    def forward(
        self,
        x: torch.Tensor,
        real: torch.Tensor | None = None,
        cache: LayerState | None = None,
        fresh: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (b, t, d_model) -> the smeared embeddings. ``real`` (b, t) bool: False at padding, which smears
        nothing into the next token. ``cache``: the first layer's decoding state, holding the embedding before
        ``x`` (zeros without one) and given ``x``'s last (written in place). ``fresh`` (b, t) bool: True at a
        document's first token (``task.doc_mask``), which gains nothing from the token before it."""
        seen = x if real is None else x * real[..., None].to(x.dtype)
        before = None if cache is None else cache.canon_tail(SMEAR_STATE)
        if before is None:
            before = x.new_zeros(x.shape[0], 1, x.shape[-1])
        shifted = torch.cat([before, seen], dim=1)  # (b, 1 + t, d): position i holds the embedding before token i
        if cache is not None:
            cache.hold_canon(SMEAR_STATE, shifted[:, -1:])
        weight = self.scale.to(x.dtype) * torch.sigmoid(self.gate(x[..., : self.channels]))
        before = shifted[:, :-1] if fresh is None else shifted[:, :-1] * ~fresh[..., None]
        return x + weight * before


class Backout(nn.Module):
    """h_L - scale h_m: the last layer's output less a learned multiple of layer ``layer``'s."""

    def __init__(self, n_layers: int) -> None:
        super().__init__()
        self.layer = n_layers // 2
        self.scale = nn.Parameter(torch.full((1,), BACKOUT_INIT))

    def forward(self, last: torch.Tensor, middle: torch.Tensor) -> torch.Tensor:
        return last - self.scale.to(last.dtype) * middle
