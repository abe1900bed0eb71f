"""The run config's keys by role, in one place: which top-level keys a run config may hold, which of them
(and of ``train``) change what a run computes and so its config hash, which only how it runs, and which
were added after runs were recorded (left out of the hash at the value that changes nothing).
"""

from __future__ import annotations

from typing import Any

#: Top-level keys that change what a run computes: each is in its config hash. ``sweep`` holds values a
#: sweep file interpolates (free-form); ``encoder`` an encoder-decoder's encoder section.
COMPUTES = ("block", "model", "encoder", "task", "train", "seed", "device", "sweep")
#: Top-level keys that change how fast a run goes, what it leaves on disk or how the report reads it, never
#: a number it computes: left out of the hash (adding a tracker or a callback to a finished sweep skips its runs).
RUNTIME = ("threads", "progress", "logger", "report", "tune", "ladder", "compile", "parallel", "callbacks")
#: Sections added after runs were recorded: in the hash only away from their default
#: (zoo.lab.recipe.is_default for ``optim`` and ``schedule``; ``param=standard``).
RECIPE = ("optim", "schedule")
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
NEUTRAL_TRAIN: dict[str, Any] = {"z_loss": 0.0, "branch": {"from": None, "step": None}}
#: ``block.attn`` options added after runs were recorded, left out of the hash at the value that changes nothing
#: (softmax attention's output gate, sink and XSA: zoo.parts.head_outputs).
NEUTRAL_ATTN: dict[str, Any] = {"gate": "none", "sink": "none", "xsa": False}

#: Keys a sweep varies that are not axes of its variants: the seeds a variant's runs repeat, the sweep
#: file, and where a branch starts (its identity is the source run's hash, not the path).
NOT_AXES = frozenset({"seed", "sweeps", "train.branch.from"})
