"""Command-line overrides checked before Hydra: a misspelt key, axis or option gets zoo's error (the
key or value, did you mean, what exists) and one line, never Hydra's "use +..." advice."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from helpers import ROOT

from zoo.assembly.overrides import group_options
from zoo.core.errors import ConfigError
from zoo.lab.commands.argv import check_overrides
from zoo.lab.commands.sweep import sweep_main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nrom=rmsnorm"], "nrom='rmsnorm': unknown key 'nrom'; did you mean 'norm'? keys: ablate, attn, block, "),
        (["trian.steps=10"], "trian.steps='10': unknown key 'trian'; did you mean 'train'? keys: ablate, attn, "),
        (["train.stpes=10"], "train.stpes='10': unknown key 'stpes' of train; did you mean 'steps'? keys: "),
        (["norm=rmsnrom"], "norm='rmsnrom': unknown norm; did you mean 'rmsnorm'? options: gated_rmsnorm, layernorm, "
                           "rmsnorm, scalenorm"),
        (["-m", "norm=rmsnorm,rmsnrom"], "norm='rmsnrom': unknown norm; did you mean 'rmsnorm'?"),
        (["task=nosuchtask"], "task='nosuchtask': unknown task; options: bytes, lengthgen, mqar, tokens, transduce"),
        (["task=mqar", "task.seq_len=8"], "task.seq_len='8': unknown key 'seq_len' of task; keys: "),
        (["residual.n_streams=2"], "residual.n_streams='2': the residual group's options sit under block.residual: "
                                   "block.residual.n_streams=2"),
        (["-m", "norm.eps=1e-6"], "norm.eps='1e-6': the norm group's options sit under block.norm: "
                                  "block.norm.eps=1e-6"),
        (["sweeps.x=1"], "sweeps.x='1': sweeps is a config group, not a key: choose one of its options "
                         "(sweeps=<option>): "),
    ],
)
def test_a_misspelt_key_or_option_names_what_exists(args, message):
    with pytest.raises(ConfigError) as error:
        check_overrides(args)
    assert message in str(error.value) and "+" not in str(error.value).split(";")[0], str(error.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nrom=rmsnorm"], "nrom='rmsnorm': unknown key 'nrom'; did you mean 'norm'?"),
        (["norm=rmsnrom"], "norm='rmsnrom': unknown norm; did you mean 'rmsnorm'?"),
        (["residual.n_streams=2"], "the residual group's options sit under block.residual: block.residual.n_streams=2"),
        (["preset=llama", "block.nrom.eps=1"], "block.nrom.eps='1': unknown key 'nrom' of block; did you mean 'norm'?"),
    ],
)
def test_zoo_compose_names_a_misspelt_key_or_option_as_the_command_line_does(args, message):
    """From Python too (researchers composing in a notebook): zoo's error, not Hydra's "use +nrom=rmsnorm"."""
    import zoo

    with pytest.raises(ConfigError, match=re.escape(message)):
        zoo.compose(args)


def test_zoo_compose_leaves_what_zoo_does_not_judge_to_hydra():
    from hydra.errors import HydraException

    import zoo

    with pytest.raises(HydraException, match="no viable alternative"):  # the grammar's: not a key or an option
        zoo.compose(["train.lr=[1"])
    assert zoo.compose(["+x=1", "norm=rmsnorm"]).x == 1


VALID = [
    "norm=rmsnorm",
    "norm=rmsnorm,layernorm",
    "attn=mha,gqa,mqa",
    "+x=1",
    "++train.steps=3",
    "~seed",
    "seed=0,1,2",
    "train.steps=10",
    "block.norm.eps=1e-5",
    "block.attn.anything=1",  # the axis nodes are open: zoo names the part's options later
    "+model.layers.3.attn=mqa",
    "hydra.run.dir=/tmp/x",
    "hydra/launcher=basic",
    "hydra.sweep.dir=out",
    "preset=llama",
    "preset=null",
    "seed=range(0,3)",
    "norm=choice(rmsnorm,layernorm)",
    "-m",
    "--multirun",
    "--cfg",
    "job",
]


def test_the_groups_are_zoos_axes_tasks_recipe_and_sweeps():
    groups = group_options()
    assert {"placement", "norm", "attn", "pos", "mlp", "residual", "preset", "task", "logger", "optim", "schedule",
            "objective", "param", "init", "sweeps", "ablate"} == set(groups)  # fmt: skip
    assert groups["ablate"] == ["add_one", "hold_one_out", "none"]
    assert groups["residual"] == ["add", "attnres", "hyper", "mhc", "scaled"]
    assert groups["objective"] == ["mtp", "ntp"]
    assert groups["init"] == ["gpt2", "mitchell", "olmo", "zero_out"]
    assert "quick" in groups["sweeps"] and groups["norm"] == ["gated_rmsnorm", "layernorm", "rmsnorm", "scalenorm"]
    assert {"adafactor", "adamw", "sgd"} <= set(groups["optim"]) and "wsd" in groups["schedule"]


def test_valid_overrides_and_hydra_flags_pass():
    check_overrides(VALID)
    check_overrides(["--config-dir", "/somewhere/else", "nrom=whatever"])  # another config: Hydra's to judge
    check_overrides(["--config-name=other", "nrom=whatever"])


def test_zoo_train_and_zoo_sweep_exit_with_one_line(capsys, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "zoo.train", "nrom=rmsnorm"], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("zoo-train: nrom='rmsnorm': unknown key 'nrom'; did you mean 'norm'? keys: ablate, attn,")
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "runs").exists()
    with pytest.raises(SystemExit) as exited:
        sweep_main(["quick", "trian.steps=1"])
    assert exited.value.code != 0 and "did you mean 'train'?" in str(exited.value.code)
    ok = subprocess.run(
        [sys.executable, "-m", "zoo.train", "--cfg", "job", "norm=rmsnorm", "+extra=1", "~seed", "train.steps=3"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert ok.returncode == 0 and "extra: 1" in ok.stdout and "rmsnorm" in ok.stdout, ok.stderr


def test_a_key_looked_for_under_another_name_says_where_its_setting_is():
    """Every key of zoo.lab.keys.ELSEWHERE, on the command line and in its section's own check."""
    from zoo.lab.keys import ELSEWHERE
    from zoo.lab.planning.options import ladder_options, report_options, tune_options

    checks = {"ladder": lambda raw: ladder_options(raw, 100), "report": report_options, "tune": tune_options}
    for key, where in ELSEWHERE.items():
        with pytest.raises(ConfigError) as on_the_command_line:
            check_overrides([f"{key}=[32,64]"])
        assert where in str(on_the_command_line.value), str(on_the_command_line.value)
        section, _, name = key.partition(".")
        with pytest.raises(ConfigError) as in_its_section:
            checks[section]({name: [32, 64]})
        assert str(in_its_section.value).startswith(f"{key}=[32, 64]: unknown key; {where}; allowed: ")
    assert "block.d_model" in ELSEWHERE["ladder.widths"]


