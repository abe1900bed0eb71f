"""The files a sweep's report writes beside its runs, in one list: the report writes them, removes the
optional ones an earlier report left, and lists what it wrote; the trackers send its plots."""

from __future__ import annotations

#: The tables: report.md and report.csv (one row per variant), runs.csv (one row per run), effects.csv (each axis
#: value against its baseline value, with several axes), ladder.csv (a ladder sweep's fit per variant), gates.json
#: (report.gates' answers per variant).
TABLES = ("report.md", "report.csv", "runs.csv", "effects.csv", "ladder.csv", "gates.json")
#: report.gates' answers (zoo/lab/reports/gates.py), read by zoo-results.
GATES_FILE = "gates.json"
#: The plots: curves and final metrics always; interactions (several axes), lr (tune.lr), probes
#: (train.probe_every), routing (mlp=moe) and ladder (ladder.steps) when the sweep has what they show.
PLOTS = ("curves.png", "final.png", "interactions.png", "lr.png", "probes.png", "routing.png", "ladder.png")
#: What a report writes only when the sweep has what it shows: removed before each report, so an earlier
#: report's (of more axes, or with tuning, probes or routing) is not left beside this one.
OPTIONAL = ("effects.csv", "ladder.csv", "gates.json", "interactions.png", "lr.png", "probes.png", "routing.png",
            "ladder.png")
