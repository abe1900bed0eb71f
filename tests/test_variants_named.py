"""Named variants (``variants``, ``ablate=hold_one_out|add_one``): the jobs they launch, their refusals before any
run, one tiny named sweep whose variant equal to a grid run shares that run's folder, and its report by name."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from helpers import SMALL, summaries, zoo_cli
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from zoo import compose
from zoo.core.errors import ConfigError
from zoo.lab.commands.argv import quoted_mappings
from zoo.lab.commands.sweep import SWEEPS_DIR, sweep_argv
from zoo.lab.keys import run_folder_name
from zoo.lab.planning.jobs import Job, culprit
from zoo.lab.planning.named import named_jobs, named_variants
from zoo.lab.planning.options import report_baseline
from zoo.lab.planning.sweep import check_baseline
from zoo.lab.planning.train_config import data_seed
from zoo.lab.studies.variants import build_report
from zoo.lab.tasks.base import build_task
from zoo.lab.training.run import run

VARIANTS = "variants={base: [], glu: [mlp=swiglu]}"


def parsed(*lines: str) -> list:
    return OverridesParser.create().parse_overrides(list(lines))


def test_variants_times_seeds_and_nothing_else():
    named = named_variants({"base": [], "glu": ["mlp=swiglu"], "rope": ["pos=rotary", "mlp=swiglu"]}, None)
    jobs = named_jobs(named, parsed("seed=0,1", "mlp=gelu", "train.steps=4"))
    assert [j[-1] for j in jobs] == ["variant=base"] * 2 + ["variant=glu"] * 2 + ["variant=rope"] * 2
    assert jobs[0] == ["mlp=gelu", "train.steps=4", "seed=0", "variant=base"]
    assert jobs[3] == ["train.steps=4", "seed=1", "mlp=swiglu", "variant=glu"]  # the variant's mlp, not the fixed one
    assert len({run_folder_name(j) for j in jobs}) == 6


def test_a_keys_last_override_wins_as_in_hydras_sweeper():
    """The sweep file's seeds narrowed on the command line (tune.lr's tuning sweep passes ``seed=0`` after the
    sweep file's ``seed: 0,1,2``): every job runs the last value given, as Hydra's basic sweeper's product does."""
    lines = ("seed=0,1,2", "block.d_model=32,64", "mlp=gelu", "seed=0", "mlp=relu,gelu", "train.lr=0.1,0.3")
    jobs = named_jobs(named_variants({"base": []}, None), parsed(*lines))
    grid = [job for batch in BasicSweeper.split_arguments(parsed(*lines), None) for job in batch]
    assert sorted(sorted(j[:-1]) for j in jobs) == sorted(sorted(j) for j in grid)
    assert len(jobs) == 8 and all([o for o in j if o.startswith("seed=")] == ["seed=0"] for j in jobs)


def test_hold_one_out_and_add_one_name_their_variants():
    features = {"gate": "block.attn.gate=none", "mtp": ["objective=ntp"]}
    held = named_variants(None, {"name": "hold_one_out", "features": features, "recipe": ["block.attn.gate=headwise"]})
    assert held == {"base": ["block.attn.gate=headwise"], "-gate": ["block.attn.gate=none"],
                    "-mtp": ["block.attn.gate=headwise", "objective=ntp"]}  # fmt: skip
    added = named_variants(None, {"name": "add_one", "features": {"hyper": "residual=hyper"}})
    assert added == {"base": [], "+hyper": ["residual=hyper"]}


