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
from torch import nn

from zoo.core import tp
from zoo.core.auxiliary import record_aux
from zoo.core.dims import BlockDims
from zoo.core.errors import ConfigError
from zoo.core.registry import MLPS
from zoo.core.reshape import rearrange
from zoo.core.tp import Plan, gather_sequence, prefixed
from zoo.parts.mlps import MLP

Routing = Literal["softmax", "sigmoid"]
Balance = Literal["loss", "bias"]
#: ``block.mlp.bias_rate``'s default: the step balance=bias moves each expert's bias by after each optimizer step.
BIAS_RATE = 0.001


def choose(scores: torch.Tensor, top_k: int, groups: tuple[int, int] = (1, 1)) -> torch.Tensor:
    """The top_k experts of ``scores`` (n, experts); with ``groups`` = (n_groups, top_groups) and n_groups > 1, only
    among the experts of the top_groups groups (experts in n_groups equal runs) whose two best scores sum highest
    (DeepSeek-V3's group-limited routing, arXiv:2412.19437 §2.1.2)."""
    n_groups, top_groups = groups
    if n_groups > 1:
        grouped = rearrange(scores, "n (g e) -> n g e", g=n_groups)
        best = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)  # (n, groups)
        kept = torch.zeros_like(best, dtype=torch.bool).scatter_(1, best.topk(top_groups, dim=-1).indices, True)
        scores = rearrange(grouped.masked_fill(~kept[..., None], float("-inf")), "n g e -> n (g e)")
    return scores.topk(top_k, dim=-1).indices


def route(
    logits: torch.Tensor,
    top_k: int,
    routing: str,
    bias: torch.Tensor | None = None,
    *,
    normalize: bool = True,
    groups: tuple[int, int] = (1, 1),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Router logits (n, experts) -> (gate weights (n, k), chosen experts (n, k), router probabilities
    (n, experts)).

    softmax (Mixtral): the top-k of softmax(logits), renormalized to sum to 1 (the same weights as a softmax over
    the top-k logits alone, gpt-oss's order). sigmoid (DeepSeek-V3): the top-k of sigmoid(logits), normalized to
    sum to 1; the probabilities the balance loss reads are the sigmoid scores normalized over every expert. Both
    are computed as a softmax over logsigmoid(logits) (the same ratios), so they stay finite where every sigmoid
    underflows. ``normalize`` False: the top-k scores as they are (norm_topk_prob false).
    ``bias`` (experts,): added to the scores (the softmax probabilities, the sigmoids) only to choose the
    top k; the gate weights and probabilities are the unbiased scores' (DeepSeek-V3, arXiv:2412.19437 §2.1.2).
    ``groups``: (n_groups, top_groups) of :func:`choose`, on the scores the choice reads.
    """
    plain = bias is None and groups[0] == 1  # the choice is the top k of the scores themselves
    if routing == "softmax":
        probs = logits.softmax(-1)
        if plain:
            weights, chosen = probs.topk(top_k, dim=-1)
        else:
            scores = probs.detach() if bias is None else probs.detach() + bias
            chosen = choose(scores, top_k, groups)
            weights = probs.gather(-1, chosen)
        return (weights / weights.sum(-1, keepdim=True) if normalize else weights), chosen, probs
    log_scores = F.logsigmoid(logits)
    if plain:
        chosen = logits.topk(top_k, dim=-1).indices  # sigmoid is increasing: the same experts as its top-k
    else:
        scores = logits.detach().sigmoid()
        chosen = choose(scores if bias is None else scores + bias, top_k, groups)
    picked = log_scores.gather(-1, chosen)
    return (picked.softmax(-1) if normalize else picked.exp()), chosen, log_scores.softmax(-1)


class Router(nn.Linear):
    """The router's linear map (with its bias, if any), computed in at least float32 (bf16 logits would flip
    near-tied choices)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)
        bias = None if self.bias is None else self.bias.to(dtype)
        return F.linear(x.to(dtype), self.weight.to(dtype), bias)


