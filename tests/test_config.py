"""Configs and the registry: bad input fails early with a message naming field, value and choices."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

import zoo
from zoo import AXES, ConfigError, Registry, build_block, compose, resolve_block
from zoo.assembly.compose import option_file
from zoo.assembly.spec import every_option
from zoo.core.registry import BUILT_IN
from zoo.testing.combos import TINY


def cfg(**changes):
    base = {**TINY, "placement": "pre", "norm": "layernorm", "attn": "gqa", "pos": "rotary", "mlp": "gelu"}
    return {**base, **changes}


def test_available_lists_every_axis():
    assert set(zoo.available()) == {"placement", "norm", "attn", "pos", "mlp", "residual"}
    assert zoo.available()["attn"] == ["mha", "gqa", "mqa", "mla", "linear", "gated_deltanet", "kda", "mamba2"]


def test_compose_then_build_like_the_command_line():
    composed = compose(["norm=rmsnorm", "attn=gqa", "pos=rotary", "mlp=swiglu", "placement=pre"])
    assert composed.block.attn.n_kv_heads == 2 and composed.block.norm.name == "rmsnorm"
    block = build_block(composed.block)
    x = torch.randn(2, 16, composed.block.d_model)
    assert block(x).shape == x.shape


def test_plain_dict_builds_the_same_block_as_the_composed_config():
    composed = compose(["preset=llama"])
    plain = OmegaConf.to_container(composed.block)
    assert isinstance(plain, dict)
    torch.manual_seed(0)
    a = build_block(composed.block)
    torch.manual_seed(0)
    b = build_block(plain)
    x = torch.randn(1, 4, composed.block.d_model)
    torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ("gpt", {"placement": "pre", "norm": "layernorm", "attn": "mha", "pos": "learned", "mlp": "gelu"}),
        ("llama", {"placement": "pre", "norm": "rmsnorm", "attn": "gqa", "pos": "rotary", "mlp": "swiglu"}),
        ("vaswani", {"placement": "post", "norm": "layernorm", "attn": "mha", "pos": "sinusoidal", "mlp": "relu"}),
    ],
)
def test_presets_set_every_axis(preset, expected):
    block = compose([f"preset={preset}"]).block
    assert {axis: block[axis].name for axis in AXES} == {**expected, "residual": "add"}
    assert block.bias is (preset != "llama")


def test_the_gemma3_preset_is_five_local_layers_to_one_global_at_the_size_it_states():
    """The preset's pattern and the parameter count its comment states; its sizes override; a depth below the
    pattern's 6 layers is refused naming the first entry no layer would take."""
    model = zoo.build_model(compose(["preset=gemma3"]))
    assert sum(p.numel() for p in model.parameters()) == 2_297_728
    assert [block.attn.window for block in model.blocks] == [32] * 5 + [None]
    assert [block.attn.position.base for block in model.blocks] == [1e4] * 5 + [1e6]
    wider = zoo.build_model(compose(["preset=gemma3", "block.d_model=64", "block.n_heads=2", "model.n_layers=8"]))
    assert [block.attn.window for block in wider.blocks] == [32] * 5 + [None] + [32] * 2
    assert wider.embed.embedding_dim == 64 and wider.blocks[0].attn.n_heads == 2
    with pytest.raises(ConfigError, match=r"^model\.pattern\[4\]=.*past the depth: model\.n_layers=4"):
        zoo.build_model(compose(["preset=gemma3", "model.n_layers=4"]))


def test_command_line_choice_beats_preset():
    assert compose(["preset=llama", "norm=layernorm"]).block.norm.name == "layernorm"


def test_unknown_part_names_axis_value_closest_and_all():
    with pytest.raises(ConfigError) as error:
        resolve_block(cfg(norm="rmsnrom"))
    message = str(error.value)
    assert "block.norm.name='rmsnrom'" in message
    assert "did you mean 'rmsnorm'" in message
    assert "layernorm, rmsnorm" in message


def test_unknown_part_on_the_command_line():
    with pytest.raises(ConfigError, match="norm='rmsnrom': unknown norm; did you mean 'rmsnorm'"):
        compose(["norm=rmsnrom"])


