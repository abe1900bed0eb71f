"""Sweeps through the command line (subprocesses): zoo-sweep, resume, launchers, torchrun DDP."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, SMALL, fake_run, interrupt, summaries, without_timings, zoo_cli
from matplotlib.image import imread
from omegaconf import OmegaConf

import zoo
from zoo import build_model, compose
from zoo.lab.commands.sweep import SWEEPS_DIR, sweep_argv, sweep_main, sweep_names
from zoo.lab.keys import run_folder_name
from zoo.lab.records.metrics import read_metrics
from zoo.lab.records.summary import read_summary
from zoo.lab.training.run import run


@pytest.mark.slow
def test_zoo_sweep_trains_reports_and_survives_a_failing_run(tmp_path):
    # Three variants; model.vocab_size=100 is below the bytes task's 256, which only the task read at the run's
    # start knows, so that run fails and the others go on; the report is written, then the sweep exits 1 (a
    # failed run is not a result).
    folder = tmp_path / "sweep"
    args = ["quick", "pos=none", "mlp=gelu", "seed=0", "model.vocab_size=null,512,100", *SMALL,
            f"hydra.sweep.dir={folder}"]  # fmt: skip
    done = zoo_cli("zoo.lab.commands.sweep", *args, cwd=tmp_path, returncode=1)
    last = done.stderr.rstrip().splitlines()[-2:]
    assert last[0] == "1 run(s) failed (a diverged run is a result; a failed one is not):", done.stderr[-2000:]
    assert last[1].startswith("  sweep/") and "model.vocab_size=100" in last[1], last
    assert last[1].endswith(": ConfigError: model.vocab_size=100: at least task 'bytes''s vocabulary (256)")
    runs = summaries(folder)
    status = {r["config"]["model"]["vocab_size"]: r["status"] for r in runs.values()}
    assert status == {256: "ok", 512: "ok", 100: "failed"}
    assert all(r["choices"]["sweeps"] == "quick" and r["config"]["block"]["d_model"] == 32 for r in runs.values())
    assert "| # | model.vocab_size | seeds | params | val_bpb (mean ± std) |" in done.stdout  # the table ends the sweep
    recorded = json.loads((folder / "sweep.json").read_text())  # for zoo-results: the command, version, date
    assert recorded["command"].startswith("zoo-train +sweeps=quick ") and "model.vocab_size=null,512,100" in recorded[
        "command"] and recorded["zoo_version"] == zoo.__version__ and recorded["reported"].startswith("20")
    report = (folder / "report.md").read_text()
    assert "model.vocab_size=100: failed: ConfigError: model.vocab_size=100: at least task 'bytes'" in report
    # What the sweep file and the command line held fixed, beyond zoo's defaults (threads: runtime only).
    fixed = next(line for line in report.splitlines() if line.startswith("Fixed in every run"))
    for setting in ("block.d_model=32", "model.n_layers=2", "task.seq_len=32", "train.steps=4", "train.eval_every=2"):
        assert setting in fixed.split(": ", 1)[1].split(", "), fixed
    assert "threads" not in fixed and "pos=" not in fixed and "seed" not in fixed  # defaults, or runtime
    with open(folder / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "ok", "1 failed"]  # failures last
    assert float(rows[0]["val_bpb_mean"]) <= float(rows[1]["val_bpb_mean"])  # best first
    for png in ("curves.png", "final.png"):
        assert imread(folder / png).shape[2] in (3, 4)
    assert not (tmp_path / "runs").exists()  # everything went where hydra.sweep.dir said


def test_zoo_sweep_refuses_a_bad_swept_value_in_one_line_before_any_run(tmp_path):
    folder = tmp_path / "sweep"
    done = zoo_cli("zoo.lab.commands.sweep", "quick", *SMALL, "block.attn.gate=none,head", f"hydra.sweep.dir={folder}",
                   cwd=tmp_path, returncode=1)  # fmt: skip
    assert done.stderr.splitlines() == ["zoo-sweep: refused before any run: block.attn.gate='head': must be one of "
                                        "'none', 'headwise', 'elementwise' (the 12 runs with block.attn.gate=head)"]
    assert not folder.exists() and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_sweep_resumes_on_submitit_local(tmp_path):
    # A finished run where the sweep will look for it: the folder named after its overrides, the
    # config composed as the command line composes it (trained here, in-process).
    folder = tmp_path / "sweep"
    fixed = ["pos=none", "mlp=gelu", "seed=0", *[a for a in SMALL if not a.startswith("block.n_heads")]]
    overrides = [*fixed, "block.n_heads=4"]
    name = run_folder_name(overrides)  # as Hydra names it (conf/config.yaml's hydra.sweep.subdir)
    cfg = compose(sweep_argv("quick", overrides))
    before = run(cfg, folder / name, overrides=overrides)
    assert before["status"] == "ok"

    # The sweep, one more value than was run, on submitit (each job its own process, as on SLURM):
    # the finished run is skipped, the new one trains, and the report covers both.
    zoo_cli("zoo.lab.commands.sweep", "quick", *fixed, "block.n_heads=4,8", f"hydra.sweep.dir={folder}",
            "hydra/launcher=submitit_local", cwd=tmp_path)  # fmt: skip
    after = summaries(folder)
    assert after[name] == before  # skipped: not a byte changed
    new = [s for key, s in after.items() if key != name]
    assert len(new) == 1 and new[0]["config"]["block"]["n_heads"] == 8 and new[0]["status"] == "ok"
    assert new[0]["config_hash"] != before["config_hash"]
    with open(folder / "report.csv") as f:
        assert sorted(r["block.n_heads"] for r in csv.DictReader(f)) == ["4", "8"]


@pytest.mark.slow
def test_a_sweep_on_submitit_trains_each_run_on_several_processes(tmp_path):
    # tasks_per_node=2: each run is one submitit job of two processes (two GPUs of a SLURM node, or
    # two gloo processes here), which find each other through submitit's job environment.
    fixed = [*SMALL, "mlp=gelu", "seed=0", "parallel.dp_shard=2", "hydra.launcher.tasks_per_node=2"]
    zoo_cli("zoo.lab.commands.sweep", "quick", *fixed, "pos=none,rotary", "hydra.sweep.dir=sweep",
            "hydra/launcher=submitit_local", cwd=tmp_path)  # fmt: skip
    runs = summaries(tmp_path / "sweep")
    for summary in runs.values():
        assert summary["status"] == "ok" and summary["world_size"] == 2, summary.get("error")
        assert summary["parallel"] == {"dp_replicate": 1, "dp_shard": 2, "tp": 1}  # FSDP2 over the two tasks
        assert summary["tokens"] == 2 * 4 * 4 * 32  # both ranks' batches per step
        assert (Path(summary["run_dir"]) / "model.safetensors").exists()  # gathered from the shards
    assert len(runs) == 2 and (tmp_path / "sweep" / "report.md").exists()


@pytest.mark.slow
def test_torchrun_ddp_two_cpu_processes_and_resume(tmp_path):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    # Checkpoints after steps 1, 2 and 3; dropout draws from each rank's own generator; probes on rank 0.
    resumable = ["train.checkpoint_every=1", "train.keep_checkpoints=3", "block.dropout=0.1", "train.probe_every=2"]
    zoo_cli("zoo.train", *SMALL, *resumable, "hydra.run.dir=ddp", cwd=tmp_path, launcher=launcher)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp"]  # rank 1 wrote nothing
    summary = read_summary(tmp_path / "ddp")
    assert summary["status"] == "ok" and summary["world_size"] == 2
    assert summary["ranks_in_sync"] is True  # same init on both ranks, gradients averaged
    assert summary["tokens"] == 2 * 4 * 4 * 32  # two ranks' batches per step
    records = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "val"] == [0, 2, 4]
    assert [r["step"] for r in records if r["kind"] == "probe"] == [2, 4]  # one per probe step, not one per rank
    # Killed after the checkpoint of step 1 (mid log interval): both ranks resume from it, to the same numbers.
    interrupt(tmp_path / "ddp", tmp_path / "resumed", at_step=1)
    zoo_cli("zoo.train", *SMALL, *resumable, "hydra.run.dir=resumed", cwd=tmp_path, launcher=launcher)
    resumed = read_summary(tmp_path / "resumed")
    assert resumed["status"] == "ok" and resumed["resumed_from"] == [1] and resumed["ranks_in_sync"] is True
    assert resumed["final"] == summary["final"]
    assert without_timings(read_metrics(tmp_path / "resumed")) == without_timings(read_metrics(tmp_path / "ddp"))


@pytest.mark.slow
def test_a_runs_result_depends_neither_on_the_launcher_nor_on_the_runs_before_it(tmp_path):
    """A run trains to the same numbers, bit for bit, alone in its own process, after other runs in one process
    (the basic launcher: multi-token runs and another seed first) and in joblib's workers beside other runs:
    nothing it computes is left over from its process or taken from the runs around it."""
    small = [*SMALL, "pos=rotary", "train.steps=6"]
    zoo_cli("zoo.train", *small, "seed=1", "hydra.run.dir=alone", cwd=tmp_path)
    zoo_cli("zoo.train", "-m", *small, "objective=mtp,ntp", "seed=0,1", "hydra/launcher=basic",
            "hydra.sweep.dir=basic", cwd=tmp_path)  # fmt: skip
    zoo_cli("zoo.train", "-m", *small, "seed=0,1,2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
            "hydra.sweep.dir=joblib", cwd=tmp_path)  # fmt: skip
    alone = read_summary(tmp_path / "alone")
    basic, joblib = (seed_1_ntp(tmp_path / sweep) for sweep in ("basic", "joblib"))
    assert alone["status"] == basic["status"] == joblib["status"] == "ok"
    assert basic["final"] == alone["final"] == joblib["final"]
    assert basic["config_hash"] == alone["config_hash"] == joblib["config_hash"]
    curves = [without_timings(read_metrics(Path(s["run_dir"]))) for s in (alone, basic, joblib)]
    assert curves[0] == curves[1] == curves[2]


def seed_1_ntp(folder: Path) -> dict:
    """The summary of a sweep's next-token run at seed 1."""
    (found,) = [s for s in summaries(folder).values() if (s["config"]["seed"], s["choices"]["objective"]) == (1, "ntp")]
    return found


