"""A sparse mixture-of-experts MLP: a router sends each token to its top-k experts, each expert a
registered MLP (SwiGLU by default), plus optional always-on shared experts.

Dropless: every token reaches its top-k experts, whatever the others do, so a token's output
depends on that token alone (causal, batch-independent). Grouped: the (token, expert) pairs are
sorted by expert and each expert runs once, as one call on its contiguous slice of tokens; the
results are scattered back with one index_add. There is no loop over tokens.

The load-balancing loss (Switch Transformer) and the router z-loss (ST-MoE) are recorded as the
auxiliary losses ``balance`` and ``router_z`` (zoo.core.auxiliary). Under ``balance: bias`` (DeepSeek-V3's
auxiliary-loss-free balancing) a per-expert bias, a buffer, chooses the top k instead, nudged toward the
mean load after each optimizer step (:meth:`MoE.after_step`); ``balance`` is then logged detached, a
measure of the load that trains nothing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from zoo.core.auxiliary import record_aux
from zoo.core.dims import BlockDims
from zoo.core.errors import ConfigError
from zoo.core.registry import MLPS
from zoo.core.tp import Chain, Plan, PrepareModuleOutput, Replicate, Replicated, Shard, gather_sequence, prefixed
from zoo.parts.mlps import MLP

Routing = Literal["softmax", "sigmoid"]
Balance = Literal["loss", "bias"]
#: ``block.mlp.bias_rate``'s default: the step balance=bias moves each expert's bias by after each optimizer step.
BIAS_RATE = 0.001


def route(
    logits: torch.Tensor, top_k: int, routing: str, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router logits (n, experts) -> (gate weights (n, k), chosen experts (n, k), router probabilities
    (n, experts)).

    softmax (Mixtral): the top-k of softmax(logits), renormalized to sum to 1.
    sigmoid (DeepSeek-V3): the top-k of sigmoid(logits), normalized to sum to 1; the probabilities
    the balance loss reads are the sigmoid scores normalized over every expert. Both are computed as a
    softmax over logsigmoid(logits) (the same ratios), so they stay finite where every sigmoid underflows.
    ``bias`` (experts,): added to the scores (the softmax probabilities, the sigmoids) only to choose the
    top k; the gate weights and probabilities are the unbiased scores' (DeepSeek-V3, arXiv:2412.19437 §2.1.2).
    """
    if routing == "softmax":
        probs = logits.softmax(-1)
        if bias is None:
            weights, chosen = probs.topk(top_k, dim=-1)
        else:
            chosen = (probs.detach() + bias).topk(top_k, dim=-1).indices
            weights = probs.gather(-1, chosen)
        return weights / weights.sum(-1, keepdim=True), chosen, probs
    log_scores = F.logsigmoid(logits)
    if bias is None:
        chosen = logits.topk(top_k, dim=-1).indices  # sigmoid is increasing: the same experts as its top-k
    else:
        chosen = (logits.detach().sigmoid() + bias).topk(top_k, dim=-1).indices
    return log_scores.gather(-1, chosen).softmax(-1), chosen, log_scores.softmax(-1)


