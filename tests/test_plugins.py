"""Parts from other packages: entry points ``zoo.parts`` (modules that register parts) and ``zoo.conf``
(their option files on Hydra's search path), loaded once, lazily; failures named, never skipped.

Each test installs throwaway plugins into a temporary folder on ``sys.path`` (a ``.dist-info``
with ``entry_points.txt`` is all ``importlib.metadata`` needs), then undoes them.
"""

from __future__ import annotations

import sys
import textwrap
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import ROOT

import zoo
from zoo import NORMS, ConfigError, compose
from zoo.assembly.compose import option_file, search_path
from zoo.core import registry
from zoo.core.registry import BUILT_IN, PluginWarning, Registry
from zoo.lab.commands.catalogue import parts_markdown, print_check
from zoo.lab.commands.parts import parts_main

NORM = '''
import torch
from torch import nn
from zoo import NORMS

LOADS = []  # one entry per import of this module


@NORMS.register("{name}", formula="tanh(x) * g", reference="-")
class TanhNorm(nn.Module):
    """Tanh norm: an element-wise tanh and a gain."""

    def __init__(self, dims, *, gain_init: float = 1.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((dims.d_model,), gain_init))

    def forward(self, x):
        return torch.tanh(x) * self.weight


LOADS.append(1)
'''


class Plugins:
    """Writes plugin packages (modules, option files, metadata) under ``root``, which is on sys.path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: list[str] = []

    def add(
        self,
        dist: str,
        modules: dict[str, str],
        parts: dict[str, str],
        options: dict[str, str] | None = None,
        conf: str | None = None,
    ) -> None:
        """``modules``: module name -> source; ``parts``: entry-point name -> module (group zoo.parts);
        ``options``: path under the ``conf`` package -> YAML, the package declared in group zoo.conf."""
        for module, source in modules.items():
            path = self.root / Path(*module.split("."))
            path.mkdir(parents=True, exist_ok=True)
            (path / "__init__.py").write_text(textwrap.dedent(source))
            self.modules.append(module)
        groups = {"zoo.parts": parts}
        if options:
            folder = self.root / Path(*conf.split("."))
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "__init__.py").touch()
            for relative, text in options.items():
                (folder / relative).parent.mkdir(parents=True, exist_ok=True)
                (folder / relative).write_text(textwrap.dedent(text))
            groups["zoo.conf"] = {dist: conf}
            self.modules.append(conf)
        info = self.root / f"{dist.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(
            "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in groups.items())
        )


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """Fresh plugin state: nothing loaded yet; afterwards the plugins' parts and modules are gone."""
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.plugin_entry_points.cache_clear()
    monkeypatch.setitem(registry._state, "loaded", False)
    failed = list(registry.FAILED_PLUGINS)
    registry.FAILED_PLUGINS.clear()
    saved = {r: dict(r._parts) for r in Registry._every}
    made = Plugins(tmp_path)
    yield made
    registry.plugin_entry_points.cache_clear()
    registry.FAILED_PLUGINS[:] = failed
    for r, parts in saved.items():
        r._parts = parts
    for name in list(sys.modules):
        if any(name == m or name.startswith(f"{m}.") for m in made.modules):
            del sys.modules[name]


def test_plugin_parts_load_once_on_first_use_with_their_origin(plugins):
    plugins.add("zoo-tanh", {"zoo_tanh": NORM.format(name="tanhnorm")}, {"tanh": "zoo_tanh"})
    assert "zoo_tanh" not in sys.modules  # nothing imported before a registry is read
    assert "tanhnorm" in NORMS
    module = sys.modules["zoo_tanh"]
    assert NORMS.names()[-1] == "tanhnorm" and NORMS.names()[0] == "layernorm"  # after the built-ins
    NORMS.get("tanhnorm"), zoo.available(), len(NORMS)
    assert module.LOADS == [1] and sys.modules["zoo_tanh"] is module  # loaded once
    part = NORMS.get("tanhnorm")
    assert part.origin == "zoo-tanh" and NORMS.get("rmsnorm").origin == BUILT_IN
    assert "zoo_tanh.TanhNorm (zoo-tanh)" == part.where
    block = zoo.build_block({"d_model": 16, "n_heads": 4, "placement": "pre", "norm": "tanhnorm", "attn": "mha",
                             "pos": "none", "mlp": "gelu"})  # fmt: skip
    assert block.placement.norms[0].weight.shape == (16,)


