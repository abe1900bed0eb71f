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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from einops import rearrange
from torch import nn

from zoo.core.errors import ConfigError
from zoo.core.interface import hook
from zoo.core.matrices import check_blocks, depthwise_kernel, part_modules
from zoo.lab.recipe.base import OPTIMIZERS, Optimizer
from zoo.lab.recipe.refinements import (
    NS_SCHEDULES,
    QUINTIC,
    Coefficients,
    adam_direction,
    cautious_mask,
    neuron_normalized,
    ns_schedule,
    on_hyperball,
)

#: The reference's quintic Newton-Schulz coefficients (torch.optim.Muon's, Keller Jordan's).
NS_COEFFICIENTS = QUINTIC
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


def treatments(model: nn.Module, *, check: bool = True) -> dict[str, Treatment]:
    """Every parameter of ``model`` (by name, tied ones once) and how ``optim=muon`` optimizes it; ``check``:
    each declaration checked against its weight first (not on the meta device, which holds no values)."""
    parts = part_modules(model)
    declared = {name: hook(module, "matrix_blocks")() for name, module in parts.items()}
    for name, blocks in declared.items():
        if blocks is not None and check:
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
    g: torch.Tensor,
    coefficients: Sequence[Coefficients] = (NS_COEFFICIENTS,) * 5,
    eps: float = NS_EPS,
    safety: float = 1.0,
) -> torch.Tensor:
    """(n, rows, cols) -> each matrix's quintic Newton-Schulz orthogonalization, in bfloat16: torch.optim.Muon's
    iteration, batched (the same operations, each matrix normalized by its own Frobenius norm times ``safety``),
    with ``coefficients[i]`` at iteration ``i`` (the reference's at each; Polar Express's differ)."""
    x = g.bfloat16()
    tall = g.shape[-2] > g.shape[-1]
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * safety).clamp(min=eps)
    for a, b, c in coefficients:
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

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """As torch's, the inner optimizers then sharing the new groups (as :func:`scaled_groups` splits them)."""
        super().add_param_group(param_group)
        if hasattr(self, "_inner"):
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
        """The direction per parameter (nesterov momentum, or Adam's under ``direction: adam``), then every
        logical matrix of the group orthogonalized (one batch per shape; not under Adam's direction) and
        applied with the group's refinements (``normuon_beta2``, ``cautious_wd``, ``hyperball``)."""
        by_shape: dict[tuple[int, int], list[tuple[torch.Tensor, int, torch.Tensor, torch.Tensor]]] = defaultdict(list)
        for param in (p for p in group["params"] if p.grad is not None):
            update = self._direction(param, group)
            for k, rows in enumerate(self.blocks[param].values()):
                block = update.index_select(-2, rows)
                by_shape[(block.shape[-2], block.shape[-1])].append((param, k, rows, block))
        lr, refined = group["lr"], group.get("hyperball") or group.get("cautious_wd")
        if not refined:  # decoupled decay first, as torch.optim.Muon
            for param in {id(p): p for items in by_shape.values() for p, *_ in items}.values():
                param.mul_(1 - lr * group["weight_decay"])
        for (rows, cols), items in by_shape.items():
            stacked = torch.cat([rearrange(b, "... r c -> (...) r c") for *_, b in items])
            if group.get("direction", "muon") == "muon":
                stacked = orthogonalize(stacked, *self._schedule(group))
            alpha = -lr * lr_factor(group.get("adjust_lr_fn"), rows, cols)
            start = 0
            for param, k, index, block in items:  # each block's update, times alpha, onto its rows
                n = block[..., 0, 0].numel()
                self._apply(group, param, k, index, stacked[start : start + n].reshape(block.shape), alpha)
                start += n

    @staticmethod
    def _schedule(group: dict[str, Any]) -> tuple[Sequence[Coefficients], float, float]:
        """The Newton-Schulz coefficients of each iteration, the norm's epsilon and its safety factor."""
        if group.get("ns", "quintic") == "quintic":
            return (tuple(group["ns_coefficients"]),) * group["ns_steps"], group["eps"], 1.0
        coefficients, safety = ns_schedule(group["ns"], group["ns_steps"])
        return coefficients, group["eps"], safety

    def _direction(self, param: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        """The parameter's update before orthogonalization (its radii recorded on the first hyperball step)."""
        state = self.state[param]
        if group.get("hyperball") and "radius" not in state:
            norms = [param.index_select(-2, rows).norm(dim=(-2, -1)) for rows in self.blocks[param].values()]
            state["radius"] = torch.stack(norms)
        if group.get("direction", "muon") == "adam":
            return adam_direction(state, param.grad, group["betas"], group["eps"])
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(param.grad, memory_format=torch.preserve_format)
        buf = state["momentum_buffer"]
        buf.lerp_(param.grad, 1 - group["momentum"])
        return param.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf

    def _apply(
        self, group: dict[str, Any], param: torch.Tensor, k: int, index: torch.Tensor, update: torch.Tensor,
        alpha: float,
    ) -> None:  # fmt: skip
        """One logical matrix's (block ``k``'s rows ``index``) step: ``W += alpha x update``, after NorMuon's
        normalization, or with cautious decay, or the hyperball's step instead."""
        state, lr = self.state[param], group["lr"]
        beta2 = group.get("normuon_beta2")
        if beta2 is not None:
            if "neuron_second_moment" not in state:
                state["neuron_second_moment"] = param.new_zeros(param.shape[:-1])
            moment = state["neuron_second_moment"].index_select(-1, index)
            update = neuron_normalized(update, moment, beta2)
            state["neuron_second_moment"].index_copy_(-1, index, moment)
        update = update.to(param.dtype)
        if group.get("hyperball"):
            weight = param.index_select(-2, index)
            param.index_copy_(-2, index, on_hyperball(weight, update, lr, state["radius"][k]))
        elif group.get("cautious_wd"):
            weight = param.index_select(-2, index)
            decay = lr * group["weight_decay"] * cautious_mask(update, weight)
            param.index_copy_(-2, index, weight - decay * weight + alpha * update)
        else:
            param.index_add_(-2, index, update, alpha=alpha)


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
        ns: Literal["quintic", "polar_express"] = "quintic",
        cautious_wd: bool = False,
        normuon_beta2: float | None = None,
        hyperball: bool = False,
    ) -> None:
        _check_options(locals())
        self.lr_ratio, self.momentum, self.nesterov, self.ns_steps = lr_ratio, momentum, nesterov, ns_steps
        self.adjust_lr_fn, self.weight_decay = adjust_lr_fn, weight_decay
        self.adam_lr_ratio, self.adam_betas, self.adam_eps = adam_lr_ratio, tuple(adam_betas), adam_eps
        self.adam_weight_decay = adam_weight_decay
        self.refinements = {"ns": ns, "cautious_wd": cautious_wd, "normuon_beta2": normuon_beta2,
                            "hyperball": hyperball}  # fmt: skip

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
        lr_ratio``), ``adamw`` with decay (other matrices: embedding, head) and without (biases, gains).
        With a refinement set, each whole matrix is a ``blocks`` parameter of one block (the refined step
        is zoo's, not torch.optim.Muon's)."""
        muon_wd = weight_decay if self.weight_decay is None else self.weight_decay
        matrix = {"lr_ratio": self.lr_ratio, "weight_decay": 0.0 if self.refinements["hyperball"] else muon_wd,
                  **self._muon_options(), **self.refinements}  # fmt: skip
        adam = {"lr_ratio": self.adam_lr_ratio, "betas": self.adam_betas, "eps": self.adam_eps}
        adam_wd = weight_decay if self.adam_weight_decay is None else self.adam_weight_decay
        refined = self.refinements != {"ns": "quintic", "cautious_wd": False, "normuon_beta2": None, "hyperball": False}
        return matrix_optimizer(model, lr=lr, matrix=matrix, adam=adam, adam_wd=adam_wd, whole_as_blocks=refined)

    def _muon_options(self) -> dict[str, Any]:
        return {
            "momentum": self.momentum,
            "nesterov": self.nesterov,
            "ns_coefficients": NS_COEFFICIENTS,
            "eps": NS_EPS,
            "ns_steps": self.ns_steps,
            "adjust_lr_fn": self.adjust_lr_fn,
        }


def matrix_optimizer(
    model: nn.Module, *, lr: float, matrix: dict[str, Any], adam: dict[str, Any], adam_wd: float,
    whole_as_blocks: bool,
) -> MuonAdamW:  # fmt: skip
    """A :class:`MuonAdamW` over ``model``: the hidden matrices (:func:`treatments`) in ``muon`` and ``blocks``
    groups with the options ``matrix`` (its ``lr_ratio`` times ``lr``), the rest in two ``adamw`` groups with
    ``adam``'s, decayed by ``adam_wd`` on its matrices (embedding, head) and never on biases and gains.
    ``whole_as_blocks``: each whole matrix a ``blocks`` parameter of one block (no ``muon`` group)."""
    found = treatments(model)
    params = dict(model.named_parameters())
    kinds: dict[tuple[str, bool], list[torch.Tensor]] = defaultdict(list)
    blocks: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
    for name, how in found.items():
        param = params[name]
        kind = "blocks" if how.kind == "muon" and whole_as_blocks else how.kind
        kinds[(kind, param.ndim >= 2)].append(param)
        if kind == "blocks":
            rows = how.blocks or {"matrix": torch.arange(param.shape[-2])}
            blocks[param] = {block: index.to(param.device) for block, index in rows.items()}
    matrix = {**matrix, "lr": lr * matrix["lr_ratio"]}
    adam = {**adam, "lr": lr * adam["lr_ratio"]}
    groups = [
        {"kind": "muon", "params": kinds[("muon", True)], **matrix},
        {"kind": "blocks", "params": kinds[("blocks", True)], **matrix},
        {"kind": "adamw", "params": kinds[("adamw", True)], **adam, "weight_decay": adam_wd},
        {"kind": "adamw", "params": kinds[("adamw", False)], **adam, "weight_decay": 0.0},
    ]
    return MuonAdamW([g for g in groups if g["params"]], blocks)


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
    _check_refinements(options)


def _check_refinements(options: Mapping[str, Any]) -> None:
    """The refinements' options in range and not contradicting each other (the hyperball decays nothing)."""
    if options["ns"] not in NS_SCHEDULES:
        raise ConfigError("optim.ns", options["ns"], f"one of {', '.join(NS_SCHEDULES)}")
    beta2 = options["normuon_beta2"]
    if beta2 is not None and not 0 <= beta2 < 1:
        raise ConfigError("optim.normuon_beta2", beta2, "must be in [0, 1), or null (no NorMuon)")
    if options["hyperball"] and options["weight_decay"]:
        raise ConfigError("optim.weight_decay", options["weight_decay"], "must be null or 0 with optim.hyperball: "
                          "each hidden matrix keeps its norm, so it is never decayed")  # fmt: skip
    if options["hyperball"] and options["cautious_wd"]:
        raise ConfigError("optim.cautious_wd", True, "must be false with optim.hyperball (no decay to mask)")


OPTIMIZERS.register(
    "normuon",
    summary="Muon with a per-neuron second moment after orthogonalization (optim=muon optim.normuon_beta2=0.95).",
    formula="Muon's, then each row (neuron) of the orthogonalized update O over the root of its running mean "
    "square, v <- beta2 v + (1 - beta2) mean_cols(O^2), rescaled to |O|_F",
    reference="Li et al. 2025, NorMuon: Making Muon more efficient and scalable, arXiv:2510.05491",
    normuon_beta2=0.95,
)(Muon)
