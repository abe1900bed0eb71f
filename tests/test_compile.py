"""torch.compile: every block of a pairwise covering set of the parts compiles as one graph
(``fullgraph=True``: a graph break, a host sync such as ``int(positions.max())``, is an error) and
computes what the eager block does, forward and backward; ``compile=true`` trains the same.

Dynamo's capture (where a graph breaks) is the same whatever the backend. The rows until every part has
appeared (zoo.testing.combos.every_part_once) compile with aot_eager, which also traces forward and backward
through AOTAutograd as inductor does (functionalized, on fake tensors), without generating code: that trace is
each part's ops'. The other rows of the covering set, where parts meet, compile with the eager backend: one
graph, run by eager PyTorch, half the time of an aot_eager row."""

from __future__ import annotations

import pytest
import torch

from zoo.lab.planning.train_config import check_run_config
from zoo.lab.training.scale import compile_block
from zoo.testing.combos import (
    block_config,
    build,
    combo_id,
    context_of,
    covering_combinations,
    every_part_once,
    randomize,
)

COVERING = covering_combinations()
TRACED = every_part_once(COVERING)  # compiled with aot_eager; the rest with the eager backend


@pytest.mark.slow
@pytest.mark.parametrize("start", range(0, len(COVERING), 9), ids=lambda s: f"rows{s}")
def test_blocks_compile_without_graph_breaks_and_match_eager(start):
    # Nine combinations per test keep the workers busy.
    for combo in COVERING[start : start + 9]:
        cfg = block_config(combo)
        context, _ = context_of(cfg)
        if context is None:
            continue
        torch._dynamo.reset()
        torch.manual_seed(0)
        eager = build(cfg, context).double().train()
        randomize(eager)
        compiled = build(cfg, context).double().train()
        compiled.load_state_dict(eager.state_dict())
        compile_block(compiled, backend="aot_eager" if combo in TRACED else "eager")
        x = torch.randn(2, 6, 16, dtype=torch.float64)
        outs = []
        for module in (eager, compiled):
            y = module(x)
            (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
            outs.append((y, [p.grad for p in module.parameters()]))
        (y0, g0), (y1, g1) = outs
        torch.testing.assert_close(y1, y0, rtol=1e-12, atol=1e-12, msg=lambda m, c=combo: f"{combo_id(c)}: {m}")
        for a, b in zip(g0, g1, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12, msg=lambda m, c=combo: f"{combo_id(c)}: {m}")


def test_covering_set_meets_every_pair_of_parts():
    from itertools import combinations

    from zoo import AXES
    from zoo.testing.combos import choices

    names = {axis: AXES[axis].names() for axis in AXES}
    met = {(a, r[a].partition("+")[0], b, r[b].partition("+")[0]) for r in COVERING for a, b in combinations(AXES, 2)}
    for a, b in combinations(AXES, 2):
        for x in names[a]:
            for y in names[b]:
                assert (a, x, b, y) in met, f"{a}={x} never meets {b}={y}"
    # far below the product of the axes (11520 today): the part rows near the largest two-axis product,
    # the lower bound of any pairwise covering, plus one row per option variant
    part_rows = [r for r in COVERING if not any("+" in label for label in r.values())]
    sizes = sorted(len(n) for n in names.values())
    assert len(part_rows) <= 1.25 * sizes[-1] * sizes[-2]
    variant_names = {(a, label.partition("+")[2]) for a in AXES for label in choices(a)[len(names[a]) :]}
    assert len(COVERING) - len(part_rows) == len(variant_names)
    assert {part for row in TRACED for part in row.items()} == {part for row in COVERING for part in row.items()}


def test_compile_key_is_a_bool():
    from zoo import ConfigError

    with pytest.raises(ConfigError, match="compile"):
        check_run_config({"compile": "yes"})


@pytest.mark.slow
def test_compile_true_trains_as_eager(tmp_path):
    from helpers import tiny

    from zoo.lab.records.metrics import read_metrics
    from zoo.lab.training.run import run

    overrides = ["pos=rotary", "norm=rmsnorm", "mlp=swiglu", "train.steps=3", "train.log_every=1", "train.eval_every=0"]
    eager = run(tiny(*overrides), tmp_path / "eager")
    compiled = run(tiny(*overrides, "compile=true"), tmp_path / "compiled")
    assert eager["status"] == compiled["status"] == "ok", compiled["error"]
    losses = [[r["loss"] for r in read_metrics(tmp_path / d) if r["kind"] == "train"] for d in ("eager", "compiled")]
    assert len(losses[0]) == 3
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)


@pytest.mark.slow
def test_compile_true_under_mup_trains_as_eager(tmp_path):
    """param=mup away from its base width (every multiplier != 1: init, rates, logit and score scales)
    compiles to the eager run's losses and final numbers."""
    from helpers import tiny

    from zoo.lab.records.metrics import read_metrics
    from zoo.lab.training.run import run

    overrides = ["param=mup", "param.base_width=16", "train.steps=3", "train.log_every=1", "train.eval_every=0"]
    eager = run(tiny(*overrides), tmp_path / "eager")
    compiled = run(tiny(*overrides, "compile=true"), tmp_path / "compiled")
    assert eager["status"] == compiled["status"] == "ok", compiled["error"]
    losses = [[r["loss"] for r in read_metrics(tmp_path / d) if r["kind"] == "train"] for d in ("eager", "compiled")]
    assert len(losses[0]) == 3 and losses[0][0] != losses[0][-1]  # it trained
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    standard = run(tiny(*overrides[2:]), tmp_path / "standard")
    first = [r["loss"] for r in read_metrics(tmp_path / "standard") if r["kind"] == "train"]
    assert standard["status"] == "ok" and first[0] != pytest.approx(losses[0][0], rel=1e-6)  # μP was applied