@pytest.mark.parametrize(
    ("variants", "ablate", "field", "value"),
    [
        (["base"], None, "variants", ["base"]),  # not a mapping
        ({"base": "pos=rotary"}, None, "variants.base", "pos=rotary"),  # not a list
        ({"base": ["pos"]}, None, "variants.base", "pos"),  # not an override
        ({"a b": []}, None, "variants.a b", "a b"),  # a name the report cannot show
        ({"base": [], "same": []}, None, "variants.same", []),  # one folder for two names
        ({"base": ["seed=3"]}, None, "variants.base", "seed=3"),  # not data-matched
        (None, {"name": "hold_one_out", "features": {"a": "attn=gqa", "b": "block.attn.gate=none"}},
         "ablate.features.b", "block.attn.gate=none"),  # two features setting one node
        (None, {"name": "hold_one_out", "features": None}, "ablate.features", None),
        ({"base": []}, {"name": "add_one", "features": {"a": "pos=rotary"}}, "variants", {"base": []}),
        (None, {"name": "none", "features": {"a": "pos=rotary"}}, "ablate", "none"),
    ],
)  # fmt: skip
def test_variants_refused_by_name(variants, ablate, field, value):
    with pytest.raises(ConfigError) as error:
        named_variants(variants, ablate)
    assert (error.value.field, error.value.value) == (field, value), error.value


def test_a_variant_setting_a_swept_key_is_refused():
    named = named_variants({"base": [], "rope": ["pos=rotary"]}, None)
    with pytest.raises(ConfigError, match=r"variants.rope='pos=rotary': a key the sweep does not also sweep \(pos="):
        named_jobs(named, parsed("pos=none,learned", "seed=0,1"))


def test_a_variants_refused_override_names_the_variant():
    job = Job(("block.attn.gate=nne", "variant=-gate", "seed=0"), {}, {})
    launched = [job.overrides, ("variant=base", "seed=0")]
    assert culprit(job, "block.attn.gate", launched) == "variant -gate's block.attn.gate=nne"


def test_report_baseline_names_a_variant():
    assert report_baseline("glu") == {"variant": "glu"}
    jobs = [Job(("mlp=swiglu", f"variant={name}", "seed=0"), {}, {}) for name in ("base", "glu")]
    check_baseline(OmegaConf.create({"report": {"baseline": "glu"}}), jobs)
    with pytest.raises(ConfigError, match="report.baseline='variant=rope': one of variant's values: base, glu"):
        check_baseline(OmegaConf.create({"report": {"baseline": "rope"}}), jobs)


def test_yaml_flow_mappings_reach_hydra_quoted():
    given = ["variants={base: [], rope: [pos=rotary]}", "ablate.features={gate: block.attn.gate=none}", "seed=0,1"]
    quoted = quoted_mappings(given)
    assert quoted == ["variants={base: [], rope: ['pos=rotary']}", "ablate.features={gate: 'block.attn.gate=none'}",
                      "seed=0,1"]  # fmt: skip
    assert parsed(quoted[0])[0].value() == {"base": [], "rope": ["pos=rotary"]}


def test_the_holdout_sweep_holds_each_feature_out():
    section = OmegaConf.to_container(OmegaConf.load(SWEEPS_DIR / "holdout.yaml"), resolve=False)
    named = named_variants(section.get("variants"), {"name": "hold_one_out", **section["ablate"]})
    assert list(named)[0] == "base" and all(n.startswith("-") for n in list(named)[1:]) and len(named) >= 4


@pytest.fixture(scope="module")
def named_sweep(tmp_path_factory):
    """Two grid runs trained first into the folder (mlp=swiglu at seed 0; mlp=gelu, the default, named explicitly at
    seed 1), then the named sweep base/glu x seeds 0, 1: base at seed 1 and glu at seed 0 are those runs."""
    folder = tmp_path_factory.mktemp("named") / "sweep"
    fixed = [*SMALL, "train.save=none", "train.checkpoint_every=0"]
    grids = [[*fixed, "seed=0", "mlp=swiglu"], [*fixed, "seed=1", "mlp=gelu"]]
    before = {run_folder_name(g): run(compose(g), folder / run_folder_name(g), overrides=g) for g in grids}
    assert [r["status"] for r in before.values()] == ["ok", "ok"]
    done = zoo_cli("zoo.train", "-m", VARIANTS, "seed=0,1", *fixed, f"hydra.sweep.dir={folder}", cwd=folder.parent)
    return folder, before, done