def test_zoo_sweep_lists_the_versioned_sweeps(capsys):
    sweep_main([])
    out = capsys.readouterr().out
    for name in ("quick", "card", "attention", "placement_depth", "mlp"):
        assert name in sweep_names() and f"  {name} " in out
    with pytest.raises(SystemExit, match="did you mean 'quick'"):
        sweep_main(["quikc"])


@pytest.mark.parametrize("flag", ["--nosuch", "-x", "--cfg=nonsense"])
def test_zoo_sweep_names_itself_for_a_flag_it_does_not_take(flag, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        sweep_main(["quick", "train.steps=1", flag])
    message = str(exited.value.code) if exited.value.code != 2 else capsys.readouterr().err.strip().splitlines()[-1]
    expected = "zoo-sweep NAME: error: argument --cfg/-c: invalid choice" if "=" in flag else "zoo-sweep: unrecognized"
    assert message.startswith(expected) and flag.partition("=")[2 if "=" in flag else 0] in message, message
    assert "zoo-train" not in message and not any(tmp_path.iterdir())


def test_zoo_sweep_help_gives_each_sweeps_first_sentence_whole(capsys):
    sweep_main(["--help"])
    out = capsys.readouterr().out
    entries = dict(re.findall(r"^  (\w+) +(.*(?:\n {19}.*)*)", out, flags=re.MULTILINE))
    assert set(entries) == set(sweep_names()), out
    for name, entry in entries.items():
        shown = " ".join(entry.split())
        header = " ".join(line.lstrip("#").strip() for line in header_lines(SWEEPS_DIR / f"{name}.yaml"))
        assert header.startswith(shown) and shown.endswith("."), (name, shown)  # no sentence cut at a line's end
        rest = header[len(shown) :]
        assert not rest or re.match(r" [^\d]", rest), (name, shown, rest[:40])  # nor at "et al. 2023"
    assert entries["attention"].split()[-1] == "pairs)."  # its header's first sentence spans two lines


def header_lines(path: Path) -> list[str]:
    """A sweep file's comment lines after ``# @package _global_``, up to its first setting."""
    lines = path.read_text().splitlines()[1:]
    return lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))]