@pytest.mark.parametrize(
    ("changes", "field", "allowed"),
    [
        ({"d_model": 18}, "block.n_heads=4", "must divide d_model=18"),
        ({"attn": {"name": "gqa", "n_kv_heads": 3}}, "block.attn.n_kv_heads=3", "one of [1, 2, 4]"),
        ({"attn": {"name": "gqa", "n_kv_heads": 0}}, "block.attn.n_kv_heads=0", "must divide"),
        ({"d_model": 12, "n_heads": 4}, "block.d_model=12", "even head size"),
        ({"d_model": 0}, "block.d_model=0", "positive"),
        ({"n_heads": -2}, "block.n_heads=-2", "positive"),
        ({"d_ff": 0}, "block.d_ff=0", "positive"),
        ({"dropout": 1.0}, "block.dropout=1.0", "[0, 1)"),
        ({"dropout": -0.1}, "block.dropout=-0.1", "[0, 1)"),
        ({"d_modle": 16}, "block.d_modle=16", "unknown key"),
        ({"norm": {"name": "rmsnorm", "epss": 1e-5}}, "block.norm.epss", "options: eps"),
        ({"norm": {"name": "rmsnorm", "eps": 0.0}}, "block.norm.eps=0.0", "> 0"),
        ({"d_model": "16"}, "block.d_model='16'", "must be int"),
        ({"d_model": 16.0}, "block.d_model=16.0", "must be int"),
        ({"bias": "yes"}, "block.bias='yes'", "must be bool"),
        ({"attn": {"name": "mha", "backend": "flash"}}, "block.attn.backend='flash'", "'sdpa', 'math'"),
        ({"attn": {"name": "mha", "n_kv_heads": 2.5}}, "block.attn.n_kv_heads=2.5", "int or null"),
        ({"norm": None}, "block.norm=None", "layernorm, rmsnorm"),
        ({"norm": {"eps": 1e-5}}, "block.norm=", "needs a 'name'"),
        ({"max_len": 0}, "block.max_len=0", "positive"),
        ({"attn": {"name": "mha", "window": 0}}, "block.attn.window=0", "positive integer, or null"),
        ({"attn": {"name": "mha", "softcap": -1.0, "backend": "math"}}, "block.attn.softcap=-1.0", "> 0"),
        ({"pos": {"name": "rotary", "rotary_fraction": 1.5}}, "block.pos.rotary_fraction=1.5", "(0, 1]"),
        ({"norm": {"name": "scalenorm", "eps": 0.0}}, "block.norm.eps=0.0", "> 0"),
    ],
)
def test_bad_config_names_field_value_and_allowed(changes, field, allowed):
    with pytest.raises(ConfigError) as error:
        build_block(cfg(**changes))
    assert field in str(error.value) and allowed in str(error.value), str(error.value)


def test_typo_on_the_command_line_fails_at_composition():
    with pytest.raises(ConfigError, match="block.d_modle='64': unknown key 'd_modle' of block; did you mean 'd_model'"):
        compose(["block.d_modle=64"])
    with pytest.raises(ConfigError, match="block.n_heads=5"):
        compose(["block.n_heads=5"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["block.norm.epss=1e-5"], "block.norm.epss=1e-05: not an option of norm 'layernorm'; options: eps"),
        (["attn=gqa", "block.attn.n_kv_head=1"], "of attn 'gqa'; options: n_kv_heads, head_dim, scale_dim, backend, "),
        (["placement=post", "block.placement.alpha=2"], "not an option of placement 'post'; options: none"),
        (["mlp=swiglu", "block.mlp.macth=params"], "options: match, match_mlp, match_attn"),
    ],
)
def test_a_misspelt_option_names_the_parts_options_not_hydras_plus(overrides, message):
    # Hydra would say "Could not override ... To append to your config use +block.norm.epss", which
    # leads the wrong way: the axis nodes are open, and zoo's own check names what the part takes.
    with pytest.raises(ConfigError) as error:
        compose(overrides)
    assert message in str(error.value), str(error.value)


def test_registering_a_name_twice_is_an_error():
    registry = Registry("norm")
    registry.register("x")(type("X", (), {}))
    with pytest.raises(ValueError, match="'x' is already registered"):
        registry.register("x")(type("Y", (), {}))


@pytest.mark.parametrize("shape", [(16,), (2, 16), (2, 3, 8), (2, 3, 16, 1)])
def test_wrong_input_rank_or_width_is_a_clear_error(shape):
    block = build_block(cfg())
    with pytest.raises(ValueError, match=r"\(batch, time, d_model=16\)"):
        block(torch.randn(*shape))


def option_files(axis: str) -> dict[str, Path]:
    return {path.stem: path for path in sorted((zoo.CONF_DIR / axis).glob("*.yaml"))}


@pytest.mark.parametrize("axis", list(AXES))
def test_option_files_and_registry_agree(axis):
    """A file per built-in part, named after it; any other file is a setting of a part, named after the part
    and the setting (norm/gated_rmsnorm.yaml: rmsnorm with its gate)."""
    built_in = {part.name for part in AXES[axis].parts() if part.origin == BUILT_IN}
    files = option_files(axis)
    assert built_in <= set(files)
    for stem in set(files) - built_in:
        name = yaml.safe_load(files[stem].read_text())["name"]
        assert name in built_in and (stem.startswith(f"{name}_") or stem.endswith(f"_{name}")), stem


