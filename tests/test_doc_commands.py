"""Every zoo command shown in a shell block of the README and docs/ still works.

`zoo-parts` commands run as written (``--params`` at tiny sizes). `zoo-train` and `zoo-sweep`
commands run as written with tiny sizes added (one grid point per swept key, one training step),
except on a cluster (SLURM) or a GPU, where they are composed and validated only;
`zoo-generate` and `zoo-eval` run as written on a tiny run trained in place of the folder they
name. `zoo-prepare` runs as written with a small folder of text standing in for `--stdlib`, and a
`task=tokens` run's `task.path` that does not exist is such a folder, prepared (a BPE when the command
sets `model.vocab_size`). `zoo-contract` runs on a slice of what it names, `zoo-coordcheck` at two tiny
widths. `python benchmarks/...` scripts answer ``--help``. `pip` and `pytest` lines are what `.ci/run` runs.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, tiny_cli, zoo_in_process

import zoo
from zoo import AXES
from zoo.lab.commands.argv import quoted_mappings
from zoo.lab.commands.parts import parts_main
from zoo.lab.commands.sweep import sweep_argv, sweep_names

# adding-a-part.md's commands need the part it adds: tests/test_tutorial.py runs them in a copy.
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "adding-a-part.md")]


TINY = tiny_cli(steps=1, train__warmup_steps=0)  # one step: no warmup (a schedule refuses one past its decay)


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


def runs_as(command: str) -> tuple[str, ...]:
    """What running ``command`` here executes: a ``zoo-train``/``zoo-sweep`` line's arguments with each
    swept key at its first grid point (:func:`pinned`), its output folder left out (two pages showing
    one command, or a sweep shown with the launcher ``zoo-sweep`` picks anyway, run it once)."""
    words = shlex.split(re.split(r" [|>] ", command.split("&& ")[-1])[0])
    if words[0] not in ("zoo-train", "zoo-sweep"):
        return (command,)
    args = [a for a in pinned(words[0], words[1:]) if words[0] != "zoo-sweep" or not a.startswith(LAUNCHER)]
    return (words[0], *sorted(args))


#: ``zoo-sweep``'s own launcher choice (joblib, as many runs at a time as the cores hold), when a page names it.
LAUNCHER = ("hydra/launcher=joblib", "hydra.launcher.n_jobs=")


def pinned(program: str, args: list[str]) -> list[str]:
    """``args`` with every swept key at its first grid point, the sweep file's included, and a sweep's
    learning-rate search cut to its first seed and first two rates (a search still, on fewer runs);
    the output folder left out."""
    kept = [first_value(a) if "=" in a else a for a in args]
    kept = [a for a in kept if a.split("=")[0] not in TINY and not a.startswith("hydra.sweep.dir")]
    kept = [a for a in kept if not a.startswith("hydra.run.dir")]
    if program != "zoo-sweep":
        return kept
    sweep = yaml.safe_load((ROOT / "sweeps" / f"{args[0]}.yaml").read_text())
    params = sweep["hydra"]["sweeper"]["params"]
    if "ladder" in sweep:  # one width and one step: its grid point as an ordinary run (tests/test_ladder.py)
        kept.append("ladder.steps=null")
    given = {a.split("=")[0] for a in kept}
    for key, values in params.items():
        if key not in given:
            value = AXES[key].names()[0] if key in AXES and "glob" in str(values) else str(values).split(",")[0]
            kept.append(f"{key}={value}")
    rates = next((yaml.safe_load(a.split("=", 1)[1]) for a in kept if a.startswith("tune.lr=")), None)
    rates = rates or (sweep.get("tune") or {}).get("lr")
    if rates:  # tune.lr searches each variant over rates x tune.seeds runs before the sweep's own
        seeds = (sweep.get("tune") or {}).get("seeds") or [0]
        kept = [a for a in kept if not a.startswith(("tune.lr=", "tune.seeds="))]
        kept += [f"tune.lr=[{','.join(map(str, rates[:2]))}]", f"tune.seeds=[{seeds[0]}]"]
    return kept


def first_value(override: str) -> str:
    """``key=a,b`` -> ``key=a`` (a sweep's first grid point); a list value ``key=[1,2]`` or a mapping stays whole."""
    key, value = override.split("=", 1)
    if value.startswith("{"):  # a mapping (variants={base: [], rope: [pos=rotary]}): one value
        return override
    return f"{key}={re.split(r',(?![^[]*])', value)[0]}"


SHOWN = [(page, c) for page, c in shell_commands() if re.match(r"(.*&& )?(zoo-|python benchmarks/)", c)]
COMMANDS: list[tuple[str, str]] = []
_RUNS: set[tuple[str, ...]] = set()
for _page, _command in SHOWN:  # each distinct run once, under the first page showing it
    if (_run := runs_as(_command)) not in _RUNS:
        _RUNS.add(_run)
        COMMANDS.append((_page, _command))


def test_docs_show_the_main_commands():
    shown = {shlex.split(c.split("&& ")[-1])[0] for _, c in SHOWN}
    assert {"zoo-sweep", "zoo-train", "zoo-parts"} <= shown, shown


def run_tiny(program: str, args: list[str], tmp_path: Path, task_keys: set[str]) -> None:
    """Run the command at tiny sizes (the ``task.*`` ones its task has), one grid point per swept key
    (:func:`pinned`), in this process through the entry point its console script calls (a command with a
    launcher of processes, submitit's, in a subprocess); every run must be ok. A ``zoo-sweep`` runs its runs one
    at a time (one grid point each: the launcher that runs them side by side is tests/test_sweep.py's)."""
    module = {"zoo-train": "zoo.train", "zoo-sweep": "zoo.lab.commands.sweep"}[program]
    kept = pinned(program, args)
    tiny = [f"{k}={v}" for k, v in TINY.items() if not k.startswith("task.") or k.removeprefix("task.") in task_keys]
    layers = [int(m) + 1 for a in kept for m in re.findall(r"^\+?model\.layers\.(\d+)\.", a)]  # a layer's override
    layers += [len(yaml.safe_load(a.split("=", 1)[1])) for a in kept if a.startswith("model.pattern=")]  # its entries
    layers += [len(zoo.compose([a]).model.pattern) or 1 for a in kept if a.startswith("preset=")]  # a preset's pattern
    if layers:  # as many layers as the highest overridden index or the pattern needs
        tiny = [f"model.n_layers={max(layers)}" if t.startswith("model.n_layers=") else t for t in tiny]
    dirs = [f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    if any("submitit" in a for a in kept):
        done = subprocess.run(
            [sys.executable, "-m", module, *kept, *tiny, *dirs],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    else:
        if program == "zoo-sweep":  # one at a time, in place of the launcher zoo-sweep picks (or the page names)
            kept = [a for a in kept if not a.startswith(LAUNCHER)] + ["hydra/launcher=basic"]
        assert zoo_in_process(program, [*kept, *tiny, *dirs], tmp_path) == 0
    statuses = [json.loads(p.read_text())["status"] for p in tmp_path.glob("**/summary.json")]
    assert statuses and set(statuses) == {"ok"}, statuses


def run_results(args: list[str], tmp_path: Path) -> None:
    """A ``zoo-results`` command as written, its folders and ``--out`` under tmp_path, each folder holding a
    reported sweep of fake runs (two MLPs x 3 seeds)."""
    from helpers import fake_run

    from zoo.lab.commands.results import main as results_main
    from zoo.lab.reports.report import write_built
    from zoo.lab.studies.variants import build_report

    pairs = list(zip(args, ["", *args[:-1]], strict=True))  # each word and the word before it
    args = [a if a.startswith("-") or before == "--format" else str(tmp_path / a) for a, before in pairs]
    folders = [tmp_path / a for a, before in pairs if not a.startswith("-") and before not in ("--format", "--out")]
    for folder in folders:
        for seed in range(3):
            for mlp, value in (("gelu", 3.0), ("swiglu", 2.9)):
                fake_run(folder / "sweep", [f"mlp={mlp}", f"seed={seed}"], value=value + 0.01 * seed * (mlp == "gelu"))
        write_built(build_report(folder / "sweep"), plots=False, gates=["better"])
    results_main(args)  # exits 1 when a file does not read
    if "--out" in args:
        assert Path(args[args.index("--out") + 1]).read_text().startswith("sweep,kind,variant,baseline")


#: A small Python source: what stands in for the standard library in the documented commands.
SOURCE = 'def main(argv):\n    """Déjà vu."""\n    return [x * 2 for x in argv]  # ünï\n\n' * 600


def small_stdlib(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(3):
        (folder / f"mod{n}.py").write_text(SOURCE[n:])
    return folder


def run_prepare(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``zoo-prepare`` command as written, its ``--stdlib`` a small folder, its ``--out`` under tmp_path."""
    from zoo.lab.commands import prepare

    monkeypatch.setattr(prepare, "stdlib_dir", lambda: small_stdlib(tmp_path / "stdlib"))
    args = [str(tmp_path / a) if i and args[i - 1] == "--out" else a for i, a in enumerate(args)]
    assert prepare.main(args) == 0
    assert (Path(args[args.index("--out") + 1]) / "meta.json").is_file()


def tokens_folder(overrides: list[str], tmp_path: Path) -> None:
    """A documented ``task=tokens task.path=DIR`` run's folder, prepared under tmp_path if it is not there."""
    from zoo.lab.data.prepare import prepare

    keys = dict(a.split("=", 1) for a in overrides if "=" in a)
    path = keys.get("task.path")
    if keys.get("task") != "tokens" or path is None or Path(path).is_absolute() or (tmp_path / path).exists():
        return
    vocab = int(keys.get("model.vocab_size", 256))
    tokenizer = "bpe" if vocab > 256 else "bytes"
    prepare([str(small_stdlib(tmp_path / "stdlib"))], tmp_path / path, tokenizer=tokenizer, vocab_size=vocab,
            progress=False)  # fmt: skip


def run_contract_slice(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A ``zoo-contract`` command as written, on a slice: its pairwise set's first of 16 shards, with the
    example plugin's part (``norm=dyt``, not installed here) standing in as rmsnorm; it must pass."""
    from zoo.testing.cli import main, parser

    parsed = parser().parse_args(args)  # exits 2 on an option zoo-contract does not take
    parts = ["norm=rmsnorm" if part == "norm=dyt" else part for part in parsed.parts]
    with pytest.raises(SystemExit) as done:
        main([*parts, "--coverage", "pairwise", "--shard", "1/16"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "contract (" in out, out[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p}: {c[:60]}" for p, c in COMMANDS])
def test_doc_command_works(page, command, capsys, tmp_path, monkeypatch):
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
    elif program in ("zoo-generate", "zoo-eval"):
        from zoo.lab.commands.evaluate import main as eval_main
        from zoo.lab.commands.generate import main as generate_main
        from zoo.lab.training.run import run

        tiny = [f"{k}={v}" for k, v in TINY.items()]
        assert run(zoo.compose(["preset=llama", *tiny]), tmp_path / "run")["status"] == "ok"
        args = [str(tmp_path / "run"), *args[1:]]  # the documented run folder -> the tiny one
        (generate_main if program == "zoo-generate" else eval_main)(args)
        assert capsys.readouterr().out.strip()
    elif program == "zoo-prepare":
        run_prepare(args, tmp_path, monkeypatch)
    elif program in ("zoo-train", "zoo-sweep"):
        overrides = [a for a in args if a != "-m" and not a.startswith(("hydra.", "hydra/"))]
        tokens_folder(overrides, tmp_path)
        # A multirun's first grid point (the others differ only in values the registry checks too).
        overrides = quoted_mappings([first_value(a) if "=" in a else a for a in overrides])  # as zoo-train reads them
        if program == "zoo-sweep":
            assert overrides[0] in sweep_names(), f"no sweep {overrides[0]!r}"
            overrides = sweep_argv(overrides[0], overrides[1:])
        composed = zoo.compose(overrides)
        assert zoo.check_combination(composed) is None
        if "submitit_slurm" not in command and "device=cuda" not in command:
            run_tiny(program, args, tmp_path, task_keys=set(composed.task))
    elif program == "zoo-contract":
        run_contract_slice(args, capsys)
    elif program == "zoo-results":  # over a reported sweep of fake runs where the page names its folder
        run_results(args, tmp_path)
    elif program == "zoo-coordcheck":  # its overrides at tiny sizes, two widths, one step
        from zoo.lab.commands.coordcheck import main, parser

        overrides = parser().parse_intermixed_args(args).overrides  # exits 2 on an option it does not take
        tiny = [f"{k}={v}" for k, v in TINY.items() if k != "block.d_model"]  # the widths are the command's
        small = ["--widths", "16,32", "--steps", "1", "--seeds", "1", "--out", str(tmp_path)]
        assert main([*overrides, *tiny, *small]) in (0, 1) and (tmp_path / "coordcheck.png").is_file()
    else:  # python benchmarks/<script>.py, in this process as tests/test_benchmarks.py runs them
        script = ROOT / words[1]
        monkeypatch.syspath_prepend(str(script.parent))  # as `python benchmarks/x.py` would: its helpers import
        monkeypatch.setattr(sys, "argv", [script.name, "--help"])
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(script), run_name="__main__")
        assert done.value.code in (0, None) and "usage:" in capsys.readouterr().out