def swept_values(key: str, values: str) -> list[str]:
    """``"mha,gqa"`` -> ``["mha", "gqa"]``; ``glob(*)`` over an axis -> every registered part
    (``glob(*,exclude=moe)``: but those)."""
    if values.startswith("glob("):
        excluded = values.partition("exclude=")[2].rstrip(")").split(",") if "exclude=" in values else []
        return [name for name in zoo.AXES[key].names() if name not in excluded]
    return [v.strip() for v in str(values).split(",")]


@pytest.mark.parametrize("name", sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml")))
def test_every_sweep_file_is_a_multirun_whose_every_value_builds(name):
    text = (SWEEPS_DIR / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_\n")
    hydra = yaml.safe_load(text)["hydra"]
    assert hydra["mode"] == "MULTIRUN" and hydra["sweep"]["dir"] == f"runs/{name}"
    assert hydra["sweeper"]["params"], f"sweeps/{name}.yaml sweeps nothing"
    swept = {key: swept_values(key, values) for key, values in hydra["sweeper"]["params"].items()}
    cfg = compose(sweep_argv(name, [f"{key}={values[-1]}" for key, values in swept.items()]))  # one variant
    assert build_model(cfg).parameter_counts()["total"] > 0  # compose validated the block; this builds it


def test_mlp_sweep_matches_parameter_counts():
    mlps = swept_values(
        "mlp", yaml.safe_load((SWEEPS_DIR / "mlp.yaml").read_text())["hydra"]["sweeper"]["params"]["mlp"]
    )
    counts = {mlp: build_model(compose(sweep_argv("mlp", [f"mlp={mlp}"]))).parameter_counts() for mlp in mlps}
    assert len({c["mlp"] for c in counts.values()}) == 1 and len({c["total"] for c in counts.values()}) == 1, counts


def test_console_scripts_resolve():
    import importlib

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"zoo-train", "zoo-sweep", "zoo-report"} <= set(scripts)
    for target in scripts.values():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), target


