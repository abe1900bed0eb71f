"""Hashed n-gram embeddings (``model.ngram``, modded-nanogpt's bigram hash embedding): each position's last n
token ids hashed to a row of a table, the row added to the residual stream before every layer with a learned
scale per layer.

The hash is modded-nanogpt's (``get_bigram_hash``): with ``rows`` the table's size, position t's n-gram
(x_t, x_{t-1}, ..., x_{t-n+1}) goes to row (36313 x_t XOR 27191 x_{t-1} [XOR 51497 x_{t-2}]) mod (rows - 1), and
a position with fewer than n - 1 real tokens of its document before it (the sequence's first n - 1, those after
padding or a document's start under ``task.doc_mask``) to the reserved row rows - 1. It reads the ids alone, and
at position t only tokens <= t. Decoding keeps the last n - 1 ids (each plus 1, 0 for none: the first layer's
state, as the smear's last embedding).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from zoo.core.errors import ConfigError
from zoo.core.registry import OptionDoc
from zoo.parts.state import LayerState

#: The hash's multiplier per token of the n-gram, the newest first (modded-nanogpt's two; a third prime for trigrams).
MULTIPLIERS = (36313, 27191, 51497)
#: The orders ``model.ngram`` takes.
ORDERS = (2, 3)
#: The table's rows per vocabulary entry when ``model.ngram_table`` is null (modded-nanogpt's and nanochat's 5).
ROWS_PER_TOKEN = 5
#: The key under which the first layer's decoding state keeps the last n - 1 ids (LayerState.canon).
NGRAM_STATE = "ngram"

NGRAM_DOC = OptionDoc(
    "ngram",
    values="null, 2, 3 (with ngram_table: null or rows >= 2, ngram_scale: a number > 0)",
    formula="x <- x + s_i T[h_t] before layer i, h_t = (36313 x_t XOR 27191 x_{t-1} [XOR 51497 x_{t-2}]) mod "
    "(R - 1), h_t = R - 1 (a reserved row) where fewer than n - 1 real tokens of its document (task.doc_mask) "
    "precede t; T (R, d_model) zeros at init, R = ngram_table (null: 5 x vocab_size), s_i learned per layer (init "
    "ngram_scale, default 0.1); the first layer's decoding state keeps the last n - 1 ids",
    cost="6 x n_layers x d_model (each layer's scale and sum); the lookup and the integer hash uncounted, and T's "
    "parameters outside 6 x parameters, as the token embedding's (counted apart: parameters' ngram)",
    reference="Jordan et al. 2026, modded-nanogpt records 62, 68, 71, 83 (PR 201: bigram hash embedding); "
    "Karpathy 2026, nanochat (bigram embeddings, reverted: dev/LOG.md 2026-01-28); Svenstrup et al. 2017, Hash "
    "Embeddings, arXiv:1709.03933",
)

#: Which reference zoo's n-gram table follows and how the others differ (docs/parts.md, "Model options").
NGRAM_NOTES = (
    "`model.ngram` follows modded-nanogpt's bigram hash embedding (PR 201, record 62): the hash above with its two "
    "multipliers, the first position on a reserved last row, 5 x vocab_size rows of d_model, the table at zeros "
    "and each layer's scale at 0.1, the row added to the stream before every layer. Where zoo differs: "
    "modded-nanogpt hashes on the data loader over a packed batch (a document's first token hashes with the "
    "previous document's last), zoo in the model from the ids, padding counting as no token; modded-nanogpt trains "
    "the table with Adam at 75 x the rate and 5 x the decay (zoo: the run's optimizer and rate; "
    "`optim.lr_ratios={ngram: 75}` sets a ratio); its later records move the hash to the GPU (68), send sparse "
    "gradients (71) and hash into a table a quarter of d_model wide with a random sign per bigram (83), none of "
    "which zoo has. Trigrams (`ngram=3`) add a third term, 51497 x_{t-2}, zoo's own (modded-nanogpt tried "
    "trigrams and kept bigrams). nanochat merged the same table (5 x vocab_size rows, zeros, per-layer scales at "
    "0.1, the token embedding's rate) on 2026-01-27 and reverted it the next day: at d25 the gain was tiny and "
    "gone when measured by wall clock (its dev/LOG.md). OLMo-core's Engram baseline (a research branch) hashes "
    "several orders with several hash heads each (a polynomial hash modulo each table's slots, left-padded with "
    "an id past the vocabulary), projects the heads' rows to d_model and adds them once, to the token embedding, "
    "scaled by a learned exp(alpha). The table and its scales are counted apart (`parameters.ngram` in a run's "
    "summary; `total` includes them), so a comparison can match parameters with or without them; the lookup is no "
    "FLOP. μP scales the table as the token embedding (an input table: init and rate x 1), the scales are fixed. "
    "Refused: under `parallel.tp` > 1, with several residual streams (`hyper`, `mhc`, `attnres`), in an "
    "encoder-decoder, in an export; multi-token prediction's extra heads embed without it; a model with it cannot "
    "rewind (`truncate`).",
)


def ngram_options(options: Mapping[str, Any]) -> None:
    """Check ``model.ngram`` (null, 2 or 3), ``model.ngram_table`` (null or an integer >= 2) and
    ``model.ngram_scale`` (a number > 0), each by name (ConfigError)."""
    order, rows, scale = options["ngram"], options["ngram_table"], options["ngram_scale"]
    if order is not None and (isinstance(order, bool) or order not in ORDERS):
        raise ConfigError("model.ngram", order, "null (no n-gram table), 2 (bigrams) or 3 (trigrams)")
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 2):
        raise ConfigError("model.ngram_table", rows, "null (5 x vocab_size rows) or an integer >= 2 (one row is "
                          "reserved for positions without n - 1 tokens before them)")  # fmt: skip
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not scale > 0:
        raise ConfigError("model.ngram_scale", scale, "a number > 0 (each layer's scale at init; the table starts "
                          "at zeros, so a zero scale would never move)")  # fmt: skip


def ngram_rows(marked: torch.Tensor, order: int, rows: int, taps: torch.Tensor | None = None) -> torch.Tensor:
    """marked (b, order - 1 + t): ids plus 1 (0: no token), the order - 1 before the call's first included ->
    each of the t positions' table row (b, t), by the module docstring's hash. ``taps`` (b, t, order) bool,
    whether each of a position's n tokens (the oldest first) lies in its document: one that does not counts as
    no token (``task.doc_mask``)."""
    time = marked.shape[1] - (order - 1)
    window = [marked[:, order - 1 - k : order - 1 - k + time] for k in range(order)]  # the token k back, per position
    hashed = torch.zeros_like(window[0])
    for k, tokens in enumerate(window):
        hashed = hashed ^ (MULTIPLIERS[k] * (tokens - 1))
    missing = torch.stack(window).eq(0).any(dim=0)
    if taps is not None:
        missing = missing | ~taps.all(dim=-1)
    return torch.where(missing, rows - 1, hashed % (rows - 1))


class NgramEmbedding(nn.Module):
    """The hashed n-gram table (``table``, rows x d_model, zeros at init) and one learned scale per layer
    (``scales``, init ``scale``): :meth:`forward` gives each position's row, :meth:`added` layer i's term."""

    #: An init scheme (zoo.assembly.init) leaves the table at its zeros.
    keeps_init = True

    def __init__(self, order: int, rows: int, d_model: int, n_layers: int, scale: float) -> None:
        super().__init__()
        self.order, self.rows, self.init_scale = order, rows, float(scale)
        self.table = nn.Embedding(rows, d_model)
        self.scales = nn.Parameter(torch.empty(n_layers))
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"order={self.order}, rows={self.rows}"

    def reset_parameters(self) -> None:
        """The table at zeros, each layer's scale at its initial value (modded-nanogpt's, nanochat's)."""
        with torch.no_grad():
            self.table.weight.zero_()
            self.scales.fill_(self.init_scale)

    def state_size(self) -> int:
        """Numbers one sample's decoding state holds for it: the last order - 1 ids."""
        return self.order - 1

    def extra_flops(self, seq_len: int) -> int:
        """Each layer's scale and sum over d_model (x 3 for forward and backward); the lookup is no FLOP."""
        return 3 * 2 * self.scales.numel() * self.table.embedding_dim

    def forward(
        self,
        ids: torch.Tensor,
        real: torch.Tensor | None = None,
        cache: LayerState | None = None,
        taps: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ids (b, t) -> each position's n-gram row (b, t, d_model), unscaled. ``real`` (b, t) bool: False at
        padding, which counts as no token. ``cache``: the first layer's decoding state, holding the ids before
        ``ids`` (none without one) and given the last order - 1 (written in place). ``taps`` (b, t, order): which
        of each position's n tokens lie in its document (zoo.parts.documents; the others count as none)."""
        marked = ids.long() + 1
        if real is not None:
            marked = marked * real.long()
        before = None if cache is None else cache.canon_tail(NGRAM_STATE)
        if before is None:
            before = marked.new_zeros(marked.shape[0], self.order - 1)
        joined = torch.cat([before, marked], dim=1)
        if cache is not None:
            cache.hold_canon(NGRAM_STATE, joined[:, joined.shape[1] - (self.order - 1) :])
        return self.table(ngram_rows(joined, self.order, self.rows, taps))

    def added(self, layer: int, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """x + layer ``layer``'s scale x ``rows`` (:meth:`forward`'s output)."""
        return x + self.scales[layer].to(x.dtype) * rows.to(x.dtype)
