"""One source for each default: the ``block``, ``model`` and ``train`` values of conf/config.yaml are the
ones Python callers get when they leave a key out (BlockDims, MODEL_DEFAULTS, TrainConfig), so the
command line and ``zoo.build_model`` build the same model from the same omission."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from zoo.assembly.compose import CONF_DIR
from zoo.core.dims import block_fields
from zoo.lab.planning.train_config import TrainConfig
from zoo.models.config import MODEL_DEFAULTS, model_options

#: train.branch: the plan's (zoo.lab.planning.branch), not TrainConfig's; off by default.
BRANCH = {"branch": {"from": None, "step": None}}
CONFIG = yaml.safe_load((CONF_DIR / "config.yaml").read_text())


def python_defaults(cls: type) -> dict:
    return {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            for f in dataclasses.fields(cls)}  # fmt: skip


@pytest.mark.parametrize(
    ("section", "defaults"),
    [
        ("block", {f.name: f.default for f in block_fields()}),  # head_dim: block.attn.head_dim's, no block key
        ("model", MODEL_DEFAULTS),
        ("train", {**python_defaults(TrainConfig), "budget": {"tokens": None, "flops": None}, **BRANCH}),
    ],
)
def test_the_config_trees_defaults_are_the_python_defaults(section, defaults):
    yaml_section = dict(CONFIG[section])
    if section == "train":  # train.budget.{tokens,flops} are TrainConfig.budget_{tokens,flops}
        defaults = {k: v for k, v in defaults.items() if not k.startswith("budget_")}
    assert set(yaml_section) == set(defaults), f"{section}: keys differ: {set(yaml_section) ^ set(defaults)}"
    drift = {k: (yaml_section[k], defaults[k]) for k in defaults if yaml_section[k] != defaults[k]}
    assert not drift, f"{section}: conf/config.yaml vs Python (key: (yaml, python)): {drift}"


def test_n_layers_is_the_same_from_python_and_the_command_line():
    import zoo

    assert model_options({})["n_layers"] == zoo.compose([]).model.n_layers == 4