def test_a_sweep_runs_on_every_core_by_default_unless_told():
    """As many runs at a time as the cores hold at the sweep's threads (sweeps/quick.yaml: 1 each)."""
    assert sweep_argv("quick", [], cores=4)[:3] == ["+sweeps=quick", "hydra/launcher=joblib", "hydra.launcher.n_jobs=4"]
    assert sweep_argv("quick", ["threads=2"], cores=4)[1:3] == ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    assert sweep_argv("quick", ["threads=2"], cores=2) == ["+sweeps=quick", "threads=2"]  # one at a time
    assert sweep_argv("quick", [], cores=1) == ["+sweeps=quick"]
    told = ["hydra/launcher=basic", "seed=0"]
    assert sweep_argv("quick", told, cores=8) == ["+sweeps=quick", *told]  # the command line's launcher


def hydra_config(*overrides: str):
    """zoo's config with Hydra's node, as a job of a sweep with these overrides sees it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from zoo.assembly.config_tree import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def keys_that_change_no_run() -> list[str]:
    """Every key zoo.lab.keys gives a runtime role, as an override names it: each runtime section and each of its
    keys in zoo's config (a tracker's options too), the sweep file, and the runtime keys of ``train``."""
    from zoo.lab.keys import RUNTIME, RUNTIME_TRAIN, SWEEP_FILE
    from zoo.lab.records.config import flatten

    config = OmegaConf.to_container(compose(["logger=tensorboard"]), resolve=True)
    keys = [SWEEP_FILE, *(f"train.{key}" for key in RUNTIME_TRAIN)]
    for section in RUNTIME:
        keys += [section, *(f"{section}.{k}" for k in flatten(config[section]) if isinstance(config[section], dict))]
    return keys


def test_no_key_that_changes_no_run_names_its_folder_or_changes_its_hash():
    """Derived from zoo.lab.keys, so a key given a runtime role later is covered: each such key, given to a sweep,
    leaves its run folders' names (Hydra's hydra.sweep.subdir) and its config hash as they were, but those that
    still name folders (NAMING_RUNTIME: a sweep over them compares speed or memory); and the names of runs that set
    none of them are what they always were."""
    from omegaconf import open_dict

    from zoo.lab.keys import NAMING_RUNTIME, SWEEP_FILE, names_folder
    from zoo.lab.records.config import config_hash

    base = ["mlp=gelu", "pos=none", "seed=0", "train.steps=4"]
    assert run_folder_name(base) == "mlp=gelu,pos=none,seed=0,train.steps=4"  # as before: no run folder renamed
    assert run_folder_name(["+sweeps=quick", "threads=2", *base]) == run_folder_name(base)
    assert run_folder_name(["compile=true", "parallel.tp=2", *base]).startswith("compile=true,mlp=gelu,")
    assert hydra_config(*base, "report.interaction=[pos,mlp]", "tune.width=64").hydra.sweep.subdir == \
        run_folder_name(base)  # fmt: skip
    config = OmegaConf.to_container(compose(base), resolve=True)
    keys = keys_that_change_no_run()
    assert {"report.interaction", "report.baseline", "tune.lr", "ladder.steps", "logger.dir"} <= set(keys), keys
    for key in keys:
        kept = any(key == k or key.startswith(f"{k}.") for k in NAMING_RUNTIME)
        assert names_folder(key) == kept, key
        for override in (f"{key}=changed", f"+{key}=[a,b]", f"~{key}"):
            assert (run_folder_name([*base, override]) != run_folder_name(base)) == kept, override
        if key == SWEEP_FILE:
            continue  # a group whose file sets values (those it sets do name runs), no key of the config
        changed = OmegaConf.create(config)
        with open_dict(changed):
            OmegaConf.update(changed, key, "changed", force_add=True)
        assert config_hash(OmegaConf.to_container(changed)) == config_hash(config), key


def test_a_sweeps_report_tune_and_ladder_are_checked_against_its_axes_before_any_run(tmp_path):
    """A report.interaction of an axis the sweep does not sweep (its file's or its command line's), one axis twice,
    or a bad report or tune option: refused in one line before any run, the swept axes named, no folder made."""
    from zoo.lab.planning.sweep import check_sweep, swept_axes

    assert swept_axes(hydra_config("+sweeps=quick")) == ["pos", "mlp"]  # seed is not an axis
    assert swept_axes(hydra_config("+sweeps=quick", "mlp=gelu")) == ["pos"]  # the command line's value wins
    check_sweep(hydra_config("+sweeps=quick", "report.interaction=[mlp,pos]"))
    for bad, says in [
        ("report.interaction=[nosuch,mlp]", "report.interaction='nosuch,mlp': 'nosuch' is not a swept axis; swept: "
                                            "pos, mlp"),
        ("report.interaction=[pos,pos]", "report.interaction=['pos', 'pos']: two different swept axes"),
        ("report.test=nosuch", "report.test='nosuch'"),
        ("report.margin=-1", "report.margin=-1: a number at least 0"),
        ("report.target_ema=1.5", "report.target_ema=1.5: a number in [0, 1)"),
        ("tune.lr=[-1]", "tune.lr=[-1]"),
    ]:  # fmt: skip
        with pytest.raises(zoo.ConfigError) as refused:
            check_sweep(hydra_config("+sweeps=quick", bad))
        assert str(refused.value).startswith(says), str(refused.value)
    folder = tmp_path / "sweep"
    done = zoo_cli("zoo.train", "-m", "mlp=gelu,swiglu", "report.interaction=[mlp,pos]", f"hydra.sweep.dir={folder}",
                   cwd=tmp_path, returncode=1)  # fmt: skip
    assert done.stderr.splitlines() == [
        "zoo-sweep: refused before any run: report.interaction='mlp,pos': 'pos' is not a swept axis; swept: mlp"
    ]
    assert not folder.exists() and not (tmp_path / "runs").exists()


@contextlib.contextmanager
def multirun_config(*overrides: str) -> Iterator:
    """zoo's config as a sweep with these overrides composes it (sweep values too), Hydra kept initialized."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from zoo.assembly.config_tree import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield GlobalHydra.instance().config_loader().load_configuration("config", list(overrides), RunMode.MULTIRUN)


