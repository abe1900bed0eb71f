"""``optim=muon``: Muon (momentum, then the update orthogonalized by a Newton-Schulz iteration) for the
hidden matrices, AdamW for everything else, as the Muon reference prescribes.

Which parameter is a hidden matrix is read from the parts, never guessed from shapes: a parameter
belongs to the innermost part module holding it, and that part's ``matrix_blocks`` hook
(zoo.core.interface) says how its fused weights split into logical matrices (the query, key and
value rows of ``qkv``; gate and up of ``gate_up``; ...). Every other 2-D parameter of a declaring part
is one logical matrix. The rest gets AdamW: the token embedding, the LM head, learned position
tables (the model's, outside every part), norms, biases, a depthwise convolution's kernel (channels,
1, taps: one filter per channel, not a matrix), and every parameter of a part that declares nothing
(the conservative treatment).

A parameter that is one logical matrix is updated by ``torch.optim.Muon``; a fused one by the same
update applied to each of its logical matrices separately, with one batched Newton-Schulz iteration
over every block of a shape (tests/test_muon.py checks it against ``torch.optim.Muon`` on the
separate matrices).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from einops import rearrange
from torch import nn

from zoo.core.errors import ConfigError
from zoo.core.interface import hook
from zoo.core.matrices import check_blocks, depthwise_kernel, part_modules
from zoo.lab.recipe.base import OPTIMIZERS, Optimizer

#: The reference's quintic Newton-Schulz coefficients (torch.optim.Muon's, Keller Jordan's).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7
ADJUST_LR = ("original", "match_rms_adamw")

# -- which parameter is which -----------------------------------------------------------------------


@dataclass(frozen=True)
class Treatment:
    """How one parameter is optimized: ``muon`` (one logical matrix), ``blocks`` (several, ``blocks``:
    name -> row indices) or ``adamw``, with the owning part (``owner``, a module name; None: no part)
    and, for ``adamw``, why."""

    kind: Literal["muon", "blocks", "adamw"]
    owner: str | None
    blocks: Mapping[str, torch.Tensor] | None = None
    why: str = ""


def treatments(model: nn.Module) -> dict[str, Treatment]:
    """Every parameter of ``model`` (by name, tied ones once) and how ``optim=muon`` optimizes it."""
    parts = part_modules(model)
    declared = {name: hook(module, "matrix_blocks")() for name, module in parts.items()}
    for name, blocks in declared.items():
        if blocks is not None:
            check_blocks(parts[name], name, blocks)
    found: dict[str, Treatment] = {}
    for name, param in model.named_parameters():
        owner = max((p for p in parts if p == "" or name.startswith(p + ".")), key=len, default=None)
        found[name] = treatment(name, param, owner, None if owner is None else declared[owner])
    return found


def treatment(name: str, param: torch.Tensor, owner: str | None, blocks: Mapping[str, Any] | None) -> Treatment:
    """One parameter's treatment, from its owning part's declaration (``blocks``; None: declares nothing)."""
    if owner is None:
        return Treatment("adamw", None, why="outside every block part (embedding, head, final norm)")
    if blocks is None:
        return Treatment("adamw", owner, why="its part declares no matrix_blocks")
    local = name.removeprefix(owner + ".") if owner else name
    if local in blocks:
        return Treatment("blocks", owner, blocks=blocks[local])
    if param.ndim == 2:
        return Treatment("muon", owner)
    if depthwise_kernel(param):
        return Treatment("adamw", owner, why="a depthwise convolution's kernel: one filter per channel, not a matrix")
    return Treatment("adamw", owner, why="not a matrix (a bias, a gain)")


# -- the update -------------------------------------------------------------------------------------


def orthogonalize(
    g: torch.Tensor, coefficients: tuple[float, float, float] = NS_COEFFICIENTS, steps: int = 5, eps: float = NS_EPS
) -> torch.Tensor:
    """(n, rows, cols) -> each matrix's quintic Newton-Schulz orthogonalization, in bfloat16: torch.optim.Muon's
    iteration, batched (the same operations, each matrix normalized by its own Frobenius norm)."""
    a, b, c = coefficients
    x = g.bfloat16()
    tall = g.shape[-2] > g.shape[-1]
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def lr_factor(adjust_lr_fn: str | None, rows: int, cols: int) -> float:
    """The rate's adjustment for a rows x cols matrix (torch.optim.Muon's ``adjust_lr_fn``)."""
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, rows / cols))
    return 0.2 * math.sqrt(max(rows, cols))


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer over three kinds of param group (``kind``): ``adamw`` (torch.optim.AdamW), ``muon``
    (torch.optim.Muon: each parameter one matrix) and ``blocks`` (each parameter's logical matrices,
    ``blocks[param]``, updated as torch.optim.Muon updates separate matrices). The inner optimizers
    share this one's groups and state, so ``state_dict`` holds everything (momentum buffers, Adam
    moments) and the trainer sets each group's ``lr``."""

    def __init__(self, groups: list[dict[str, Any]], blocks: Mapping[torch.Tensor, Mapping[str, torch.Tensor]]) -> None:
        super().__init__(groups, {})
        self.blocks = blocks
        adamw, muon = self._of("adamw"), self._of("muon")
        self._inner: dict[str, torch.optim.Optimizer] = {}
        if adamw:
            self._inner["adamw"] = torch.optim.AdamW(adamw)
        if muon:
            self._inner["muon"] = torch.optim.Muon(muon)
        self._link()

    def _of(self, kind: str) -> list[dict[str, Any]]:
        return [group for group in self.param_groups if group["kind"] == kind]

    def _link(self) -> None:
        for kind, inner in self._inner.items():
            inner.param_groups, inner.state = self._of(kind), self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._link()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for inner in self._inner.values():
            inner.step()
        for group in self._of("blocks"):
            self._blocks_step(group)
        return loss

    def _blocks_step(self, group: dict[str, Any]) -> None:
        """Momentum per parameter, then every logical matrix of the group orthogonalized, one batch per shape."""
        lr, momentum = group["lr"], group["momentum"]
        by_shape: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = defaultdict(list)
        for param in (p for p in group["params"] if p.grad is not None):
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(param.grad, memory_format=torch.preserve_format)
            buf = state["momentum_buffer"]
            buf.lerp_(param.grad, 1 - momentum)
            update = param.grad.lerp(buf, momentum) if group["nesterov"] else buf
            for rows in self.blocks[param].values():
                block = update.index_select(-2, rows)
                by_shape[(block.shape[-2], block.shape[-1])].append((param, rows, block))
        touched = {id(p): p for items in by_shape.values() for p, _, _ in items}
        for param in touched.values():
            param.mul_(1 - lr * group["weight_decay"])
        for (rows, cols), items in by_shape.items():
            stacked = torch.cat([rearrange(b, "... r c -> (...) r c") for _, _, b in items])
            ortho = orthogonalize(stacked, group["ns_coefficients"], group["ns_steps"], group["eps"])
            alpha = -lr * lr_factor(group["adjust_lr_fn"], rows, cols)
            start = 0
            for param, index, block in items:  # each block's update, times alpha, onto its rows
                n = block[..., 0, 0].numel()
                param.index_add_(-2, index, ortho[start : start + n].reshape(block.shape).to(param.dtype), alpha=alpha)
                start += n


