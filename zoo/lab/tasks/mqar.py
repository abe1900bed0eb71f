"""``mqar``: multi-query associative recall, generated on the fly (Arora et al. 2023, Zoology).

A sequence is ``n_pairs`` key-value pairs, then ``n_queries`` of those keys each followed by its
value: ``k1 v1 k2 v2 ... kn vn | q1 a1 q2 a2 ...``. Only the query positions are scored: at ``qj``
the model must predict ``aj``, the value stored with that key earlier in the sequence. Keys are
tokens ``[0, n_keys)``, values ``[n_keys, n_keys + n_values)``; keys within a sequence are distinct.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from einops import rearrange

from zoo.core.errors import ConfigError
from zoo.lab.tasks.base import IGNORE, Batch, Task, planned_sum, positive, register_task

#: Validation sequences are drawn from this seed: every run is scored on the same set.
VAL_SEED = 1234


@register_task("mqar")
class MQARTask(Task):
    """Multi-query associative recall. Metrics: ``val_accuracy`` and ``val_loss`` on query positions.

    At ``k`` times the trained length, a sequence holds ``k * n_pairs`` pairs and ``k * n_queries`` queries.
    """

    metrics = {"accuracy": "max", "loss": "min"}

    def __init__(
        self,
        *,
        n_pairs: int = 8,
        n_queries: int = 8,
        n_keys: int = 64,
        n_values: int = 64,
        eval_lengths: tuple[int, ...] = (1,),
        metric: str | None = None,
    ) -> None:
        super().__init__(eval_lengths=eval_lengths, metric=metric)
        for field, value in [
            ("n_pairs", n_pairs),
            ("n_queries", n_queries),
            ("n_keys", n_keys),
            ("n_values", n_values),
        ]:
            positive(f"task.{field}", value)
        if n_queries > n_pairs:
            raise ConfigError(
                "task.n_queries", n_queries, f"at most n_pairs={n_pairs} (each query asks a distinct key)"
            )
        longest = n_pairs * max(eval_lengths)
        if n_keys < longest:
            raise ConfigError(
                "task.n_keys",
                n_keys,
                f"at least n_pairs x max(eval_lengths) = {longest} (keys in a sequence are distinct)",
            )
        self.n_pairs, self.n_queries, self.n_keys, self.n_values = n_pairs, n_queries, n_keys, n_values
        self.vocab_size = n_keys + n_values
        self.seq_len = 2 * (n_pairs + n_queries)

    @classmethod
    def planned_vocab_size(cls, options: Mapping[str, Any]) -> int | None:
        return planned_sum(options.get("n_keys", 64), options.get("n_values", 64))

    @classmethod
    def planned_seq_len(cls, options: Mapping[str, Any]) -> int | None:
        return planned_sum(2 * options.get("n_pairs", 8), 2 * options.get("n_queries", 8))

    def sample(self, n: int, generator: torch.Generator, factor: int = 1) -> Batch:
        """``n`` sequences of length ``factor * seq_len``."""
        pairs, queries = self.n_pairs * factor, self.n_queries * factor
        keys = torch.rand(n, self.n_keys, generator=generator).argsort(dim=1)[:, :pairs]  # distinct per row
        values = torch.randint(self.n_keys, self.vocab_size, (n, pairs), generator=generator)
        asked = torch.rand(n, pairs, generator=generator).argsort(dim=1)[:, :queries]  # which pairs are queried
        q_keys, q_values = keys.gather(1, asked), values.gather(1, asked)
        context = rearrange([keys, values], "two b n -> b (n two)")  # k1 v1 k2 v2 ...
        probe = rearrange([q_keys, q_values], "two b n -> b (n two)")  # q1 a1 q2 a2 ...
        inputs = torch.cat([context, probe], dim=1)  # (b, 2 (pairs + queries))
        targets = torch.full_like(inputs, IGNORE)
        targets[:, 2 * pairs :: 2] = q_values  # at each query key, predict its value
        return Batch(inputs, targets)

    def train_batch(self, batch_size: int, generator: torch.Generator) -> Batch:
        return self.sample(batch_size, generator)

    def val_batches(self, batch_size: int, n_batches: int, factor: int = 1) -> list[Batch]:
        generator = torch.Generator().manual_seed(VAL_SEED + factor)
        return [self.sample(batch_size, generator, factor) for _ in range(n_batches)]

    def compute(self, sums: Mapping[str, float]) -> dict[str, float]:
        count = max(sums["count"], 1)
        return {"accuracy": sums["correct"] / count, "loss": sums["loss_sum"] / count}

    def info(self) -> dict[str, Any]:
        return {
            "task": self.name,
            "source": "generated",
            "seq_len": self.seq_len,
            "vocab_size": self.vocab_size,
            "val_seed": VAL_SEED,
        }