def test_a_plugin_that_fails_to_import_is_named_and_none_of_its_parts_stay(plugins):
    broken = NORM.format(name="halfnorm") + "\nimport a_module_nobody_installed\n"
    plugins.add("zoo-broken", {"zoo_broken": broken}, {"broken": "zoo_broken"})
    plugins.add("zoo-tanh", {"zoo_tanh": NORM.format(name="tanhnorm")}, {"tanh": "zoo_tanh"})
    with pytest.warns(PluginWarning, match=r"plugin zoo-broken \(zoo.parts: broken = zoo_broken\) failed to load"):
        names = NORMS.names()
    assert "tanhnorm" in names and "halfnorm" not in names  # registered before the failing import: undone
    with pytest.raises(ConfigError) as error:
        NORMS.get("halfnorm")
    message = str(error.value)
    assert "unknown norm" in message and "zoo-broken" in message and "ModuleNotFoundError" in message
    assert "a_module_nobody_installed" in message
    assert [f.package for f in registry.FAILED_PLUGINS] == ["zoo-broken"]


def test_a_plugin_taking_a_registered_name_names_who_registered_it_first(plugins):
    plugins.add("zoo-clash", {"zoo_clash": NORM.format(name="rmsnorm")}, {"clash": "zoo_clash"})
    with pytest.warns(PluginWarning) as caught:
        assert NORMS.get("rmsnorm").origin == BUILT_IN
    (warning,) = [w for w in caught if issubclass(w.category, PluginWarning)]
    assert "norm part 'rmsnorm' is already registered by zoo.parts.norms.RMSNorm (built-in)" in str(warning.message)


def test_registering_a_name_twice_names_the_module_that_registered_it_first():
    names = Registry("norm")
    names.register("x")(type("X", (), {}))
    with pytest.raises(ValueError, match=r"'x' is already registered by test_plugins\.X \(test_plugins\)"):
        names.register("x")(type("Y", (), {}))


def test_plugin_option_files_work_like_built_in_ones(plugins, capsys):
    options = {"norm/tanhnorm.yaml": "# @package block.norm\nname: tanhnorm\ngain_init: 1.0\n"}
    plugins.add("zoo-tanh", {"zoo_tanh": NORM.format(name="tanhnorm")}, {"tanh": "zoo_tanh"}, options, "zoo_tanh.conf")
    assert "pkg://zoo_tanh.conf" in search_path()  # the first thing read: the parts register as the plugin's
    assert NORMS.get("tanhnorm").origin == "zoo-tanh"
    assert option_file("norm", "tanhnorm") == plugins.root / "zoo_tanh/conf/norm/tanhnorm.yaml"
    cfg = compose(["preset=llama", "norm=tanhnorm", "block.norm.gain_init=0.5", "block.d_model=32"])
    assert cfg.block.norm == {"name": "tanhnorm", "gain_init": 0.5}
    assert zoo.build_block(cfg.block).placement.norms[0].weight[0].item() == 0.5
    assert print_check(["norm=tanhnorm"], "model") == 0
    assert "valid: placement=pre norm=tanhnorm" in capsys.readouterr().out
    # A misspelt option: zoo names the part's options (not Hydra's "use +..." advice).
    assert print_check(["norm=tanhnorm", "block.norm.gian_init=2"], "model") == 1
    out = capsys.readouterr().out
    assert "block.norm.gian_init=2: not an option of norm 'tanhnorm'; options: gain_init" in out and "+" not in out


