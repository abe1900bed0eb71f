"""What a sweep's check before any run costs (zoo/lab/planning/sweep.py: its sections, every job's run config
composed and checked, the tuning sweep's too), per shipped sweep, as zoo-sweep NAME launches it.

    python benchmarks/sweep_check.py                 # every sweep in sweeps/
    python benchmarks/sweep_check.py quick ladder --repeats 3

Prints each sweep's jobs (the tuning sweep's in brackets), the check's seconds (the fastest of the repeats)
and seconds per job, and the machine's load average, as the check runs in the process that launches the
sweep before Hydra launches any job.
"""

from __future__ import annotations

import argparse
import os
import time

from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode

from zoo.assembly.config_tree import CONF_DIR
from zoo.lab.commands.sweep import sweep_names
from zoo.lab.planning.jobs import sweep_jobs
from zoo.lab.planning.sweep import check_before_any_run, tuning_sweep


def timed(name: str, repeats: int) -> tuple[int, int, float]:
    """(jobs, tuning jobs, the fastest check's seconds) of ``zoo-sweep NAME`` into a folder that is not there."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        where = f"hydra.sweep.dir=/nonexistent/{name}"
        config = loader.load_configuration("config", [f"+sweeps={name}", where], RunMode.MULTIRUN)
        tuning = tuning_sweep(config)
        jobs, tuned = len(sweep_jobs(config) or []), len(sweep_jobs(tuning) or []) if tuning is not None else 0
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            check_before_any_run(config)
            best = min(best, time.perf_counter() - start)
    return jobs, tuned, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="*", help="sweep names (default: every sweep in sweeps/)")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores\n")
    print("| sweep | jobs (tuning) | check s | s per job |\n|---|---|---|---|")
    for name in args.sweeps or sweep_names():
        jobs, tuned, seconds = timed(name, args.repeats)
        print(f"| {name} | {jobs} ({tuned}) | {seconds:.2f} | {seconds / (jobs + tuned):.3f} |", flush=True)


if __name__ == "__main__":
    main()