def refusal(*overrides: str) -> str:
    """Why the sweep of these overrides is refused before any run ("" when it is not)."""
    from zoo.lab.planning.sweep import check_before_any_run

    with multirun_config(*overrides) as config:
        try:
            check_before_any_run(config)
        except zoo.ConfigError as error:
            return str(error)
    return ""


def test_every_swept_value_is_checked_before_any_run_and_a_combination_the_grid_refuses_is_not_a_mistake(tmp_path):
    """Each job's run config, composed as Hydra composes it, is checked as its run will be: a bad value names the
    field, what is allowed and the runs it refuses; a combination the compatibility map refuses is a result."""
    where = f"hydra.sweep.dir={tmp_path / 'sweep'}"
    assert refusal("+sweeps=quick", "block.attn.gate=none,head", where) == (
        "block.attn.gate='head': must be one of 'none', 'headwise', 'elementwise' "
        "(the 12 runs with block.attn.gate=head)"
    )
    assert refusal("+sweeps=quick", "block.n_heads=4,5", "mlp=gelu", where).startswith(
        "block.n_heads=5: must divide d_model=64 (head size = d_model / n_heads), or set block.attn.head_dim "
        "(the 6 runs with block.n_heads=5)"
    )
    assert refusal("+sweeps=quick", "block.d_model=30", where).startswith("block.n_heads=4: must divide d_model=30")
    assert refusal("+sweeps=quick", "attn=linear", "pos=none,alibi", where) == ""  # alibi with linear: incompatible
    assert not (tmp_path / "sweep").exists()


