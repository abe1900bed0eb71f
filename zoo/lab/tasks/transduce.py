"""``transduce``: a generated sequence-to-sequence task for encoder-decoder models (zoo.build_seq2seq).

A source is ``min_len..max_len`` random symbols, right-padded; its target is the source reversed
(``op: reverse``), sorted (``sort``) or copied (``copy``), then EOS. The decoder reads BOS and the
target shifted right (teacher forcing) and the encoder reads the source under its padding mask.
Validation also decodes greedily with the cross-attention cache and scores exact matches: every
target token up to and including EOS right.

Tokens: 0 PAD, 1 BOS, 2 EOS, symbols ``3 .. 3 + n_symbols``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from zoo.core.errors import ConfigError
from zoo.lab.tasks.base import IGNORE, Batch, Task, planned_sum, positive, register_task
from zoo.models.seq2seq import build_seq2seq

PAD, BOS, EOS, FIRST_SYMBOL = 0, 1, 2, 3
#: Validation sequences are drawn from this seed: every run is scored on the same set.
VAL_SEED = 4321


@dataclass(frozen=True)
class Seq2SeqBatch(Batch):
    """A :class:`Batch` with a source: ``inputs`` (b, t) is the decoder's input (BOS, target shifted
    right), ``targets`` (b, t) the target or IGNORE, ``source`` (b, s) and ``source_mask`` (b, s),
    True at real source tokens."""

    source: torch.Tensor = None  # type: ignore[assignment]
    source_mask: torch.Tensor = None  # type: ignore[assignment]

    def to(self, device: torch.device | str) -> Seq2SeqBatch:
        return Seq2SeqBatch(
            *(t.to(device, non_blocking=True) for t in (self.inputs, self.targets, self.source, self.source_mask))
        )


@register_task("transduce")
class TransduceTask(Task):
    """Reverse, sort or copy a random symbol sequence. Metrics: ``val_exact_match`` (greedy decoding with
    the cache, whole target right), ``val_accuracy`` and ``val_loss`` (teacher-forced target tokens).

    At ``k`` times the trained length, sources are ``k`` times as long.
    """

    metrics = {"exact_match": "max", "accuracy": "max", "loss": "min"}
    sums = (*Task.sums, "exact", "sequences")  # + exact matches and sequences (scored by generation)

    def __init__(
        self,
        *,
        op: Literal["reverse", "sort", "copy"] = "reverse",
        n_symbols: int = 16,
        min_len: int = 4,
        max_len: int = 12,
        eval_lengths: tuple[int, ...] = (1,),
        metric: str | None = None,
    ) -> None:
        super().__init__(eval_lengths=eval_lengths, metric=metric)
        positive("task.n_symbols", n_symbols)
        positive("task.min_len", min_len)
        if max_len < min_len:
            raise ConfigError("task.max_len", max_len, f"at least task.min_len={min_len}")
        self.op, self.n_symbols, self.min_len, self.max_len = op, n_symbols, min_len, max_len
        self.vocab_size = FIRST_SYMBOL + n_symbols
        self.seq_len = max_len + 1  # target positions: the longest target and its EOS

    @classmethod
    def planned_seq_len(cls, options: Mapping[str, Any]) -> int | None:
        return planned_sum(options.get("max_len", 12), 1)

    def sample(self, n: int, generator: torch.Generator, factor: int = 1) -> Seq2SeqBatch:
        """``n`` pairs with sources of ``factor * min_len .. factor * max_len`` symbols."""
        longest = factor * self.max_len
        lengths = torch.randint(factor * self.min_len, longest + 1, (n,), generator=generator)
        symbols = torch.randint(FIRST_SYMBOL, self.vocab_size, (n, longest), generator=generator)
        positions = torch.arange(longest)
        source_mask = positions < lengths[:, None]  # (n, s): right padding
        source = torch.where(source_mask, symbols, PAD)
        if self.op == "reverse":  # position i of the target is source position length - 1 - i
            index = (lengths[:, None] - 1 - positions).clamp(min=0)
            target = torch.where(source_mask, source.gather(1, index), PAD)
        elif self.op == "sort":  # padding sorts last: give it a key above every symbol
            target = torch.where(source_mask, source, self.vocab_size).sort(dim=1).values
            target = torch.where(source_mask, target, PAD)
        else:
            target = source.clone()
        target = torch.cat([target, torch.full((n, 1), PAD)], dim=1)  # (n, s + 1): room for EOS
        target[torch.arange(n), lengths] = EOS
        real = torch.arange(longest + 1) <= lengths[:, None]  # target tokens up to and including EOS
        targets = torch.where(real, target, IGNORE)
        inputs = torch.cat([torch.full((n, 1), BOS), target[:, :-1]], dim=1)  # teacher forcing
        return Seq2SeqBatch(inputs, targets, source, source_mask)

    def train_batch(self, batch_size: int, generator: torch.Generator) -> Seq2SeqBatch:
        return self.sample(batch_size, generator)

    def val_batches(self, batch_size: int, n_batches: int, factor: int = 1) -> list[Batch]:
        generator = torch.Generator().manual_seed(VAL_SEED + factor)
        return [self.sample(batch_size, generator, factor) for _ in range(n_batches)]

    @classmethod
    def planned_vocab_size(cls, options: Mapping[str, Any]) -> int | None:
        return planned_sum(FIRST_SYMBOL, options.get("n_symbols", 16))

    @classmethod
    def build_model(cls, raw: Mapping[str, Any], specs: Sequence[Any] | None = None) -> nn.Module:
        """An encoder-decoder (zoo.build_seq2seq: its stacks' specs come from ``raw``'s block and encoder)."""
        return build_seq2seq(raw)

    def logits(self, model: nn.Module, batch: Seq2SeqBatch) -> torch.Tensor:  # type: ignore[override]
        """The encoder reads the source under its mask, the decoder ``inputs`` (the teacher-forced target)."""
        return model(batch.source, batch.inputs, src_mask=batch.source_mask)

    def score(self, model: nn.Module, batch: Seq2SeqBatch, logits: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        sums = super().score(model, batch, logits)
        sums["exact"] = torch.tensor(float(self.exact_matches(model, batch)), dtype=torch.float64)
        sums["sequences"] = torch.tensor(float(batch.targets.shape[0]), dtype=torch.float64)
        return sums

    def compute(self, sums: Mapping[str, float]) -> dict[str, float]:
        count = max(sums["count"], 1)
        return {
            "accuracy": sums["correct"] / count,
            "loss": sums["loss_sum"] / count,
            "exact_match": sums["exact"] / max(sums["sequences"], 1),
        }

    @staticmethod
    def exact_matches(model: Any, batch: Seq2SeqBatch) -> int:
        """Greedy decoding with the cross-attention cache: how many targets come out right up to
        and including EOS (what follows EOS is not scored)."""
        generated = model.generate(
            batch.source, batch.targets.shape[1], src_mask=batch.source_mask, bos_id=BOS, use_cache=True
        )
        scored = batch.targets != IGNORE
        return int(((generated == batch.targets) | ~scored).all(dim=1).sum())

    def info(self) -> dict[str, Any]:
        return {
            "task": self.name,
            "source": "generated",
            "op": self.op,
            "seq_len": self.seq_len,
            "vocab_size": self.vocab_size,
            "val_seed": VAL_SEED,
        }