def test_zoo_parts_lists_each_part_with_where_it_comes_from(plugins, capsys):
    plugins.add("zoo-tanh", {"zoo_tanh": NORM.format(name="tanhnorm")}, {"tanh": "zoo_tanh"})
    parts_main([])
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.strip().startswith("tanhnorm"))
    assert line.endswith("[gain_init=1.0]  (from zoo-tanh)"), line
    listed = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and line.strip()}
    for part in (p for r in zoo.AXES.values() for p in r.parts() if p.origin == BUILT_IN):  # other plugins may add
        assert "(from" not in listed[part.name], listed[part.name]
    header = "plugins (entry points zoo.parts): "
    (plugin_line,) = [line for line in out.splitlines() if line.startswith(header)]
    assert "zoo-tanh 0.1 (tanh = zoo_tanh)" in plugin_line.removeprefix(header).split(", ")
    assert "| `tanhnorm` (from zoo-tanh) |" in parts_markdown()
    assert "tanhnorm" not in parts_markdown(plugins=False)


def test_an_option_file_named_after_another_part_is_reported_naming_the_file(plugins):
    options = {
        "norm/mynorm.yaml": "# @package block.norm\nname: rmsnorm\neps: 1.0e-06\n",  # copied, name not changed
        "norm/tahnnorm.yaml": "# @package block.norm\nname: tahnnorm\n",  # its part is not registered
        "norm/rmsnorm_loose.yaml": "# @package block.norm\nname: rmsnorm\neps: 1.0e-03\n",  # a setting of rmsnorm
    }
    plugins.add("zoo-conf", {"zoo_conf_only": ""}, {}, options, "zoo_conf_only.conf")
    folder = plugins.root / "zoo_conf_only/conf/norm"
    with pytest.raises(ConfigError) as error:
        compose(["norm=mynorm"])
    assert f"block.norm.name='rmsnorm': set by option file {folder / 'mynorm.yaml'}" in str(error.value)
    with pytest.raises(ConfigError) as error:
        compose(["norm=tahnnorm"])
    message = str(error.value)
    assert "unknown norm" in message and f"(set by option file {folder / 'tahnnorm.yaml'})" in message
    assert compose(["norm=rmsnorm_loose"]).block.norm.eps == 1e-3
    assert compose(["norm=mynorm", "block.norm.name=rmsnorm"]).block.norm.name == "rmsnorm"  # said on purpose


def test_the_dyt_example_plugin_takes_part_in_a_layer_pattern(plugins):
    """examples/zoo-dyt as installed (its module and option file): ``norm: dyt`` in a pattern entry, from the
    command line and from a dict, gives those layers DyT; the model decodes with caches as its full forward."""
    example = ROOT / "examples" / "zoo-dyt" / "zoo_dyt"
    module = {"zoo_dyt": (example / "__init__.py").read_text()}
    options = {"norm/dyt.yaml": (example / "conf" / "norm" / "dyt.yaml").read_text()}
    plugins.add("zoo-dyt", module, {"dyt": "zoo_dyt"}, options, "zoo_dyt.conf")
    base = ["preset=llama", "block.d_model=32", "block.n_heads=4", "model.n_layers=3"]
    model = zoo.build_model(compose([*base, "model.pattern=[{norm: {name: dyt, alpha_init: 0.7}},{}]"])).double()
    norms = [type(block.placement.norms[0]).__name__ for block in model.blocks]
    assert norms == ["DynamicTanh", "RMSNorm", "DynamicTanh"]
    assert model.blocks[2].placement.norms[1].alpha.item() == pytest.approx(0.7)
    raw = {"block": dict(compose(base).block), "model": {"n_layers": 2, "pattern": [{}, {"norm": "dyt"}]}}
    assert type(zoo.build_model(raw).blocks[1].placement.norms[0]).__name__ == "DynamicTanh"
    model.eval()
    ids = torch.randint(0, 256, (2, 7))
    caches = model.new_caches()
    steps = [model(ids[:, :4], caches=caches)] + [model(ids[:, t : t + 1], caches=caches) for t in range(4, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), model(ids), rtol=0, atol=1e-10)
    with pytest.raises(ConfigError, match=r"model.pattern\[1\].norm.alpha_init=0.0: must be > 0"):
        zoo.build_model(compose([*base, "model.pattern=[{},{norm: {name: dyt, alpha_init: 0}}]"]))


