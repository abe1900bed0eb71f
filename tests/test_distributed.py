"""Several gloo processes on CPU (tests/dist_checks.py): tensor parallel, FSDP2, HSDP and FSDP2 x TP
against one process, compile and activation checkpointing under FSDP2, cached generation under TP,
and a checkpoint written by 2 processes loaded by 4 (and refused by 1: DCP is read only by several).

The checks are grouped into one launch per world size (each launch starts and imports torch once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dist_checks import TRAIN_COMBO, launch, tiny_model
from helpers import BYTES, TINY, tiny

from zoo.lab.planning.train_config import TrainConfig
from zoo.lab.records import checkpoint as ckpt
from zoo.lab.records.metrics import read_metrics
from zoo.lab.training.run import run
from zoo.lab.training.trainer import make_optimizer

pytestmark = pytest.mark.slow


def test_two_and_four_processes_match_one_and_a_checkpoint_reshards(tmp_path):
    """One test (one launch per world size; under xdist a shared fixture would launch per worker)."""
    folder = tmp_path / "dcp"
    folder.mkdir()
    launch(
        2,
        [
            ("tp", (2,)),  # the pairwise covering set, forward and backward, TP=2 vs one process
            ("train", {"dp_shard": 2}),  # FSDP2, 3 optimizer steps
            ("train", {"tp": 2}),  # TP with sequence parallelism
            ("train", {"dp_shard": 2, "compile": True}),  # compile on (aot_eager) = off
            ("train", {"dp_shard": 2, "ac": True}),  # activation checkpointing on = off
            ("train", {"tp": 2, "ac": True, "norm": "layernorm", "placement": "sandwich", "pos": "alibi"}),
            ("train", {"tp": 2, "residual": "scaled"}),  # x0 cut as the stream; replicated scalars' gradients summed
            ("train", {"tp": 2, "residual": "hyper"}),  # 4 streams sharded on the sequence
            # reordered norms, heads of a set width, the model's embedding scale and norm (replicated) and logit cap
            ("train", {"tp": 2, "placement": "reordered", "attn": "gqa+headdim",
                       "model": {"scale_embedding": True, "embedding_norm": True, "logit_softcap": 5.0}}),  # fmt: skip
            ("mup_ddp", ()),  # param=mup under DDP = one process over the whole batch
            ("generate", (2,)),  # cached generation, each rank its heads' cache
            ("dcp_save", (str(folder),)),  # written by FSDP2 over 2 processes
        ],
        tmp_path,
    )
    check_one_process_refuses(folder)
    launch(
        4,
        [
            ("train", {"dp_shard": 2, "tp": 2}),  # FSDP2 x TP, 2 x 2
            ("train", {"dp_replicate": 2, "dp_shard": 2}),  # HSDP
            ("dcp_load", (str(folder), 2)),  # resharded onto FSDP2 x TP
        ],
        tmp_path,
    )


def check_one_process_refuses(folder: Path) -> None:
    """One process never reads DCP (torch unpickles its metadata): the checkpoint is refused, naming why."""
    model = tiny_model(TRAIN_COMBO)
    optimizer = make_optimizer(model, TrainConfig())
    latest = ckpt.latest_checkpoint(folder)
    assert ckpt.verify_checkpoint(latest) is None
    with pytest.raises(ckpt.CheckpointMismatch, match=r"sharded \(dcp/, written by 2 processes\)"):
        ckpt.check_checkpoint(latest, config_hash="h", world_size=1)
    with pytest.raises(ckpt.CheckpointMismatch, match="read only by several processes"):
        ckpt.read_model_optimizer(latest, model, optimizer, world_size=1)


def test_torchrun_tp_run_trains_as_one_process(tmp_path):
    """zoo.lab.training.run under torchrun with parallel.tp=2: the same batches as one process (tp ranks share
    them), so the same losses; sharded checkpoints through DCP; final weights in the one-process layout."""
    overrides = ["norm=rmsnorm", "pos=rotary", "mlp=swiglu", "train.steps=4", "train.log_every=1",
                 "train.eval_every=0", "train.checkpoint_every=2"]  # fmt: skip
    one = run(tiny(*overrides), tmp_path / "one")
    assert one["status"] == "ok", one["error"]
    args = ["task=bytes", *TINY, *BYTES, *overrides, "parallel.tp=2"]  # what tiny() composes, as a command line
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "zoo.train", *args,
               f"hydra.run.dir={tmp_path / 'tp'}"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    summary = json.loads((tmp_path / "tp" / "summary.json").read_text())
    assert done.returncode == 0 and summary["status"] == "ok", (summary.get("error"), done.stderr[-2000:])
    assert summary["parallel"] == {"dp_replicate": 1, "dp_shard": 1, "tp": 2}
    losses = [[r["loss"] for r in read_metrics(tmp_path / d) if r["kind"] == "train"] for d in ("one", "tp")]
    assert len(losses[0]) == 4 and losses[1] == pytest.approx(losses[0], rel=1e-4)
    assert (ckpt.latest_checkpoint(tmp_path / "tp") / ckpt.DCP).is_dir()
    from safetensors.torch import load_file

    from zoo.models.language import build_model

    model = build_model(tiny(*overrides))
    model.load_state_dict(load_file(tmp_path / "tp" / ckpt.WEIGHTS))  # loads as one process's model
