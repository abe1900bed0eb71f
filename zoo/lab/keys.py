"""The run config's keys by role, in one place: which top-level keys a run config may hold, which of them
(and of ``train``) change what a run computes and so its config hash, which only how it runs, which
were added after runs were recorded (left out of the hash at the value that changes nothing), and which
name a sweep's run folders (:func:`names_folder`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

#: Top-level keys that change what a run computes: each is in its config hash. ``sweep`` holds values a
#: sweep file interpolates (free-form); ``encoder`` an encoder-decoder's encoder section.
COMPUTES = ("block", "model", "encoder", "task", "train", "seed", "data_seed", "device", "sweep", "init")
#: Top-level keys that change how fast a run goes, what it leaves on disk or how the report reads it, never
#: a number it computes: left out of the hash (adding a tracker or a callback to a finished sweep skips its runs).
#: A named variant's name (``variant``) and the sweep's ``variants`` and ``ablate`` sections are among them: a named
#: variant whose config equals a grid run's is that run (zoo.lab.planning.named).
RUNTIME = ("threads", "progress", "logger", "report", "tune", "ladder", "compile", "parallel", "callbacks", "variants",
           "variant", "ablate")
#: Sections added after runs were recorded: in the hash only away from their default
#: (zoo.lab.recipe.is_default for ``optim``, ``schedule`` and ``objective``; ``param=standard``).
RECIPE = ("optim", "schedule", "objective")
PARAM = "param"
#: The values ``param.name`` may take.
PARAM_VALUES = ("standard", "mup")
#: Every top-level key a run config may hold.
RUN_KEYS = frozenset({*COMPUTES, *RUNTIME, *RECIPE, PARAM})

#: ``train`` keys that never change a number (saving, checkpointing and probing: a run with ``probe_every``
#: set is the same experiment, its checkpoints resume either way, and a finished run is done).
RUNTIME_TRAIN = ("save", "checkpoint_every", "keep_checkpoints", "activation_checkpointing", "probe_every")
#: ``train`` keys added after runs were recorded, left out of the hash at the value that changes nothing
#: (so an older run folder of the same config is still skipped as done, and its checkpoints resume).
NEUTRAL_TRAIN: dict[str, Any] = {
    "z_loss": 0.0, "tail_ema": 0.0, "tail_ema_from": 1, "branch": {"from": None, "step": None},
}  # fmt: skip
#: Top-level keys added after runs were recorded, left out of the hash at the value that changes nothing
#: (``data_seed`` null: the data order follows ``seed``, as it did before the key existed).
NEUTRAL_TOP: dict[str, Any] = {"data_seed": None, "init": {"name": "gpt2", "std": 0.02}}
#: ``block.attn`` options added after runs were recorded, left out of the hash at the value that changes nothing
#: (softmax attention's output gate, sink and XSA: zoo.parts.head_outputs; value residual: zoo.parts.values; the
#: qk-norm's scope, the head width and the scores' scale: zoo.parts.attention; Gated DeltaNet's key heads, negative
#: eigenvalues and output norm epsilon: zoo.parts.gated_deltanet).
NEUTRAL_ATTN: dict[str, Any] = {
    "gate": "none", "sink": "none", "xsa": False, "value_residual": "none", "qk_norm_scope": "head",
    "head_dim": None, "scale_dim": None, "n_key_heads": None, "allow_neg_eigval": False, "norm_eps": 1e-5,
    "rope_dim": None,
}  # fmt: skip
#: ``model`` (and ``encoder``) keys added after runs were recorded, left out of the hash at the value that
#: changes nothing (no layer pattern: every layer the block, as before the key; no value embeddings; no logit cap,
#: embedding norm or embedding scale; no key/value sharing).
NEUTRAL_STACK: dict[str, Any] = {
    "pattern": [], "value_embeddings": False, "logit_softcap": None, "embedding_norm": False, "scale_embedding": False,
    "smear": False, "backout": False,
    "kv_share": 1, "ngram": None, "ngram_table": None, "ngram_scale": 0.1,
}  # fmt: skip
#: The sections :data:`NEUTRAL_STACK` applies to.
STACKS = ("model", "encoder")
#: ``block`` keys added after runs were recorded, left out of the hash at the value that changes nothing
#: (canon layers and branch-output convolutions: zoo.parts.canon; the residual axis at ``add``: zoo.parts.residuals).
NEUTRAL_BLOCK: dict[str, Any] = {"canon": "none", "out_conv": "none", "residual": {"name": "add"}}
#: ``block.norm`` options added after runs were recorded, left out of the hash at the value that changes nothing
#: (RMSNorm's zero-centred gain and its gate, gate_rank: zoo.parts.norms).
NEUTRAL_NORM: dict[str, Any] = {"zero_centred": False, "gate_rank": 0}
#: ``block.mlp`` options added after runs were recorded, left out of the hash at the value that changes nothing
#: (a mixture of experts' balancing, its routing's options and its gates: zoo.parts.moe; GELU's tanh
#: approximation: zoo.parts.mlps).
NEUTRAL_MLP: dict[str, Any] = {
    "balance": "loss", "bias_rate": 0.001, "normalize": True, "routed_scaling_factor": 1.0, "n_groups": 1,
    "top_groups": 1, "router_bias": False, "shared_gate": False, "approximate": "none",
}  # fmt: skip

#: ``objective`` options added after runs were recorded, left out of the hash at the value that changes nothing
#: (multi-token prediction's carry: zoo.models.mtp).
NEUTRAL_OBJECTIVE: dict[str, Any] = {"carry": "block"}
#: ``optim`` options added after runs were recorded (Muon's refinements, the per-group rates), left out of the
#: hash at the value that changes nothing.
NEUTRAL_OPTIM: dict[str, Any] = {"ns": "quintic", "cautious_wd": False, "normuon_beta2": None, "hyperball": False,
                                 "lr_ratios": None, "qk_clip": None}  # fmt: skip

#: ``task`` options added after runs were recorded, left out of the hash at the value that changes nothing
#: (no held-out sources: zoo.lab.data.heldout).
NEUTRAL_TASK: dict[str, Any] = {"heldout": [], "doc_mask": False, "packing": "concat"}

#: The keys a variant's runs repeat over: the seed, and the data order's own seed.
REPLICATES = ("seed", "data_seed")
#: Keys a sweep varies that are not axes of its variants: the seeds a variant's runs repeat (and their data
#: order's), the sweep file, where a branch starts (its identity is the source run's hash, not the path), and the
#: sections that name variants (a named variant's axis is its name, ``variant``).
NOT_AXES = frozenset({*REPLICATES, "sweeps", "train.branch.from", "variants", "ablate", "ablate.features",
                      "ablate.recipe"})

#: The ``sweeps`` group: the sweep file a sweep was launched from (the sweep's own folder, not a run's).
SWEEP_FILE = "sweeps"
#: Runtime keys that still name run folders: a sweep over them (``compile=true,false``) compares speed or
#: memory, a folder each, and the folders of runs launched with them keep their names.
NAMING_RUNTIME = ("compile", "parallel", "train.activation_checkpointing")


def names_folder(key: str) -> bool:
    """Whether an override of ``key`` (``mlp``, ``train.lr``; ``+report.test``'s key is ``report.test``) is in
    a sweep's run folder names. Not the sweep file, nor a runtime key (:data:`RUNTIME`, ``train.`` +
    :data:`RUNTIME_TRAIN`: the report's, tuning's and ladder's sections among them) but those of
    :data:`NAMING_RUNTIME`: a report key given to a finished sweep leaves its runs where they are, skipped."""
    head, _, rest = key.partition(".")
    if any(key == k or key.startswith(f"{k}.") for k in NAMING_RUNTIME):
        return True
    if head == SWEEP_FILE or head in RUNTIME:
        return False
    return not (head == "train" and rest.partition(".")[0] in RUNTIME_TRAIN)


#: Keys looked for under another name: ``{key: where its setting is}`` (said beside "unknown key").
ELSEWHERE = {
    "ladder.widths": "a ladder's widths are the values of block.d_model it sweeps, e.g. block.d_model=64,128,256",
}


def run_dirname(overrides: str, limit: int = 200) -> str:
    """A run folder's name from its overrides (``attn=gqa,norm=rmsnorm,seed=0``): path-safe, and
    shortened with a hash when long. Stable: the same overrides give the same folder (resume)."""
    name = re.sub(r"[^A-Za-z0-9=,._+@-]", "_", overrides) or "default"
    if len(name) > limit:
        name = f"{name[: limit - 17]}-{hashlib.sha1(overrides.encode()).hexdigest()[:16]}"
    return name


def run_folder_name(overrides: Sequence[str]) -> str:
    """A sweep's run folder name from the run's command-line overrides (``hydra.overrides.task``): those of the
    keys that name a run (:func:`names_folder`: no runtime, report, tuning or ladder key), sorted
    and joined with ``,`` as Hydra's ``override_dirname`` joins them, made path-safe by :func:`run_dirname`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [str(line) for line in overrides]
    parsed = OverridesParser.create().parse_overrides(lines)
    return run_dirname(",".join(sorted(o.input_line for o in parsed if names_folder(o.key_or_group))))