def test_a_report_baseline_names_a_swept_axis_and_one_of_its_values_before_any_run(tmp_path):
    """report.baseline is checked against the values the sweep's runs (and the runs its folder holds) give each
    axis, naming them: a value the sweep does not have, or an axis it holds fixed, is refused before any run."""
    folder = tmp_path / "sweep"
    quick = ("+sweeps=quick", f"hydra.sweep.dir={folder}")
    assert refusal(*quick, "report.baseline={pos: rotari}") == (
        "report.baseline='pos=rotari': one of pos's values: none, rotary (swept: pos: none, rotary; mlp: gelu, swiglu)"
    )
    assert refusal(*quick, "pos=none", "report.baseline={pos: rotary}") == (
        "report.baseline='pos=rotary': pos is not a swept axis (none in every run); swept: mlp: gelu, swiglu"
    )
    assert refusal(*quick, "report.baseline={pos: rotary, mlp: swiglu}") == ""
    fake_run(folder, ["pos=alibi", "seed=0"], value=2.0)  # a run the folder already holds is reported too
    assert refusal(*quick, "pos=none", "report.baseline={pos: alibi}") == ""


def test_the_tuning_sweep_is_checked_with_the_sweep_and_reports_only_the_axes_it_sweeps(tmp_path):
    """tune.lr's tuning sweep, as its own process will compose it, is checked before any run too; under
    tune.width it holds the width fixed, so its report leaves the width out of the interaction and baseline that
    the sweep's own report states."""
    from zoo.lab.planning.tuning import search_argv

    tuned = ("+sweeps=quick", "tune.lr=[1e-3,1e-2]", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert refusal(*tuned, "tune.width=30").startswith(
        "block.n_heads=4: must divide d_model=30 (head size = d_model / n_heads), or set block.attn.head_dim "
        "(first refused: the run pos=none "
    )
    assert refusal(*tuned, "tune.width=30").endswith("; in the tuning sweep of tune.lr at tune.width=30")
    widths = (*tuned, "block.d_model=32,64", "tune.width=32", "report.interaction=[[block.d_model,pos],[pos,mlp]]",
              "report.baseline={block.d_model: 64, pos: rotary}")  # fmt: skip
    assert refusal(*widths) == ""
    with multirun_config(*widths) as config:
        argv = search_argv(config, tmp_path / "tune", [1e-3, 1e-2], [0])
    assert "block.d_model=32" in argv and "block.d_model=32,64" not in argv
    assert argv[argv.index("block.d_model=32") + 1 : argv.index("tune.lr=null")] == [
        "report.baseline='pos=rotary'", "report.interaction=[[pos,mlp]]"]  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "composed"),
    [
        (("+sweeps=quick",), 12),
        (("mlp=gelu,swiglu", "+sweeps=quick,mlp"), 4),  # a group the sweep's own config does not choose
        (("mlp=gelu,swiglu", "+block.attn.extra=1", "seed=0,1"), 4),
        (("mlp=gelu,swiglu", "seed=0,1", "+data_seed=3"), 0),  # a seed set otherwise than as key=value
    ],
    ids=["quick", "swept-group", "added-key", "added-seed"],
)
def test_the_config_the_check_composed_for_a_job_is_the_one_hydra_composes_for_its_run(overrides, composed, tmp_path):
    """The check before any run composes each job as Hydra will for its run (the same config, a group the sweep's
    own config does not choose included); the jobs it so composed are those whose seeds it set as Hydra does."""
    from hydra.core.global_hydra import GlobalHydra

    from zoo.lab.planning.jobs import composed_jobs, job_configs, sweep_jobs, without_hydra

    with multirun_config(*overrides, f"hydra.sweep.dir={tmp_path}") as config:
        loader = GlobalHydra.instance().config_loader()
        jobs = list(job_configs(config, sweep_jobs(config)))
        for job in jobs:
            run_config, _ = without_hydra(loader.load_sweep_config(config, list(job.overrides)))
            assert job.config == OmegaConf.to_container(run_config, resolve=True), job.overrides
        assert len(jobs) == max(composed, 4) and len(composed_jobs(config)) == composed
        assert composed_jobs(config) <= {job.overrides for job in jobs}