def test_a_variant_equal_to_a_grid_run_trains_once_in_its_folder(named_sweep):
    folder, before, _ = named_sweep
    after = summaries(folder)
    assert len(after) == 4 and all(after[name] == record for name, record in before.items())  # not a byte changed
    glu = [s for s in after.values() if s["config"]["block"]["mlp"]["name"] == "swiglu"]
    assert len({s["config_hash"] for s in glu}) == 2 and all(s["status"] == "ok" for s in after.values())
    trained = [s for name, s in after.items() if name not in before]
    assert {(s["config"]["variant"], s["config"]["seed"]) for s in trained} == {("base", 0), ("glu", 1)}  # in no hash
    folders = json.loads((folder / "variants.json").read_text())["folders"]
    assert [folders[name] for name in before] == ["glu", "base"]  # base's config by other overrides: the hash decides


def test_the_report_names_variants_and_takes_a_named_baseline(named_sweep):
    folder, *_ = named_sweep
    with open(folder / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["variant"] for r in rows) == ["base", "glu"] and "mlp" not in rows[0]
    assert all(r["runs"] == r["ok"] == "2" for r in rows)
    report = build_report(folder, baseline=report_baseline("glu"))
    assert report.axes == ["variant"] and report.baseline_label == "glu" and not report.dropped
    assert [report.label(v) for v in report.comparisons] == ["base"]


def test_variants_of_a_seed_see_the_same_batches(named_sweep):
    folder, *_ = named_sweep
    configs = [s["config"] for s in summaries(folder).values() if s["config"]["seed"] == 0]
    assert {c["block"]["mlp"]["name"] for c in configs} == {"gelu", "swiglu"}
    batches = []
    for config in configs:
        generator = torch.Generator().manual_seed(data_seed(config) * 65_537)  # as the run seeds its data order
        task = build_task(config["task"])
        batches.append([task.train_batch(4, generator) for _ in range(3)])
    for other in batches[1:]:
        for a, b in zip(batches[0], other, strict=True):
            assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)


def test_a_named_sweep_is_refused_before_any_run(tmp_path):
    folder = tmp_path / "sweep"
    done = zoo_cli("zoo.train", "-m", "variants={base: [], rope: [pos=rotary]}", "pos=none,learned", *SMALL,
                   f"hydra.sweep.dir={folder}", cwd=tmp_path, returncode=1)  # fmt: skip
    assert done.stderr.splitlines()[-1] == ("zoo-sweep: refused before any run: variants.rope='pos=rotary': a key the "
                                            "sweep does not also sweep (pos=none,learned): a variant of each value "
                                            "instead")  # fmt: skip
    assert not folder.exists()


def test_sweep_argv_passes_variants(tmp_path):
    assert VARIANTS in sweep_argv("quick", [VARIANTS], cores=1)


def test_named_variants_beside_a_swept_width_give_rows_pooled_effects_and_an_interaction_by_name(tmp_path):
    """Named variants x block.d_model=16,32 (planted: glu 0.2 below base at width 16, 0.4 at 32): the axes are the
    variant's name and the width, never the key a variant sets, and the interaction reads by name."""
    from helpers import fake_run

    from zoo.lab.reports.report import write_built

    folders = {}
    for seed in range(3):
        for name, change, shift in (("base", [], 0.0), ("glu", ["mlp=swiglu"], -0.2)):
            for width in (16, 32):
                overrides = [f"variant={name}", f"block.d_model={width}", f"seed={seed}", *change]
                fake_run(tmp_path, overrides, value=3.0 + shift * width / 16 + 0.01 * seed, steps=10)
                folders[",".join(overrides)] = name
    (tmp_path / "variants.json").write_text(json.dumps({"variants": {"base": [], "glu": ["mlp=swiglu"]},
                                                        "folders": folders}))  # fmt: skip
    report = build_report(tmp_path)
    assert report.axes == ["variant", "block.d_model"] and report.baseline_label == "base block.d_model=16"
    text = write_built(report, plots=False)
    assert "| variant | glu | base | -0.3000 [-0.3000, -0.3000] | better | 6 | 3 |" in text
    assert ("interaction variant×block.d_model: (glu − base at block.d_model=32) − (glu − base at "
            "block.d_model=16) = -0.2000") in text  # fmt: skip