#: Runs ``zoo-train`` with each command line in one process (torch imported once), each from the working folder:
#: its exit status, what it printed on stdout and stderr, and what the working folder holds after it.
IN_ONE_PROCESS = """
import contextlib, io, json, os, sys
from hydra.core.global_hydra import GlobalHydra
from zoo.lab.commands.train import main
results = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ["zoo-train", *argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
            code = 0
        except SystemExit as exited:
            code = exited.code
    GlobalHydra.instance().clear()
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "left": sorted(os.listdir("."))})
print(json.dumps(results))
"""


def test_a_single_runs_config_error_is_one_line_on_stderr_and_leaves_nothing_behind(tmp_path):
    """As a misspelt key is: exit 1, one ``zoo-train: <field>=...`` line on stderr, nothing on stdout, no run folder
    (not even an empty runs/train/), whichever check refuses it."""
    small = ["block.d_model=32", "block.n_heads=4", "model.n_layers=1", "train.steps=2", "threads=1"]
    cases = {
        "callbacks": ["callbacks=[nosuch]"],
        "train.steps": ["train.steps=-1"],
        "task.path": ["task=tokens", f"task.path={tmp_path / 'no-such-data'}"],
        "train.branch.step": ["schedule=wsd", "train.branch.step=1"],
        "train.branch.from": [f"train.branch.from={tmp_path / 'no-such-run'}", "train.branch.step=1"],
        "block.n_heads": ["block.n_heads=5"],
    }
    argvs = [[*small, *more] for more in cases.values()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", IN_ONE_PROCESS, json.dumps(argvs)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for field, result in zip(cases, json.loads(done.stdout.splitlines()[-1]), strict=True):
        assert result["code"] == 1 and result["stdout"] == "", (field, result)
        (line,) = result["stderr"].splitlines()
        assert line.startswith(f"zoo-train: {field}="), (field, line)
        assert result["left"] == [], (field, result["left"])