@pytest.mark.parametrize(
    ("axis", "name"), [(axis, name) for axis, registry in AXES.items() for name in registry.names()]
)
def test_every_option_file_builds_and_lists_every_option(axis, name):
    path = option_file(axis, name)  # zoo's conf/, or a plugin's option files
    assert path is not None, f"no option file {axis}/{name}.yaml"
    assert path.read_text().startswith(f"# @package block.{axis}\n")
    node = yaml.safe_load(path.read_text())
    assert node.pop("name") == name
    assert node == every_option(AXES[axis].get(name))
    composed = compose([f"{axis}={name}", "block.d_model=16", "block.n_heads=4", "block.max_len=32"])
    assert zoo.check_combination(composed) is None
    build_block(composed.block, context="model")


def test_the_attention_output_options_leave_existing_config_hashes_as_they_were():
    """block.attn.gate, sink and xsa at their defaults are out of the hash: the hashes below were computed
    before the option files had these keys; set away from their defaults, each is a new run."""
    from helpers import tiny

    from zoo.lab.records.config import config_hash

    recorded = {(): "0a7575235f9168ae", ("attn=gqa",): "0a03979dc78d43b5",
                ("attn=mla", "block.attn.kv_rank=8"): "bd419525ca1e7053"}  # fmt: skip
    for overrides, digest in recorded.items():
        config = tiny(*overrides)
        assert {"gate": "none", "sink": "none", "xsa": False}.items() <= config["block"]["attn"].items()
        assert config_hash(config) == digest, overrides
        spelt = tiny(*overrides, "block.attn.gate=none", "block.attn.sink=none", "block.attn.xsa=false")
        assert config_hash(spelt) == digest, overrides
    changed = [tiny(f"block.attn.{key}") for key in ("gate=headwise", "gate=elementwise", "sink=learned", "xsa=true")]
    assert len({config_hash(c) for c in changed} | {recorded[()]}) == 5


def test_block_canon_at_none_leaves_existing_config_hashes_as_they_were():
    """block.canon (config.yaml: none) is out of the hash at none: the hashes below were computed before the
    key existed; set to sites, each is a new run."""
    from helpers import tiny

    from zoo.lab.records.config import config_hash

    recorded = {(): "0a7575235f9168ae", ("attn=gqa",): "0a03979dc78d43b5",
                ("mlp=swiglu", "placement=post"): "5f5abd0432f7eee0",
                ("attn=gated_deltanet",): "a136122f0d36426a"}  # fmt: skip
    for overrides, digest in recorded.items():
        config = tiny(*overrides)
        assert config["block"]["canon"] == "none"
        assert config_hash(config) == digest, overrides
        assert config_hash(tiny(*overrides, "block.canon=none")) == digest, overrides
    changed = {config_hash(tiny(f"block.canon={sites}")) for sites in ("a", "ac", "abcd")}
    assert len(changed | {recorded[()]}) == 4


def test_value_residual_and_value_embeddings_off_leave_existing_config_hashes_as_they_were():
    """block.attn.value_residual (none) and model.value_embeddings (false) are out of the hash at their defaults:
    the hashes below were computed before the keys existed; set, each is a new run."""
    from helpers import tiny

    from zoo.lab.records.config import config_hash

    recorded = {(): "0a7575235f9168ae", ("attn=gqa",): "0a03979dc78d43b5",
                ("attn=gated_deltanet",): "a136122f0d36426a"}  # fmt: skip
    for overrides, digest in recorded.items():
        config = tiny(*overrides)
        assert config["model"]["value_embeddings"] is False
        assert config_hash(config) == digest, overrides
        assert config_hash(tiny(*overrides, "model.value_embeddings=false")) == digest, overrides
    assert tiny("attn=gqa")["block"]["attn"]["value_residual"] == "none"
    changed = [tiny(key) for key in ("block.attn.value_residual=learned", "block.attn.value_residual=per_token",
                                     "model.value_embeddings=true")]  # fmt: skip
    assert len({config_hash(c) for c in changed} | {recorded[()]}) == 4


def test_the_tests_tiny_config_is_composed_again_when_the_registered_parts_change():
    """tests/helpers.tiny keeps each composition for the process: a part unregistered since is refused, not
    handed out from what was composed while it was registered."""
    from helpers import registered, tiny

    from zoo.core.registry import NORMS
    from zoo.parts.norms import RMSNorm

    class Mine(RMSNorm):
        pass

    with registered((NORMS, "mine", Mine)):
        assert tiny("block.norm.name=mine")["block"]["norm"]["name"] == "mine"
    with pytest.raises(ConfigError, match="unknown norm"):
        tiny("block.norm.name=mine")
