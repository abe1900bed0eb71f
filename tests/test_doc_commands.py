"""Every zoo command shown in a shell block of the README and docs/ still works.

`zoo-parts` commands run for real (``--params`` at tiny sizes). `zoo-train` and `zoo-sweep`
commands are composed and validated exactly as the command line would, without training (the
sweep tests and the tutorial test train for real); `python benchmarks/...` scripts answer
``--help``. `pip` and `pytest` lines are what `.ci/run` runs.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import zoo
from zoo.cli import parts_main
from zoo.sweep import sweep_argv, sweep_names

ROOT = Path(zoo.__file__).resolve().parent.parent
# adding-a-part.md's commands need the part it adds: tests/test_tutorial.py runs them in a copy.
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "adding-a-part.md")]


def shell_commands() -> list[tuple[str, str]]:
    """(page, command) for each command line in a ```bash block (continuations joined, comments cut)."""
    found = []
    for page in PAGES:
        for block in re.findall(r"^```bash\n(.*?)^```", page.read_text(), flags=re.DOTALL | re.MULTILINE):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.strip().removeprefix("$ ")
                command = line.split(" #")[0].strip()
                if command and not command.startswith("#"):
                    found.append((page.name, command))
    return found


COMMANDS = [(page, c) for page, c in shell_commands() if re.match(r"(.*&& )?(zoo-|python benchmarks/)", c)]


def test_docs_show_the_main_commands():
    shown = {shlex.split(c.split("&& ")[-1])[0] for _, c in COMMANDS}
    assert {"zoo-sweep", "zoo-train", "zoo-parts"} <= shown, shown


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p}: {c[:60]}" for p, c in COMMANDS])
def test_doc_command_works(page, command, capsys):
    command = re.split(r" [|>] ", command.split("&& ")[-1])[0]  # the zoo command, not a pipe or redirect
    words = shlex.split(command)
    program, args = words[0], words[1:]
    if program == "zoo-parts":
        if "--params" in args:
            args += ["--d-model", "16", "--n-heads", "4"]
        try:
            parts_main(args)
        except SystemExit as exit_:  # --check exits 1 for an invalid combination, by design
            assert exit_.code in (0, 1, None)
        assert capsys.readouterr().out.strip()
    elif program in ("zoo-train", "zoo-sweep"):
        overrides = [a for a in args if a != "-m" and not a.startswith(("hydra.", "hydra/"))]
        # A multirun's first grid point (the others differ only in values the registry checks too).
        overrides = [a.split("=")[0] + "=" + a.split("=", 1)[1].split(",")[0] if "=" in a else a for a in overrides]
        if program == "zoo-sweep":
            assert overrides[0] in sweep_names(), f"no sweep {overrides[0]!r}"
            overrides = sweep_argv(overrides[0], overrides[1:])
        assert zoo.check_combination(zoo.compose(overrides)) is None
    else:  # python benchmarks/<script>.py
        script = ROOT / words[1]
        done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
