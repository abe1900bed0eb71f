"""Every preset in conf/preset: it builds at its own size, a family preset states that size truly (its parameter
count, in its comment), and its size keys are overridable from the command line. A preset added later is
checked the day it is added."""

from __future__ import annotations

import re

import pytest
import torch

import zoo
from zoo.assembly.config_tree import CONF_DIR

PRESETS = sorted(p.stem for p in (CONF_DIR / "preset").glob("*.yaml"))
#: The classic blocks (no sizes of their own); every other preset is a released model family at a small size.
CLASSICS = ("gpt", "llama", "vaswani")
STATED = re.compile(r"(\d+\.(\d+)M|\d{1,3}(?:,\d{3})+) parameters")


def model_of(overrides: list[str]) -> zoo.LanguageModel:
    return zoo.build_model(zoo.compose([*overrides, "model.vocab_size=256"]))  # the bytes task's vocabulary


def test_the_family_presets_are_there():
    assert set(PRESETS) - set(CLASSICS) >= {"qwen3_next", "olmo_hybrid", "gpt_oss", "deepseek_v3", "gemma3", "smollm3"}


@pytest.mark.parametrize("preset", [p for p in PRESETS if p not in CLASSICS])
def test_a_family_preset_states_its_parameter_count_truly(preset):
    text = (CONF_DIR / "preset" / f"{preset}.yaml").read_text()
    stated = STATED.search(text)
    assert stated, f"conf/preset/{preset}.yaml: say its size in its comment ('5.6M parameters' or '517,760 parameters')"
    count = model_of([f"preset={preset}"]).num_parameters()
    decimals = len(stated.group(2) or "")
    assert stated.group(1) in (f"{count / 1e6:.{decimals}f}M", f"{count:,}")


@pytest.mark.parametrize("preset", PRESETS)
def test_a_presets_sizes_are_overridable_and_it_trains(preset):
    cfg = zoo.compose([f"preset={preset}"])
    period = max(len(cfg.model.pattern), 1)
    d_model, heads = 2 * cfg.block.d_model // 8, 2  # a different width and head count from the preset's own
    model = model_of([f"preset={preset}", f"block.d_model={d_model}", f"block.n_heads={heads}",
                      f"model.n_layers={period}", "block.max_len=64"])  # fmt: skip
    assert model.embed.embedding_dim == d_model and len(model.blocks) == period
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = model(ids)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.roll(-1, 1).flatten()).backward()
    assert all(p.grad is not None for p in model.parameters())
