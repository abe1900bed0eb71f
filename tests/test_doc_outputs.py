"""The numbers the docs quote from a training command's output are what that command prints now.

A quoted output is a plain ``` block holding ``$ zoo-train ...`` (or ``$ torchrun ... -m zoo.train ...``)
and the lines it printed. Each such command is run as written, in a temporary folder, and every number
of the kinds below that its quoted lines hold must be in what it prints, in the same place: the numbers
are read from the page, so a page that quotes a number the command no longer prints fails here.
Timestamps, throughput and wall times are not compared (they depend on the machine).

The quick sweep's report (the README's first command) is quoted whole: every line of such a quote is what
``zoo-sweep quick`` (or ``zoo-report runs/quick`` over its runs) prints, digit for digit, but for the
machine's columns (tokens/s, wall s) and one unit of a decimal's last digit: a value at a rounding boundary
moves by one on other CPU kernels (the interaction's lower bound: -0.141284 on this project's AMD EPYC
machines with AVX512 kernels, and with ``ATEN_CPU_CAPABILITY=avx2``, printed -0.1413; -0.1412 on others).
"""

from __future__ import annotations

import difflib
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


#: The quick sweep's commands whose report a page quotes whole (a quote with no command is the README's, under
#: its first command), the header that marks its main table, and the columns that depend on the machine.
QUICK_COMMANDS = ("zoo-sweep quick", "zoo-report runs/quick")
QUICK_HEADER = "| # | pos | mlp |"
MACHINE_COLUMNS = {"tokens/s", "wall s"}
#: A run's closing log line: its folder and headline metric.
RUN_DONE = r"(\S+) ok: val_bpb=([\d.]+)"


def report_lines(text: str) -> list[str]:
    """The report's lines in ``text``, each table's machine columns blanked: no command, log line (``[time]``),
    elision or blank line."""
    lines: list[str] = []
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.strip() or line.startswith(("$ ", "[", "...")):
            continue
        if not line.startswith("|"):
            header = None
            lines.append(line.rstrip())
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif len(cells) == len(header):
            cells = ["·" if name in MACHINE_COLUMNS else cell for name, cell in zip(header, cells, strict=True)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def quick_quotes() -> list[tuple[str, str, str]]:
    """(page, command, the quoted block) for every plain block that quotes the quick sweep's report."""
    found = []
    for page in PAGES:
        for block in plain_blocks(page.read_text()):
            if not any(line.startswith(QUICK_HEADER) for line in block.splitlines()):
                continue
            commands = re.findall(r"^\$ (.*)$", block, flags=re.MULTILINE)
            command = commands[0].strip() if commands else QUICK_COMMANDS[0]
            if command in QUICK_COMMANDS:
                found.append((page.name, command, block))
    return found


#: A number as a report prints it: an integer (thousands separated by commas) or a decimal.
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def same_line(quoted: str, printed: str) -> bool:
    """``quoted`` is ``printed``, but that a decimal may differ by one unit of its last digit (a rounding boundary
    crossed on other CPU kernels); integers, words and the number of decimals are compared exactly."""
    if quoted == printed:
        return True
    if NUMBER.split(quoted) != NUMBER.split(printed):
        return False
    for a, b in zip(NUMBER.findall(quoted), NUMBER.findall(printed), strict=True):
        if a == b:
            continue
        decimals = len(a.partition(".")[2])
        if not decimals or decimals != len(b.partition(".")[2]):
            return False
        if abs(round((float(a.replace(",", "")) - float(b.replace(",", ""))) * 10**decimals)) > 1:
            return False
    return True


def first_unprinted(quoted: list[str], printed: list[str]) -> str | None:
    """The first quoted line that is not printed (:func:`same_line`) after the one before it (None: each is, in
    order)."""
    at = 0
    for line in quoted:
        at = next((i + 1 for i in range(at, len(printed)) if same_line(line, printed[i])), -1)
        if at < 0:
            return line
    return None


QUICK_QUOTED = quick_quotes()


def test_the_pages_quote_the_quick_report_this_file_checks():
    """The README's report and docs/sweeps.md's two are found, each with its tables and interaction line: none
    escapes the check below by a change of layout."""
    assert {(page, command) for page, command, _ in QUICK_QUOTED} == {
        ("README.md", "zoo-sweep quick"), ("sweeps.md", "zoo-sweep quick"), ("sweeps.md", "zoo-report runs/quick"),
    }  # fmt: skip
    for _, _, block in QUICK_QUOTED:
        lines = report_lines(block)
        assert sum(line.startswith("| 1 |") for line in lines) == 1 and any("interaction pos×mlp" in x for x in lines)


def test_a_wrong_digit_fails_the_check_and_another_throughput_does_not():
    """A digit changed anywhere in a quote (here the interaction interval's last, by two units; or its first) is
    a line the sweep does not print; one unit of a last digit is a rounding boundary and passes; the machine's
    columns (tokens/s, wall s) are not compared."""
    quoted = QUICK_QUOTED[0][2]
    printed = report_lines(quoted)
    assert first_unprinted(printed, printed) is None
    line = next(x for x in quoted.splitlines() if x.startswith("- interaction"))
    at, head = line.rindex("]") - 1, line.index("= -0.") + 5  # the interval's last digit, the estimate's first
    for where, units, caught in ((at, 2, True), (head, 1, True), (at, 1, False)):
        digit = int(line[where])
        wrong = line[:where] + str(digit + units if digit + units <= 9 else digit - units) + line[where + 1 :]
        assert first_unprinted(report_lines(quoted.replace(line, wrong)), printed) == (wrong if caught else None)
    assert not same_line("| 1 | 3.4157 |", "| 1 | 3.41570 |") and not same_line("seeds 3", "seeds 4")
    elsewhere = re.sub(r"\| [\d,.]+ \| [\d.]+ \| ok \|$", "| 1 | 2 | ok |", quoted, flags=re.MULTILINE)
    assert elsewhere != quoted and first_unprinted(report_lines(elsewhere), printed) is None


@pytest.fixture(scope="module")
def quick_printed(tmp_path_factory) -> dict[str, str]:
    """What ``zoo-sweep quick`` prints in a fresh folder (its 12 runs of 200 steps), then ``zoo-report runs/quick``."""
    cwd = tmp_path_factory.mktemp("quick")
    sweep = zoo_cli("zoo.lab.commands.sweep", "quick", cwd=cwd, timeout=1800)
    report = zoo_cli("zoo.lab.commands.report", "runs/quick", cwd=cwd)
    return {QUICK_COMMANDS[0]: sweep.stdout + sweep.stderr, QUICK_COMMANDS[1]: report.stdout + report.stderr}


@pytest.mark.slow
@pytest.mark.parametrize(("page", "command", "block"), QUICK_QUOTED, ids=[f"{p}: {c}" for p, c, _ in QUICK_QUOTED])
def test_a_quoted_quick_report_is_what_the_sweep_prints(page, command, block, quick_printed):
    printed = quick_printed[command]
    lines = report_lines(printed)
    missing = first_unprinted(report_lines(block), lines)
    closest = difflib.get_close_matches(missing or "", lines, n=1, cutoff=0)
    assert missing is None, f"{page} quotes for `{command}`:\n{missing}\nwhich it does not print; it prints:\n{closest}"
    done = dict(re.findall(RUN_DONE, printed))
    for run, value in re.findall(RUN_DONE, block):
        assert done.get(run) == value, f"{page} quotes {run} at val_bpb={value}; it prints {done.get(run)}"