# -- the optim=muon entry ---------------------------------------------------------------------------


@OPTIMIZERS.register(
    "muon",
    formula="hidden matrices: W -= lr (NS5(nesterov momentum(g)) x adjust + wd W), each logical matrix whole; "
    "the rest: AdamW at lr x adam_lr_ratio",
    reference="Jordan et al. 2024, Muon: An optimizer for hidden layers in neural networks, "
    "kellerjordan.github.io/posts/muon; torch.optim.Muon",
)
class Muon(Optimizer):
    """Muon for the hidden matrices (each logical matrix of a fused weight separately), AdamW for the rest.

    ``train.lr`` is Muon's rate (x ``lr_ratio``; the reference's 0.02); the AdamW part runs at
    ``train.lr x adam_lr_ratio`` (the reference's 3e-4 beside Muon's 0.02). ``weight_decay`` and
    ``adam_weight_decay`` (null: ``train.weight_decay``) are decoupled, AdamW's on its matrices only
    (the embedding, the head), never on biases and gains. Refused under FSDP2 and tensor parallelism.
    """

    def __init__(
        self,
        *,
        lr_ratio: float = 1.0,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        adjust_lr_fn: Literal["original", "match_rms_adamw"] | None = None,
        weight_decay: float | None = None,
        adam_lr_ratio: float = 0.015,
        adam_betas: tuple[float, ...] = (0.9, 0.95),
        adam_eps: float = 1e-10,
        adam_weight_decay: float | None = None,
    ) -> None:
        _check_options(locals())
        self.lr_ratio, self.momentum, self.nesterov, self.ns_steps = lr_ratio, momentum, nesterov, ns_steps
        self.adjust_lr_fn, self.weight_decay = adjust_lr_fn, weight_decay
        self.adam_lr_ratio, self.adam_betas, self.adam_eps = adam_lr_ratio, tuple(adam_betas), adam_eps
        self.adam_weight_decay = adam_weight_decay

    def check(self, *, sharded: bool, tp: int, compile: bool) -> None:
        """Refuse FSDP2 and tensor parallelism: each rank would hold a shard of a matrix, and Muon must
        orthogonalize the whole logical matrix. ``compile`` is fine: it compiles the blocks, not the optimizer."""
        if sharded:
            raise ConfigError(
                "optim", "muon", "cannot run under FSDP2 (parallel.dp_shard > 1): each rank would orthogonalize "
                "a shard of each matrix, not the whole logical matrix; use DDP (parallel.dp_shard=1) or optim=adamw",
            )  # fmt: skip
        if tp > 1:
            raise ConfigError(
                "optim", "muon", f"cannot run under tensor parallelism (parallel.tp={tp}): each rank would "
                "orthogonalize a shard of each matrix, not the whole logical matrix; use parallel.tp=1 or optim=adamw",
            )  # fmt: skip

    def build(self, model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
        """Four groups (empty ones left out): ``muon`` and ``blocks`` (the hidden matrices, at ``lr x
        lr_ratio``), ``adamw`` with decay (other matrices: embedding, head) and without (biases, gains)."""
        found = treatments(model)
        params = dict(model.named_parameters())
        kinds: dict[tuple[str, bool], list[torch.Tensor]] = defaultdict(list)
        for name, how in found.items():
            kinds[(how.kind, params[name].ndim >= 2)].append(params[name])
        muon_wd = weight_decay if self.weight_decay is None else self.weight_decay
        adam_wd = weight_decay if self.adam_weight_decay is None else self.adam_weight_decay
        muon = {"lr_ratio": self.lr_ratio, "lr": lr * self.lr_ratio, "weight_decay": muon_wd, **self._muon_options()}
        adam = {"lr_ratio": self.adam_lr_ratio, "lr": lr * self.adam_lr_ratio, "betas": self.adam_betas}
        groups = [
            {"kind": "muon", "params": kinds[("muon", True)], **muon},
            {"kind": "blocks", "params": kinds[("blocks", True)], **muon},
            {"kind": "adamw", "params": kinds[("adamw", True)], "weight_decay": adam_wd, "eps": self.adam_eps, **adam},
            {"kind": "adamw", "params": kinds[("adamw", False)], "weight_decay": 0.0, "eps": self.adam_eps, **adam},
        ]
        blocks = {
            params[name]: {block: rows.to(params[name].device) for block, rows in how.blocks.items()}
            for name, how in found.items()
            if how.blocks is not None
        }
        return MuonAdamW([g for g in groups if g["params"]], blocks)

    def _muon_options(self) -> dict[str, Any]:
        return {
            "momentum": self.momentum,
            "nesterov": self.nesterov,
            "ns_coefficients": NS_COEFFICIENTS,
            "eps": NS_EPS,
            "ns_steps": self.ns_steps,
            "adjust_lr_fn": self.adjust_lr_fn,
        }


def _check_options(options: Mapping[str, Any]) -> None:
    """Each option in its range, a ConfigError naming ``optim.<option>`` otherwise (no tensor work yet)."""
    ranges: Iterable[tuple[str, bool, str]] = (
        ("lr_ratio", options["lr_ratio"] > 0, "must be > 0 (Muon's rate over train.lr)"),
        ("momentum", 0 <= options["momentum"] < 1, "must be in [0, 1)"),
        ("ns_steps", 1 <= options["ns_steps"] < 100, "must be an integer in 1..99 (Newton-Schulz iterations)"),
        ("adjust_lr_fn", options["adjust_lr_fn"] in (None, *ADJUST_LR), f"must be null or one of {ADJUST_LR}"),
        ("adam_lr_ratio", options["adam_lr_ratio"] > 0, "must be > 0 (AdamW's rate over train.lr)"),
        ("adam_betas", len(options["adam_betas"]) == 2 and all(0 <= b < 1 for b in options["adam_betas"]),
         "must be two numbers in [0, 1)"),
        ("adam_eps", options["adam_eps"] > 0, "must be > 0"),
    )  # fmt: skip
    for field, ok, allowed in ranges:
        if not ok:
            raise ConfigError(f"optim.{field}", options[field], allowed)
    for field in ("weight_decay", "adam_weight_decay"):
        if options[field] is not None and options[field] < 0:
            raise ConfigError(f"optim.{field}", options[field], "must be >= 0, or null for train.weight_decay")
