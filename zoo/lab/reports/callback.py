"""The Hydra callback that writes a sweep's report when the sweep ends.

Hydra builds every configured callback in every process it starts (a single ``zoo-train`` run, each launcher
worker, each tuning sub-sweep), and the report's modules import matplotlib and scipy, about a second of start-up:
they are imported here only when a sweep ends and its report is written.
"""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class ReportCallback(Callback):
    """Hydra callback: when a sweep ends, write its report and print the table (zoo.lab.reports.report)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from zoo.lab.reports.report import report_sweep  # matplotlib and scipy: only where a report is written

        report_sweep(config)
