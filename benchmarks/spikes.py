"""What the spike detector sees (zoo/lab/training/spikes.py): its recall on spikes planted in real training
curves, and its false alarms on real runs.

    python benchmarks/spikes.py                          # 12 runs of 100 steps, planted spikes
    python benchmarks/spikes.py --sweep runs/quick       # ... and the false alarms of a finished sweep's runs

The runs are the quick sweep's variants (sweeps/quick.yaml: pos none/rotary x mlp gelu/swiglu, d_model 64,
2 layers, batch 24 of 64 bytes) on ``--seeds`` seeds, trained for ``--steps`` steps by
``zoo.lab.training.run.run`` as ``zoo-train`` trains them; a callback registered here keeps every step's loss
and gradient norm as the detector receives them. Into a copy of each run's series a spike is planted at
each of ``--at`` steps, one at a time: the loss of that step x ``--loss-jump`` (1.4: +40%), or, apart, its
gradient norm x ``--grad-jump`` (10). A plant is found when the detector names its step; the table gives
the recall per kind and step, and the detections elsewhere in the planted series. False alarms: the spikes
the detector found in the unplanted runs (each run's summary), and in ``--sweep``'s runs when given.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from zoo import compose
from zoo.lab.training import spikes
from zoo.lab.training.callbacks import CALLBACKS, Callback, RunContext
from zoo.lab.training.loop_state import LoopState
from zoo.lab.training.run import run

#: Every step's [step, loss, grad_norm] of the run being trained, as the detector receives them.
SERIES: list[list[float | None]] = []


@CALLBACKS.register("step_series")
class StepSeries(Callback):
    """Keeps every step's loss and gradient norm (``loop.logged_steps`` at each log step) in :data:`SERIES`."""

    @classmethod
    def from_run(cls, run: RunContext, **options: Any) -> Callback | None:
        return cls()

    def on_run_start(self, loop: LoopState, first: int) -> None:
        self.loop = loop
        SERIES.clear()

    def on_record(self, record: dict[str, Any]) -> None:
        if record.get("kind") == "train":
            SERIES.extend(copy.deepcopy(self.loop.logged_steps))


def found(series: list[list[float | None]]) -> list[int]:
    state = spikes.new_state()
    spikes.update(state, series)
    return spikes.result(state)["steps"]


def planted(series: list[list[float | None]], step: int, column: int, factor: float) -> list[list[float | None]]:
    out = copy.deepcopy(series)
    row = next(r for r in out if r[0] == step)
    row[column] = row[column] * factor  # type: ignore[operator]
    return out


def sweep_alarms(root: Path) -> list[tuple[str, Any]]:
    """``(run folder, summary spikes)`` of every run under ``root`` (tuning runs included)."""
    return [(str(p.parent.relative_to(root)), json.loads(p.read_text()).get("spikes"))
            for p in sorted(root.rglob("summary.json"))]  # fmt: skip


def alarms(scored: list[tuple[str, Any]]) -> None:
    """Per series, the spikes found in runs that are healthy (``scored``: run name, summary ``spikes``)."""
    measured = [(name, s) for name, s in scored if s and s.get("count") is not None and "by" in s]
    unmeasured = len(scored) - len(measured)
    print(f"| series | spikes | runs with one (of {len(measured)} measured; {unmeasured} not) | where |")
    print("|---|---|---|---|")
    for series in spikes.SERIES:
        hit = [(name, s["by"][series]) for name, s in measured if s["by"][series]]
        where = ", ".join(f"{name}: step {', '.join(map(str, steps))}" for name, steps in hit) or "none"
        print(f"| {series} | {sum(len(steps) for _, steps in hit)} | {len(hit)} | {where} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--at", default="20,30,40,50,60,70,80,90", help="the steps to plant a spike at")
    parser.add_argument("--loss-jump", type=float, default=1.4)
    parser.add_argument("--grad-jump", type=float, default=10.0)
    parser.add_argument("--sweep", type=Path, help="a finished sweep folder whose runs' spikes to count")
    args = parser.parse_args()
    at = [int(s) for s in args.at.split(",")]
    common = [
        "task=bytes", "block.d_model=64", "block.n_heads=4", "model.n_layers=2", "task.seq_len=64",
        "train.batch_size=24", f"train.steps={args.steps}", "train.warmup_steps=20", "train.eval_every=50",
        "threads=1", "progress=false", "callbacks=[step_series]",
    ]  # fmt: skip
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for pos in ("none", "rotary"):
            for mlp in ("gelu", "swiglu"):
                for seed in range(args.seeds):
                    name = f"pos={pos},mlp={mlp},seed={seed}"
                    cfg = compose([*common, f"pos={pos}", f"mlp={mlp}", f"seed={seed}"])
                    summary = run(OmegaConf.to_container(cfg, resolve=True), Path(tmp) / name)
                    assert summary["status"] == "ok", summary.get("error")
                    assert len(SERIES) == args.steps, f"{name}: {len(SERIES)} steps seen"
                    runs.append((name, copy.deepcopy(SERIES), summary["spikes"]))
                    print(f"{name}: spikes {summary['spikes']}", flush=True)
    print(f"\n{len(runs)} runs of {args.steps} steps; a spike planted at each of steps {args.at}, one at a time")
    print("| plant | " + " | ".join(f"step {s}" for s in at) + " | recall | detections elsewhere |")
    print("|---|" + "---|" * (len(at) + 2))
    misses: list[str] = []
    for label, column, factor in (("loss", 1, args.loss_jump), ("grad norm", 2, args.grad_jump)):
        hits, elsewhere, missed = {s: 0 for s in at}, 0, []
        for name, series, _ in runs:
            for step in at:
                seen = found(planted(series, step, column, factor))
                hits[step] += step in seen
                elsewhere += len([s for s in seen if s != step])
                if step not in seen:
                    missed.append(f"{name} at step {step}")
        total = sum(hits.values())
        cells = " | ".join(f"{hits[s]}/{len(runs)}" for s in at)
        print(f"| {label} x {factor:g} | {cells} | {total}/{len(runs) * len(at)} | {elsewhere} |")
        misses.append(f"missed, {label} x {factor:g}: {', '.join(missed) or 'none'}")
    print("\n".join(misses))
    print(f"\nFalse alarms: what the detector found in the unplanted {args.steps}-step runs")
    alarms([(name, summary) for name, _, summary in runs])
    if args.sweep:
        print(f"False alarms: what the detector found in {args.sweep}'s runs")
        alarms(sweep_alarms(args.sweep))


if __name__ == "__main__":
    main()
