"""``zoo-sweep NAME [overrides]``: run the versioned sweep ``sweeps/NAME.yaml``, then print its report.

``zoo-sweep quick`` is ``zoo-train +sweeps=quick`` (the ``sweeps`` group is on zoo's Hydra search
path; a sweep file sets ``hydra.mode: MULTIRUN``). Extra arguments are Hydra overrides
(``train.steps=100``, ``seed=0,1,2``, ``hydra/launcher=joblib``, ``hydra.sweep.dir=...``). The sweep
writes ``runs/NAME/`` unless told otherwise; running it again resumes (runs whose summary says ``ok``
are skipped). It exits 1 when a run failed (a diverged run is a result), after writing the report.
"""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path

#: Versioned sweep files: ``sweeps/<name>.yaml`` (``zoo/sweeps`` when installed), the ``sweeps`` group.
SWEEPS_DIR = Path(str(files("zoo.sweeps")))


#: The help's line width: each sweep's description wraps under its own column.
HELP_WIDTH = 110


def sweep_names() -> list[str]:
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))


#: A sentence's end: a full stop at the end or before a word, not before a number (``et al. 2023``, ``e.g. 256``).
SENTENCE_END = re.compile(r"\.(?:\s+(?=\D)|$)")


def describe(name: str) -> str:
    """The first sentence of the sweep file's header comment (the comment lines after ``# @package``),
    however many lines it spans."""
    header = []
    for line in (SWEEPS_DIR / f"{name}.yaml").read_text().splitlines()[1:]:
        if not line.startswith("#"):
            break
        header.append(line.lstrip("#").strip())
    text = " ".join(header)
    end = SENTENCE_END.search(text)
    return text[: end.start() + 1] if end else text


def sweep_argv(name: str, overrides: Sequence[str], cores: int | None = None) -> list[str]:
    """The ``zoo-train`` arguments that run sweep ``name`` (the ``sweeps`` group is on zoo's search path): on
    every core by default, :func:`parallel_jobs` runs at a time, unless the command line names a launcher."""
    jobs = [] if any(o.startswith("hydra/launcher=") for o in overrides) else parallel_jobs(name, overrides, cores)
    return [f"+sweeps={name}", *jobs, *overrides]


def parallel_jobs(name: str, overrides: Sequence[str], cores: int | None = None) -> list[str]:
    """``hydra/launcher=joblib hydra.launcher.n_jobs=N``: as many runs at a time as the cores hold at the
    sweep's ``threads`` each (its command line's, else its file's, else 1); nothing for one at a time."""
    from omegaconf import OmegaConf

    from zoo.lab.cores import usable_cores

    given = [o.split("=", 1)[1] for o in overrides if o.startswith("threads=")]
    threads = given[-1] if given else OmegaConf.load(SWEEPS_DIR / f"{name}.yaml").get("threads")
    per_run = int(threads) if str(threads).isdigit() and int(threads) > 0 else 1
    n = max(1, (cores or usable_cores()) // per_run)
    return ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={n}"] if n > 1 else []


def exit_on_unknown_flags(overrides: Sequence[str]) -> None:
    """Read ``overrides`` with Hydra's own command line (zoo-sweep hands them to zoo-train's): a flag Hydra takes
    with a bad value is argparse's usage error, a flag it does not take one line, both naming zoo-sweep."""
    try:
        from hydra._internal.utils import get_args_parser
    except ImportError:  # a Hydra whose parser moved: zoo-train's entry reads the flags, under its own name
        return
    parser = get_args_parser()
    parser.prog = "zoo-sweep NAME"
    _, unknown = parser.parse_known_args(list(overrides))
    if unknown:
        sys.exit(f"zoo-sweep: unrecognized arguments: {' '.join(unknown)} (usage: zoo-sweep NAME [hydra overrides])")


def sweep_main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: ``zoo-sweep NAME [overrides]``; ``zoo-sweep`` alone lists the sweeps."""
    args = list(sys.argv[1:] if argv is None else argv)
    names = sweep_names()
    if not args or args[0] in ("-h", "--help", "--list"):
        print("usage: zoo-sweep NAME [hydra overrides]   (sweeps/NAME.yaml; output in runs/NAME/)\n\nsweeps:")
        for name in names:
            first = f"  {name:<16} "
            print(textwrap.fill(describe(name), HELP_WIDTH, initial_indent=first, subsequent_indent=" " * len(first),
                                break_on_hyphens=False))  # fmt: skip
        return
    name, overrides = args[0], args[1:]
    if name not in names:
        import difflib

        close = difflib.get_close_matches(name, names, n=1)
        hint = f" did you mean {close[0]!r}?" if close else ""
        sys.exit(f"zoo-sweep: no sweep {name!r} in {SWEEPS_DIR}.{hint} sweeps: {', '.join(names)}")
    from zoo.lab.commands.argv import exit_on_bad_overrides
    from zoo.lab.commands.train import main

    exit_on_unknown_flags(overrides)
    exit_on_bad_overrides("zoo-sweep", sweep_argv(name, overrides))
    sys.argv = [str(Path(sys.argv[0]).with_name("zoo-train")), *sweep_argv(name, overrides)]
    main()


if __name__ == "__main__":
    sweep_main()
