"""The numbers the docs quote from a training command's output are what that command prints now.

A quoted output is a plain ``` block holding ``$ zoo-train ...`` (or ``$ torchrun ... -m zoo.train ...``)
and the lines it printed. Each such command is run as written, in a temporary folder, and every number
of the kinds below that its quoted lines hold must be in what it prints, in the same place: the numbers
are read from the page, so a page that quotes a number the command no longer prints fails here.
Timestamps, throughput and wall times are not compared (they depend on the machine).
"""

from __future__ import annotations

import re
import shlex
import sys

import pytest
from helpers import ROOT, zoo_cli

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: What a run's log lines state that does not depend on the machine: parameters, data, the metric, divergence.
FACTS = {
    "parameters": r"([\d,]+) parameters",
    "data": r"data \w+ \((\w+)\)",
    "val_bpb": r"val_bpb=([\d.]+)",
    "diverged at step": r"diverged: loss \S+ at step (\d+)",
    "first loss": r"first loss ([\d.]+)",
}


def facts(text: str) -> dict[str, list[str]]:
    """Each fact's values in ``text``, in order of appearance (an empty list when it states none)."""
    return {name: re.findall(pattern, text) for name, pattern in FACTS.items()}


def quoted_outputs() -> list[tuple[str, str, str]]:
    """(page, command, the lines quoted under it) for every quoted training command whose lines state a fact."""
    found = []
    for page in PAGES:
        for block in plain_blocks(page.read_text()):
            for command, printed in re.findall(r"^\$ (.*)\n((?:(?!\$ ).*\n)*)", block, flags=re.MULTILINE):
                trains = command.startswith("zoo-train ") or " -m zoo.train " in command
                if trains and any(facts(printed).values()):
                    found.append((page.name, command.split(" #")[0].strip(), printed))
    return found


def plain_blocks(text: str) -> list[str]:
    """The text of each fenced block that names no language (``` alone on its opening line)."""
    blocks, inside, lines = [], None, []
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            if inside is None:
                inside, lines = line.strip() == "```", []
            else:
                if inside:
                    blocks.append("".join(lines))
                inside = None
        elif inside is not None:
            lines.append(line)
    return blocks


QUOTED = quoted_outputs()


def test_the_docs_quote_the_runs_this_file_checks():
    """The pages quote a run that ends ok, one that diverges and one under torchrun: none escapes this test
    by a change of layout."""
    commands = {command for _, command, _ in QUOTED}
    assert any(c.startswith("zoo-train norm=rmsnorm attn=gqa") for c in commands), QUOTED
    assert any("train.lr=1000" in c for c in commands), QUOTED
    assert any(c.startswith("torchrun ") for c in commands), QUOTED
    assert all(facts(printed)["val_bpb"] or facts(printed)["first loss"] for _, _, printed in QUOTED), QUOTED


@pytest.mark.slow
@pytest.mark.parametrize(("page", "command", "printed"), QUOTED, ids=[f"{p}: {c[:60]}" for p, c, _ in QUOTED])
def test_a_quoted_output_is_what_the_command_prints(page, command, printed, tmp_path):
    words = shlex.split(command)
    if words[0] == "torchrun":  # the same launcher, from this Python
        launcher = [sys.executable, "-m", "torch.distributed.run", *words[1 : words.index("-m")]]
        args = words[words.index("-m") + 2 :]
    else:
        launcher, args = None, words[1:]
    done = zoo_cli("zoo.train", *args, cwd=tmp_path, launcher=launcher)
    quoted, now = facts(printed), facts(done.stdout + done.stderr)
    for name, values in quoted.items():
        said = f"{page} quotes {name} {values} for `{command}`; it prints {now[name]}"
        assert values == now[name][: len(values)], said