def test_hydra_checks_that_a_job_composes_unless_the_check_before_any_run_composed_it(tmp_path, monkeypatch):
    """Hydra's sweeper composes each job before launching it (it composes, or the sweep stops before any run):
    zoo's sweeper leaves out the jobs the check before any run composed, and has Hydra compose every other."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import HydraContext

    from zoo.lab.planning.jobs import job_configs, sweep_jobs
    from zoo.lab.planning.sweeper import VariantSweeper

    with multirun_config("+sweeps=quick", f"hydra.sweep.dir={tmp_path}") as config:
        loader = GlobalHydra.instance().config_loader()
        launched = [tuple(job) for job in sweep_jobs(config)]
        list(job_configs(config, launched[:5]))  # the check composed the first five
        sweeper = VariantSweeper()
        sweeper.basic.config, sweeper.basic.hydra_context = config, HydraContext(loader, callbacks=None)
        validated = []
        monkeypatch.setattr(type(loader), "load_sweep_config",
                            lambda _, master_config, sweep_overrides: validated.append(tuple(sweep_overrides)))
        sweeper.basic.validate_batch_is_legal([list(job) for job in launched])
    assert len(launched) == 12 and validated == launched[5:]


def test_runs_of_different_configs_sent_to_one_run_folder_are_refused_before_any_run(tmp_path):
    """A run folder's name leaves out the sweep file (and the runtime keys): sweeping sweep files whose settings differ
    would send two configs to one folder, where the second run is refused after the first trained. The check
    refuses it before any run, naming the key left out, the folder and what differs; runs of one config sharing a
    folder (a runtime key swept) are no mistake."""
    where = f"hydra.sweep.dir={tmp_path}"
    refused = refusal("mlp=gelu,swiglu", "+sweeps=quick,mlp", where)
    assert refused.startswith("sweeps='mlp': the runs +sweeps=quick and +sweeps=mlp differ (block.bias: True there, "
                              "False here; "), refused  # fmt: skip
    assert refused.endswith("but share the run folder mlp=gelu, whose name leaves out sweeps: sweep each in a sweep "
                            "of its own"), refused  # fmt: skip
    assert refusal("+sweeps=quick", "report.test=t,permutation", where) == ""


def test_the_jobs_recorded_as_composed_are_those_the_latest_check_composed(tmp_path, monkeypatch):
    """A second check of the same sweep in one process (its option files may have changed since) records only the
    jobs it composed itself: a job the first check composed and the second did not is composed by Hydra again."""
    from zoo.lab.planning import jobs as jobs_module
    from zoo.lab.planning.sweep import checked_jobs

    with multirun_config("+sweeps=quick", f"hydra.sweep.dir={tmp_path}") as config:
        launched = {tuple(job) for job in jobs_module.sweep_jobs(config)}
        checked_jobs(config)
        assert jobs_module.composed_jobs(config) == launched
        monkeypatch.setattr(jobs_module, "MAX_COMPOSED", 1)  # the next check composes the first run of each value
        checked_jobs(config)
        covering = {tuple(job) for job in jobs_module.covering(jobs_module.sweep_jobs(config))}
    assert len(launched) == 12 and len(covering) < 12
    assert jobs_module.composed_jobs(config) == covering


def test_a_swept_group_the_sweeps_config_does_not_choose_counts_among_its_choices_of_groups(tmp_path, monkeypatch):
    """Which jobs the check composes one by one counts the choices of config groups as Hydra decides what a group
    is: ``+sweeps=quick,mlp`` is one (its config chooses no ``sweeps``), so 2 x 2 choices exceed a limit of 3."""
    from zoo.lab.planning import jobs as jobs_module

    monkeypatch.setattr(jobs_module, "MAX_COMPOSED", 3)
    with multirun_config("mlp=gelu,swiglu", "+sweeps=quick,mlp", f"hydra.sweep.dir={tmp_path}") as config:
        launched = jobs_module.sweep_jobs(config)
        selected = jobs_module.checked_selection(config, launched)
    assert len(launched) == 4 and selected == jobs_module.covering(launched) and len(selected) == 3


def test_a_grid_of_many_combinations_of_parts_is_checked_on_the_first_run_of_each_value(tmp_path):
    """Each choice of config groups takes Hydra a composition: sweeps/card.yaml's grid (every option file of five
    groups: thousands of runs) is checked on the first run of each value (every value of every swept key, each at
    least once); a smaller grid on every run."""
    from zoo.lab.planning.jobs import MAX_COMPOSED, checked_selection, sweep_jobs

    files = [len(list((ROOT / "conf" / group).glob("*.yaml"))) for group in ("placement", "norm", "attn", "pos", "mlp")]
    with multirun_config("+sweeps=card", f"hydra.sweep.dir={tmp_path}") as config:
        launched = sweep_jobs(config)
        selected = checked_selection(config, launched)
    assert len(launched) == math.prod(files) and len(selected) <= sum(files) < MAX_COMPOSED
    assert {o for job in selected for o in job} == {o for job in launched for o in job}
    with multirun_config("+sweeps=ladder", f"hydra.sweep.dir={tmp_path}") as config:
        assert checked_selection(config, sweep_jobs(config)) == sweep_jobs(config)  # 4 choices of groups, 100 runs
