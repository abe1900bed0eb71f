"""The training objective, ``objective=<name>``: what a language model learns to predict.

``ntp`` (the default) is next-token prediction alone. ``mtp`` also predicts the ``k`` tokens after the
next one, each through an extra head beside the next-token head (:mod:`zoo.models.mtp`), and adds
``weight`` x the mean of their losses to the next-token loss (the trainer: zoo.lab.training.step). The
model's forward, evaluation, generation and every way back from a run folder read the next-token head only.

An objective is a class whose keyword-only constructor arguments are its options (``objective.k=2``:
type-checked, misspellings named), registered with ``@OBJECTIVES.register("name")`` plus an option file
``conf/objective/<name>.yaml``, like the recipe's optimizers and schedules.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from torch import nn

from zoo.assembly.spec import BlockSpec
from zoo.core.errors import ConfigError
from zoo.core.options import named_section, resolve_options
from zoo.core.registry import Registry
from zoo.models.mtp import Carry, FutureHeads, HeadsForm

#: ``objective=<name>``: what the model is trained to predict.
OBJECTIVES = Registry("objective", where="objective.name")
#: The default entry (``conf/config.yaml``'s ``objective: ntp``).
DEFAULT = "ntp"

Anneal = Literal["none", "linear"]


class Objective:
    """An ``objective=<name>`` entry: the extra heads a model carries and the weight of their losses."""

    #: Tokens predicted beyond the next one: the number of extra heads (0: next-token prediction alone).
    extra: int = 0
    #: What it adds to a token's training FLOPs (``flops_per_token``), for the catalogue (docs/parts.md).
    cost: ClassVar[str] = "nothing"

    @property
    def name(self) -> str:
        """The name it is registered under (``ntp``, ``mtp``)."""
        return next(part.name for part in OBJECTIVES.parts() if type(self) is part.cls)

    def heads(self, spec: BlockSpec) -> nn.Module | None:
        """The extra heads of a model whose last block is ``spec``; None: none."""
        return None

    def weight_at(self, step: int, steps: int) -> float:
        """The weight of the extra heads' mean loss at 0-based ``step`` of ``steps``."""
        return 0.0


@OBJECTIVES.register(
    "ntp",
    formula="L = mean_t CE(head(h_t), x_{t+1})",
    reference="Bengio et al. 2003, A Neural Probabilistic Language Model, JMLR 3",
)
class NextToken(Objective):
    """Next-token prediction: the loss is the next token's cross-entropy alone."""


@OBJECTIVES.register(
    "mtp",
    formula="L = L_ntp + lambda / k sum_{j=1..k} mean_t CE(head(norm_j(s_j(t))), x_{t+j+1}); sequential: "
    "s_j(t) = block_j(proj_j([norm(c_{j-1}(t)); norm(embed(x_{t+j}))])), c_0 = h the trunk's final hidden state, "
    "c_j = s_j (carry: block, the paper's equations) or norm_j(s_j) (carry: normed, transformers' and "
    "Megatron-LM's); independent: s_j(t) = block_j(h_t); lambda = weight, or weight (1 - step / steps) under "
    "anneal: linear",
    reference="DeepSeek-AI 2024, DeepSeek-V3 Technical Report §2.2, arXiv:2412.19437; Gloeckle et al. 2024, "
    "Better & Faster Large Language Models via Multi-token Prediction, arXiv:2404.19737",
)
class MultiToken(Objective):
    """Multi-token prediction: k extra heads predict the tokens after the next one, trained beside it.

    ``heads``: ``sequential`` (DeepSeek-V3's MTP modules: depth j combines depth j - 1's hidden state with the
    embedding of token t + j, through norms, a concatenation, a projection and one block) or ``independent``
    (one block per future offset on the trunk's final hidden state). Both share the embedding and the LM head.
    ``weight``: lambda on the mean of the extra losses; ``anneal: linear`` takes it linearly to 0 by the end.
    ``carry`` (sequential): what depth j hands depth j + 1, its block's output (``block``: DeepSeek-V3's equations)
    or its final-normed state (``normed``: transformers' and Megatron-LM's MTP layers); the same at k = 1.
    """

    cost = ("k x (6 P + 6 seq_len d_model + 6 vocab d_model): each depth's parameters P (its block, its norms; "
            "sequential: the 2 d_model x d_model projection too), its attention and the shared head's matmul, "
            "counted over every token")  # fmt: skip

    def __init__(
        self,
        *,
        k: int = 1,
        heads: HeadsForm = "sequential",
        weight: float = 0.3,
        anneal: Anneal = "none",
        carry: Carry = "block",
    ) -> None:
        if k < 1:
            raise ConfigError("objective.k", k, "must be a positive integer (the tokens predicted past the next)")
        if not weight >= 0:
            raise ConfigError("objective.weight", weight, "must be >= 0 (lambda on the mean of the extra losses)")
        self.extra, self.form, self.weight, self.anneal, self.carry = k, heads, weight, anneal, carry

    def heads(self, spec: BlockSpec) -> nn.Module:
        return FutureHeads(spec, self.extra, self.form, self.carry)

    def weight_at(self, step: int, steps: int) -> float:
        return self.weight * (1 - step / steps) if self.anneal == "linear" else self.weight


def objective_entry(section: Any) -> Objective:
    """The ``objective`` section's entry with its options (a name alone, a mapping, or None: the default);
    a ConfigError naming ``objective.<key>`` for an unknown name or key, a wrong type or a bad value."""
    part, raw = named_section(OBJECTIVES, "objective", section, DEFAULT)
    return part.cls(**resolve_options(part, raw, "objective"))


__all__ = ["DEFAULT", "OBJECTIVES", "MultiToken", "NextToken", "Objective", "objective_entry"]