def test_a_conf_entry_point_that_does_not_import_is_named():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("zoo.assembly.config_tree.plugin_config_packages", lambda: [("zoo-gone", "zoo_gone.conf")])
        with pytest.warns(PluginWarning, match="plugin zoo-gone declares option files in 'zoo_gone.conf'"):
            assert not any("zoo_gone" in entry for entry in search_path())


def test_pytest_part_option_selects_exactly_the_combinations_with_that_part():
    conftest = sys.modules["conftest"]
    combos = ["pre-rmsnorm-mha-none-gelu", "pre-rmsnorm-mha-none-geglu", "pre-layernorm-gqa+window-none-gelu"]
    axes = [axis for axis in zoo.AXES if not zoo.AXES[axis].paired]  # the residual at add: not in the ids
    items = [SimpleNamespace(callspec=SimpleNamespace(params={"combo": dict(zip(axes, c.split("-"), strict=True))}))
             for c in combos] + [SimpleNamespace()]  # fmt: skip
    deselected = []
    config = SimpleNamespace(  # the options as pytest_configure parsed them
        stash={conftest.WANTED_PARTS: [conftest.parse_part(option) for option in ("mlp=gelu", "attn=gqa")]},
        hook=SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items)),
    )
    kept = list(items)
    conftest.pytest_collection_modifyitems(config, kept)
    assert [i.callspec.params["combo"]["attn"] for i in kept] == ["gqa+window"]  # gelu, not geglu; variants in
    assert len(deselected) == 3
    with pytest.raises(pytest.UsageError, match="did you mean 'gelu'"):
        conftest.parse_part("mlp=glue")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert conftest.parse_part("attn=gqa+window") == ("attn", "gqa+window")


LAB = '''
from pathlib import Path

import torch

from zoo.lab.tasks.base import Batch, Task, register_task
from zoo.lab.records.trackers import TRACKERS, Tracker


@TRACKERS.register("printer")
class Printer(Tracker):
    """Prints each record."""

    def __init__(self, root: Path, *, prefix: str = ">") -> None:
        super().__init__(root)
        self.prefix = prefix


@register_task("ones")
class Ones(Task):
    """Predict a one after every one."""

    def __init__(self, *, seq_len: int = 8, eval_lengths: tuple[int, ...] = (1,), metric: str | None = None) -> None:
        super().__init__(eval_lengths=eval_lengths, metric=metric)
        self.vocab_size, self.seq_len = 2, seq_len

    def train_batch(self, batch_size, generator):
        ones = torch.ones(batch_size, self.seq_len, dtype=torch.long)
        return Batch(ones, ones)

    def val_batches(self, batch_size, n_batches, factor=1):
        return [self.train_batch(batch_size, None) for _ in range(n_batches)]

    def info(self):
        return {"task": self.name, "source": "generated"}
'''


def test_a_plugin_registers_a_task_and_a_tracker_like_a_part(plugins, capsys):
    from zoo.lab.records.trackers import TRACKERS, check_logger
    from zoo.lab.tasks import TASKS, build_task

    options = {
        "logger/printer.yaml": "# @package logger\nname: printer\nprefix: '>'\n",
        "task/ones.yaml": "# @package task\nname: ones\nseq_len: 8\neval_lengths: [1]\nmetric: null\n",
    }
    plugins.add("zoo-lab-extra", {"zoo_lab_extra": LAB}, {"extra": "zoo_lab_extra"}, options, "zoo_lab_extra.conf")
    assert "zoo_lab_extra" not in sys.modules  # loaded on first use, as parts are
    assert TRACKERS.get("printer").origin == TASKS.get("ones").origin == "zoo-lab-extra"
    cfg = compose(["logger=printer", "logger.prefix=+", "task=ones"])
    assert check_logger(cfg.logger) == {"name": "printer", "prefix": "+"}
    assert build_task(cfg.task).info() == {"task": "ones", "source": "generated"}
    parts_main([])
    out = capsys.readouterr().out
    task_section = out[out.index("\ntask:\n") : out.index("\nlogger:\n")]
    logger_section = out[out.index("\nlogger:\n") : out.index("\nplugins")]
    assert "  ones " in task_section and task_section.splitlines()[-1].endswith("(from zoo-lab-extra)")
    (printer,) = [line for line in logger_section.splitlines() if line.strip().startswith("printer")]
    assert printer.endswith("Prints each record.  [prefix=>]  (from zoo-lab-extra)"), printer
    with pytest.raises(ConfigError, match=r"^logger='printr': unknown logger; did you mean 'printer'\?"):
        check_logger({"name": "printr"})