@MLPS.register(
    "moe",
    formula="sum over the top_k experts e of router(x): s w_e(x) * expert_e(x) [+ g(x) shared(x)], s = "
    "routed_scaling_factor, w the top_k scores (normalized to sum 1 unless normalize: false), chosen among the "
    "top_groups of n_groups groups by their two best scores; g = sigmoid(w_g x) under shared_gate, else 1",
    reference=(
        "Shazeer et al. 2017, arXiv:1701.06538; Fedus et al. 2021, Switch Transformers, arXiv:2101.03961; "
        "Jiang et al. 2024, Mixtral of Experts, arXiv:2401.04088; Dai et al. 2024, DeepSeekMoE, arXiv:2401.06066; "
        "DeepSeek-AI 2024, DeepSeek-V3, arXiv:2412.19437 (groups, routed_scaling_factor); Qwen3-Next (shared_gate); "
        "OpenAI 2025, gpt-oss (router_bias)"
    ),
    variants={
        "deepseek": {"routing": "sigmoid", "n_shared": 1, "n_experts": 4, "n_groups": 2, "top_groups": 1,
                     "routed_scaling_factor": 2.5, "balance": "bias"},
        "gated": {"n_shared": 1, "shared_gate": True, "router_bias": True, "normalize": False},
    },  # fmt: skip
)
class MoE(MLP):
    """Sparse mixture of experts: each token goes to its top_k of n_experts expert MLPs (dropless).

    Each expert is the registered MLP ``expert`` at hidden width d_ff (default: that MLP's default),
    so under ``block.mlp.match`` the matched width is each expert's. ``n_shared`` > 0 adds a shared
    expert every token goes through, of width n_shared x d_ff (DeepSeekMoE's shared experts, fused).
    Parameters: ``router`` (its bias under ``router_bias``: gpt-oss), ``experts.{i}.*`` (the expert MLP's own),
    ``shared.*``, ``shared_gate`` (under ``shared_gate``: a sigmoid gate per token on the shared expert, Qwen3-Next's).

    ``normalize`` (norm_topk_prob): the top_k weights divided by their sum (true) or the scores as they are.
    ``routed_scaling_factor``: the routed experts' sum multiplied by it (DeepSeek-V3: 2.5). ``n_groups`` > 1: the
    experts split into n_groups equal runs, and a token's top_k chosen among the ``top_groups`` groups whose two
    best choice scores (bias included) sum highest (DeepSeek-V3's group-limited routing: 8 groups, 4 kept).

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
        normalize: bool = True,
        routed_scaling_factor: float = 1.0,
        n_groups: int = 1,
        top_groups: int = 1,
        router_bias: bool = False,
        shared_gate: bool = False,
    ) -> None:
        expert_cls = MLPS.get(expert).cls
        super().__init__(replace(dims, d_ff=dims.d_ff or expert_cls.default_width(dims.d_model)))
        self.n_experts, self.top_k, self.routing = n_experts, top_k, routing
        self.balance, self.bias_rate = balance, bias_rate
        self.normalize, self.routed_scaling_factor = normalize, routed_scaling_factor
        self.groups = (n_groups, top_groups)
        expert_dims = replace(dims, d_ff=self.hidden)
        self.router = Router(dims.d_model, n_experts, bias=router_bias)
        self.experts = nn.ModuleList(expert_cls(expert_dims) for _ in range(n_experts))
        self.shared = expert_cls(replace(dims, d_ff=n_shared * self.hidden)) if n_shared else None
        self.shared_gate = nn.Linear(dims.d_model, 1, bias=False) if shared_gate else None
        #: Tokens each expert received in the last forward (n_experts,), for routing statistics.
        self.last_counts: torch.Tensor | None = None
        #: balance=bias: the tokens each expert received in the last training forward, until after_step reads them.
        self.train_load: torch.Tensor | None = None
        if balance == "bias":  # a buffer: saved with the weights, no gradient, no optimizer state
            self.register_buffer("expert_bias", torch.zeros(n_experts))

    @classmethod
    def check(
        cls, dims: BlockDims, *, n_experts: int, top_k: int, expert: str, n_shared: int, routing: str, balance: str,
        bias_rate: float, normalize: bool, routed_scaling_factor: float, n_groups: int, top_groups: int,
        router_bias: bool, shared_gate: bool,
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
        if not routed_scaling_factor > 0:
            raise ConfigError("block.mlp.routed_scaling_factor", routed_scaling_factor, "must be > 0")
        if n_groups < 1 or n_experts % n_groups:
            raise ConfigError("block.mlp.n_groups", n_groups, f"must divide block.mlp.n_experts={n_experts}")
        if not 1 <= top_groups <= n_groups:
            raise ConfigError("block.mlp.top_groups", top_groups, f"must be in 1..n_groups={n_groups}")
        if top_k > top_groups * (n_experts // n_groups):
            raise ConfigError(
                "block.mlp.top_k", top_k, f"must be at most the {top_groups * (n_experts // n_groups)} experts of the "
                f"top_groups={top_groups} groups kept"
            )
        if shared_gate and not n_shared:
            raise ConfigError("block.mlp.shared_gate", shared_gate, "needs a shared expert (block.mlp.n_shared >= 1)")
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
        plan: Plan = {"router": tp.Replicated()}
        if self.shared_gate is not None:
            plan["shared_gate"] = tp.Replicated()
        for i, expert in enumerate(self.experts):
            plan.update(prefixed(f"experts.{i}", expert.tp_plan(False)))
        if self.shared is not None:
            plan.update(prefixed("shared", self.shared.tp_plan(False)))
        if sequence_parallel:
            keep_mine = tp.PrepareModuleOutput(
                output_layouts=(tp.Replicate(),), desired_output_layouts=(tp.Shard(1),), use_local_output=True
            )
            plan[""] = tp.Chain(gather_sequence(), keep_mine)
        return plan

    def matrix_blocks(self) -> dict[str, dict[str, torch.Tensor]]:
        """Nothing fused of its own: ``router`` (and ``shared_gate``) is one matrix; each expert (and the shared
        expert) is a part that declares its own."""
        return {}

    def active_parameters(self) -> int:
        """Parameters one token uses: the router, top_k experts and the shared expert (and its gate)."""
        routed = sum(p.numel() for p in self.router.parameters())
        count = routed + self.top_k * sum(p.numel() for p in self.experts[0].parameters())
        shared = [m for m in (self.shared, self.shared_gate) if m is not None]
        return count + sum(p.numel() for m in shared for p in m.parameters())

    def extra_repr(self) -> str:
        shared = f", shared={self.shared.hidden}" if self.shared is not None else ""
        shared += ", shared_gate" if self.shared_gate is not None else ""
        balance = f", balance=bias, bias_rate={self.bias_rate:g}" if self.balance == "bias" else ""
        routing = "" if self.normalize else ", normalize=False"
        routing += f", scale={self.routed_scaling_factor:g}" if self.routed_scaling_factor != 1.0 else ""
        routing += f", groups={self.groups[1]} of {self.groups[0]}" if self.groups[0] > 1 else ""
        return (f"experts={self.n_experts}, top_k={self.top_k}, hidden={self.hidden}, routing={self.routing}"
                f"{routing}{shared}{balance}")  # fmt: skip

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
        weights, chosen, probs = route(
            logits, self.top_k, self.routing, bias, normalize=self.normalize, groups=self.groups
        )  # (n, k), (n, k), (n, experts)
        if self.routed_scaling_factor != 1.0:
            weights = weights * self.routed_scaling_factor

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
            shared = self.shared(flat)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(flat)) * shared
            y = y + shared

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