class Router(nn.Linear):
    """The router's linear map, computed in at least float32 (bf16 logits would flip near-tied choices)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)
        return F.linear(x.to(dtype), self.weight.to(dtype))


@MLPS.register(
    "moe",
    formula="sum over the top_k experts e of router(x): w_e(x) * expert_e(x) [+ shared(x)]",
    reference=(
        "Shazeer et al. 2017, arXiv:1701.06538; Fedus et al. 2021, Switch Transformers, arXiv:2101.03961; "
        "Jiang et al. 2024, Mixtral of Experts, arXiv:2401.04088; Dai et al. 2024, DeepSeekMoE, arXiv:2401.06066"
    ),
    variants={"deepseek": {"routing": "sigmoid", "n_shared": 1, "n_experts": 4}},
)
class MoE(MLP):
    """Sparse mixture of experts: each token goes to its top_k of n_experts expert MLPs (dropless).

    Each expert is the registered MLP ``expert`` at hidden width d_ff (default: that MLP's default),
    so under ``block.mlp.match`` the matched width is each expert's. ``n_shared`` > 0 adds a shared
    expert every token goes through, of width n_shared x d_ff (DeepSeekMoE's shared experts, fused).
    Parameters: ``router`` (no bias), ``experts.{i}.*`` (the expert MLP's own), ``shared.*``.

    ``balance``: ``loss`` trains the router toward balance with the ``balance`` auxiliary loss; ``bias``
    keeps the buffer ``expert_bias`` (n_experts,), added to the scores only to choose the top k and moved
    by ``bias_rate`` x sign(mean load - load) after each optimizer step (:meth:`after_step`), no loss.
    """

    aux_losses = {"balance": 0.01, "router_z": 0.001}
    contract_exceptions = {
        **dict.fromkeys(
            (
                "gradients reach the input and every parameter",
                "cross attention gradients reach memory and every parameter",
            ),
            "sparse by design: an expert that no token of the batch is routed to gets no gradient "
            "(tests/test_moe.py checks that every expert, the router and the shared expert get one once routed to)",
        ),
        "bfloat16 close to float32": (
            "top-k routing is discontinuous: a token whose k-th and next router scores lie within bfloat16 rounding "
            "goes to another expert, and its output changes entirely (tests/test_moe.py checks bfloat16 is close "
            "wherever the routing is the same)"
        ),
    }

    def __init__(
        self,
        dims: BlockDims,
        *,
        n_experts: int = 8,
        top_k: int = 2,
        expert: str = "swiglu",
        n_shared: int = 0,
        routing: Routing = "softmax",
        balance: Balance = "loss",
        bias_rate: float = BIAS_RATE,
    ) -> None:
        expert_cls = MLPS.get(expert).cls
        super().__init__(replace(dims, d_ff=dims.d_ff or expert_cls.default_width(dims.d_model)))
        self.n_experts, self.top_k, self.routing = n_experts, top_k, routing
        self.balance, self.bias_rate = balance, bias_rate
        expert_dims = replace(dims, d_ff=self.hidden)
        self.router = Router(dims.d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(expert_cls(expert_dims) for _ in range(n_experts))
        self.shared = expert_cls(replace(dims, d_ff=n_shared * self.hidden)) if n_shared else None
        #: Tokens each expert received in the last forward (n_experts,), for routing statistics.
        self.last_counts: torch.Tensor | None = None
        #: balance=bias: the tokens each expert received in the last training forward, until after_step reads them.
        self.train_load: torch.Tensor | None = None
        if balance == "bias":  # a buffer: saved with the weights, no gradient, no optimizer state
            self.register_buffer("expert_bias", torch.zeros(n_experts))

    @classmethod
    def check(
        cls, dims: BlockDims, *, n_experts: int, top_k: int, expert: str, n_shared: int, routing: str, balance: str,
        bias_rate: float,
    ) -> None:
        if n_experts < 1:
            raise ConfigError("block.mlp.n_experts", n_experts, "must be a positive integer")
        if not 1 <= top_k <= n_experts:
            raise ConfigError("block.mlp.top_k", top_k, f"must be in 1..n_experts={n_experts}")
        if n_shared < 0:
            raise ConfigError("block.mlp.n_shared", n_shared, "must be >= 0 (0: no shared expert)")
        experts = [name for name in MLPS.names() if not issubclass(MLPS.get(name).cls, MoE)]
        if expert not in experts:
            raise ConfigError("block.mlp.expert", expert, f"a registered dense MLP: {', '.join(experts)}")
        if not bias_rate > 0:
            raise ConfigError("block.mlp.bias_rate", bias_rate, "must be > 0 (the bias's step per optimizer step)")
        if balance != "bias" and bias_rate != BIAS_RATE:
            raise ConfigError("block.mlp.bias_rate", bias_rate, f"moves the bias of balance=bias only (balance="
                              f"{balance} here, where it would do nothing): set block.mlp.balance=bias, or leave it at "
                              f"{BIAS_RATE}")  # fmt: skip

    @classmethod
    def check_tp(cls, dims: BlockDims, tp: int, *, expert: str, n_shared: int, **options: object) -> None:
        """Each expert's (and the shared expert's) hidden width must split evenly between the ``tp`` ranks."""
        expert_cls = MLPS.get(expert).cls
        expert_cls.check_tp(dims, tp)
        if n_shared:
            hidden = dims.d_ff or expert_cls.default_width(dims.d_model)
            expert_cls.check_tp(replace(dims, d_ff=n_shared * hidden), tp)

    def tp_plan(self, sequence_parallel: bool) -> Plan:
        """The router runs whole on every rank (every rank routes the same tokens the same way); each
        expert and the shared expert shard as their MLP does (hidden units split, outputs all-reduced).
        Under sequence parallelism the input is gathered whole and the output cut back to this rank's
        tokens."""
        plan: Plan = {"router": Replicated()}
        for i, expert in enumerate(self.experts):
            plan.update(prefixed(f"experts.{i}", expert.tp_plan(False)))
        if self.shared is not None:
            plan.update(prefixed("shared", self.shared.tp_plan(False)))
        if sequence_parallel:
            keep_mine = PrepareModuleOutput(
                output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),), use_local_output=True
            )
            plan[""] = Chain(gather_sequence(), keep_mine)
        return plan

    def matrix_blocks(self) -> dict[str, dict[str, torch.Tensor]]:
        """Nothing fused of its own: ``router`` is one matrix; each expert (and the shared expert) is a
        part that declares its own."""
        return {}

    def active_parameters(self) -> int:
        """Parameters one token uses: the router, top_k experts and the shared expert."""
        count = self.router.weight.numel() + self.top_k * sum(p.numel() for p in self.experts[0].parameters())
        return count + (sum(p.numel() for p in self.shared.parameters()) if self.shared is not None else 0)

    def extra_repr(self) -> str:
        shared = f", shared={self.shared.hidden}" if self.shared is not None else ""
        balance = f", balance=bias, bias_rate={self.bias_rate:g}" if self.balance == "bias" else ""
        return (f"experts={self.n_experts}, top_k={self.top_k}, hidden={self.hidden}, routing={self.routing}"
                f"{shared}{balance}")  # fmt: skip

    @torch.no_grad()
    def after_step(self) -> None:
        """balance=bias: each expert's bias += bias_rate x sign(mean load - load), the load being the tokens
        routed to it in the last training forward (summed over every process, so every rank's bias stays the
        same; a tensor-parallel group counts its tokens once per rank, which leaves every sign unchanged).
        The load is consumed; without a training forward since the last call, nothing moves."""
        if self.balance != "bias" or self.train_load is None:
            return
        load = self.train_load.to(self.expert_bias.dtype)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(load)
        self.expert_bias += self.bias_rate * (load.mean() - load).sign()
        self.train_load = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = rearrange(x, "... d -> (...) d")  # (n tokens, d)
        logits = self.router(flat)  # (n, experts), at least float32
        dtype = logits.dtype
        bias = self.expert_bias if self.balance == "bias" else None
        weights, chosen, probs = route(logits, self.top_k, self.routing, bias)  # (n, k), (n, k), (n, experts)

        # Group: sort the n * k (token, expert) pairs by expert; expert e gets one contiguous slice.
        pair_expert = rearrange(chosen, "n k -> (n k)")
        order = pair_expert.argsort(stable=True)
        token_of = torch.div(order, self.top_k, rounding_mode="floor")  # the token of each sorted pair
        # Tokens per expert (bincount's output length would depend on the data, which torch.compile cannot capture)
        counts = torch.zeros(self.n_experts, dtype=torch.long, device=x.device).index_add_(
            0, pair_expert, torch.ones_like(pair_expert)
        )
        self.last_counts = counts.detach()
        grouped = flat.index_select(0, token_of)  # (n k, d), expert 0's tokens first
        outputs = [expert(part) for expert, part in zip(self.experts, grouped.split(counts.tolist()), strict=True)]
        gate = rearrange(weights, "n k -> (n k)")[order].to(x.dtype)
        y = torch.zeros_like(flat).index_add_(0, token_of, torch.cat(outputs) * gate[:, None])
        if self.shared is not None:
            y = y + self.shared(flat)

        if self.training and torch.is_grad_enabled():
            fraction = counts.to(dtype) / pair_expert.numel()  # f_e: share of routed pairs
            balance = self.n_experts * (fraction * probs.mean(0)).sum()
            record_aux(self, "balance", balance if self.balance == "loss" else balance.detach())  # bias: a measure
            if self.balance == "bias":
                self.train_load = counts.detach()
            record_aux(self, "router_z", torch.logsumexp(logits, -1).square().mean())
        return y.view_as(x)


MLPS.document(
    "balance",
    values="loss, bias",
    formula="loss: the balance auxiliary loss n_experts sum_e f_e P_e trains the router. bias: experts chosen by "
    "top_k(s + b), gates from s alone (s: the softmax or sigmoid scores); after each optimizer step "
    "b_e += bias_rate sign(mean load - load_e), load_e the tokens routed to e in the step (over every process); "
    "aux_balance is logged detached",
    cost="0 counted: n_experts additions per token to choose and a buffer of n_experts floats, no parameter; "
    "one all-reduce of n_experts counts per step under torchrun",
    reference="Wang et al. 2024, Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts, "
    "arXiv:2408.15664; DeepSeek-AI 2024, DeepSeek-V3, arXiv:2412.19437",
)