def test_a_run_records_its_plugins_and_one_evaluated_without_them_names_the_missing_package(plugins, tmp_path):
    from helpers import tiny

    from zoo.lab.commands.evaluate import main as eval_main
    from zoo.lab.training.run import run

    options = {"norm/tanhnorm.yaml": "# @package block.norm\nname: tanhnorm\ngain_init: 1.0\n"}
    plugins.add("zoo-tanh", {"zoo_tanh": NORM.format(name="tanhnorm")}, {"tanh": "zoo_tanh"}, options, "zoo_tanh.conf")
    summary = run(tiny("norm=tanhnorm", "train.steps=2", "train.eval_every=2"), tmp_path / "run")
    assert summary["status"] == "ok", summary["error"]
    assert summary["versions"]["plugins"] == {"zoo-tanh": "0.1"}
    assert zoo.load_run(tmp_path / "run").model.blocks[0].placement.norms[0].weight.shape == (32,)
    (plugins.root / "zoo_tanh-0.1.dist-info/entry_points.txt").unlink()  # uninstalled: no entry point
    registry.plugin_entry_points.cache_clear()
    NORMS.unregister("tanhnorm")
    with pytest.raises(ConfigError) as missing:
        zoo.load_run(tmp_path / "run")
    assert "'tanhnorm': unknown norm" in str(missing.value)
    assert str(missing.value).endswith("; the run trained with plugin zoo-tanh 0.1 (not installed) (summary.json's "
                                       "versions.plugins): install it")  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        eval_main([str(tmp_path / "run")])
    assert "zoo-tanh 0.1 (not installed)" in str(exited.value.code)


def test_a_compose_remembered_is_redone_when_an_option_file_changes_and_hands_out_copies(plugins):
    """compose_with_choices answers a request it composed before from memory (zoo.assembly.config_tree.compose_key):
    an option file edited or added since is read anew, and a config handed out can be changed freely."""
    from omegaconf import open_dict

    from zoo.assembly.config_tree import _composed, compose_key

    options = {"norm/tanhnorm.yaml": "# @package block.norm\nname: tanhnorm\ngain_init: 1.0\n"}
    plugins.add("zoo-tanh", {"zoo_tanh": NORM.format(name="tanhnorm")}, {"tanh": "zoo_tanh"}, options, "zoo_tanh.conf")
    request = ["norm=tanhnorm", "block.d_model=32"]
    first = compose(request)
    assert first.block.norm.gain_init == 1.0 and compose_key(request, "config") in _composed
    for _ in range(2):  # the first compose's config, then one answered from memory
        with open_dict(first):
            first.block.norm.gain_init = 3.0
        first = compose(request)
        assert first.block.norm.gain_init == 1.0  # a copy went out: the remembered config is untouched
    conf = plugins.root / "zoo_tanh" / "conf" / "norm"
    (conf / "tanhnorm.yaml").write_text("# @package block.norm\nname: tanhnorm\ngain_init: 0.25\n")
    assert compose(request).block.norm.gain_init == 0.25  # edited (a new size or modification time)
    (conf / "tanhnorm_half.yaml").write_text("# @package block.norm\nname: tanhnorm\ngain_init: 0.5\n")
    assert compose(["norm=tanhnorm_half", "block.d_model=32"]).block.norm.gain_init == 0.5  # added
