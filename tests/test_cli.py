"""Command-line tools and generated docs."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import registered

from zoo import AXES
from zoo.core.registry import BUILT_IN
from zoo.lab.commands.catalogue import LISTED, parts_markdown
from zoo.lab.commands.parts import parts_main
from zoo.lab.recipe import OBJECTIVES, OPTIMIZERS, SCHEDULES
from zoo.lab.records.trackers import TRACKERS
from zoo.lab.tasks import TASKS
from zoo.lab.training.loop_callbacks import CALLBACKS

ROOT = Path(__file__).resolve().parent.parent


def test_zoo_parts_lists_every_registered_part_task_tracker_optimizer_and_schedule(capsys):
    parts_main([])
    out = capsys.readouterr().out
    assert LISTED == {
        **AXES, "task": TASKS, "logger": TRACKERS, "optim": OPTIMIZERS, "schedule": SCHEDULES, "objective": OBJECTIVES,
        "callback": CALLBACKS,
    }  # fmt: skip
    sections = out.split("\n\nplugins")[0].split("\n")
    starts = [i for i, line in enumerate(sections) if not line.startswith(" ")]
    assert [sections[i] for i in starts] == [f"{key}:" for key in LISTED]
    for (key, registry), start, end in zip(LISTED.items(), starts, [*starts[1:], len(sections)], strict=True):
        assert [line.split()[0] for line in sections[start + 1 : end]] == registry.names(), key
    assert "  wandb        Weights & Biases" in out and "[mode=offline, project=zoo, entity=None, dir=None]" in out


def test_zoo_parts_names_a_part_that_declares_no_matrix_blocks(capsys):
    from torch import nn

    from zoo.core.registry import MLPS
    from zoo.lab.commands.catalogue import NO_MATRIX_BLOCKS

    class Opaque(nn.Module):
        """An MLP that says nothing of how its weights split."""

        def __init__(self, dims) -> None:
            super().__init__()

    with registered((MLPS, "opaque", Opaque)):
        parts_main([])
        out = capsys.readouterr().out
    marked = [line.split()[0] for line in out.splitlines() if NO_MATRIX_BLOCKS in line]
    assert marked == ["opaque"], marked  # every built-in part declares its blocks


def test_parts_catalogue_is_current():
    assert (ROOT / "docs" / "parts.md").read_text() == parts_markdown(plugins=False), (
        "docs/parts.md is stale: run `zoo-parts --markdown > docs/parts.md` (with no plugin installed)"
    )


def test_zoo_parts_params_counts_a_restricted_grid_with_matching(capsys):
    parts_main(
        ["--params", "--d-model", "64", "placement=pre", "norm=rmsnorm", "attn=mha,gqa", "pos=rotary,learned"]
        + ["mlp=gelu,swiglu", "block.mlp.match=params", "block.mlp.match_attn=mha", "block.max_len=32"]
    )
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| pre ")]
    assert len(rows) == 8
    matched = [row.split(" | ") for row in rows]
    reference = {row[-1].rstrip(" |") for row in matched}
    assert len(reference) == 1  # every variant matched to the same mha + gelu block
    target = int(next(iter(reference)).replace(",", ""))
    assert all(abs(int(row[-2].replace(",", "")) - target) < 200 for row in matched)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["block.d_model=abc"], "block.d_model='abc': must be int, got str"),
        (["attn=mha,gqa", "block.n_heads=0"], "block.n_heads=0"),
    ],
)
def test_zoo_parts_params_names_a_value_every_combination_refuses_once(overrides, message, capsys):
    """A block-wide value no combination accepts is one usage error, not the same reason on every row."""
    with pytest.raises(SystemExit) as exit_info:
        parts_main(["--params", *overrides])
    captured = capsys.readouterr()
    err, out = captured.err, captured.out
    assert exit_info.value.code == 2 and out == ""
    lines = err.strip().splitlines()
    assert lines[-1].startswith("zoo-parts: error: every combination is invalid: ") and message in lines[-1], err


def test_zoo_parts_params_keeps_a_row_per_combination_when_only_some_are_invalid(capsys):
    grid = ["placement=pre", "norm=rmsnorm", "mlp=gelu", "residual=add", "pos=none", "attn=mha,gated_deltanet"]
    parts_main(["--params", "--d-model", "64", *grid, "block.causal=false"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| pre ")]
    assert len(rows) == 2 and "invalid" not in rows[0], rows
    assert "invalid: block.attn.name='gated_deltanet': is causal only" in rows[1], rows


def test_readme_axis_table_lists_every_built_in_part_and_option():
    """The README's hand-written table of axes (names in the parts column outside parentheses,
    ``block.<axis>.<option>`` in the options column) agrees with the registry."""
    import re

    from zoo.assembly.spec import every_option
    from zoo.core.registry import BUILT_IN

    rows = re.findall(r"^\| `(\w+)` \|(.*?)\|(.*?)\|$", (ROOT / "README.md").read_text(), flags=re.MULTILINE)
    table = {axis: (parts, options) for axis, parts, options in rows if axis in AXES}
    assert list(table) == list(AXES), "README.md: one row per axis, in zoo.AXES order"
    for axis, (parts, options) in table.items():
        built_in = [part for part in AXES[axis].parts() if part.origin == BUILT_IN]
        listed = re.findall(r"`([\w-]+)`", re.sub(r"\(.*?\)", "", parts))
        assert listed == [part.name for part in built_in], f"README.md, axis {axis}: parts {listed}"
        named = re.findall(rf"`block\.{axis}\.(\w+)`", options)
        declared = list(dict.fromkeys(key for part in built_in for key in every_option(part)))
        assert named == declared, f"README.md, axis {axis}: options {named}, the parts declare {declared}"


def test_every_part_summary_is_a_whole_sentence():
    for axis, registry in AXES.items():
        for part in (p for p in registry.parts() if p.origin == BUILT_IN):  # zoo's own; a plugin's is its own
            assert part.summary[:1].isupper() and part.summary.endswith("."), (axis, part.name, part.summary)


def test_a_docstring_summary_is_its_first_sentence_even_when_it_wraps():
    from zoo.core.registry import Registry

    names = Registry("norm")
    wrapped = type("Wrapped", (), {"__doc__": "Scale each vector, e.g. by its norm, then\n    shift it. More here."})
    names.register("wrapped")(wrapped)
    assert names.get("wrapped").summary == "Scale each vector, e.g. by its norm, then shift it."


def test_a_summary_shows_code_in_single_backticks():
    from zoo.core.registry import first_sentence

    assert first_sentence("Decay over the last ``decay_fraction`` of the steps.") == (
        "Decay over the last `decay_fraction` of the steps."
    )
