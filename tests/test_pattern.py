"""Layer patterns: ``model.pattern``, block overrides repeated over the depth (layer i takes
pattern[i % len(pattern)], truncated at the depth), with ``model.layers`` applied on top."""

from __future__ import annotations

import pytest

from zoo import ConfigError, build_model, build_seq2seq, compose

HYBRID = "model.pattern=[{attn: gated_deltanet},{attn: gated_deltanet},{attn: gated_deltanet},{attn: mha}]"
#: Three sliding-window layers, then a global one without positions (NoPE), as nanochat's "SSSL".
SSSL = "model.pattern=[{attn: {window: 3}},{attn: {window: 3}},{attn: {window: 3}},{pos: none}]"

#: A Llama-like block as a plain dict, for the Python API.
LLAMA = {"d_model": 32, "n_heads": 4, "placement": "pre", "norm": "rmsnorm", "attn": "gqa", "pos": "rotary",
         "mlp": "swiglu", "max_len": 16}  # fmt: skip


def tiny_model(*overrides: str):
    return build_model(compose(["preset=llama", "block.d_model=32", "block.n_heads=4", *overrides]))


def mixers(model) -> list[str]:
    return [type(block.attn).__name__ for block in model.blocks]


def test_a_hybrid_pattern_from_the_command_line_repeats_over_the_depth():
    model = tiny_model("model.n_layers=8", HYBRID)
    assert mixers(model) == ["GatedDeltaNet"] * 3 + ["Attention"] + ["GatedDeltaNet"] * 3 + ["Attention"]
    assert [block.attn.n_kv_heads for block in model.blocks if hasattr(block.attn, "n_kv_heads")] == [4, 4]


def test_a_local_global_pattern_sets_windows_and_per_layer_positions():
    model = tiny_model("model.n_layers=8", "block.max_len=16", SSSL)
    assert [block.attn.window for block in model.blocks] == [3, 3, 3, None] * 2
    assert [type(block.attn.position).__name__ for block in model.blocks] == ["Rotary"] * 3 + ["NoPosition"] + [
        "Rotary"
    ] * 3 + ["NoPosition"]
    assert [block.attn.n_kv_heads for block in model.blocks] == [2] * 8  # the block's gqa kept: options merge


def test_a_pattern_that_does_not_divide_the_depth_is_truncated_and_layers_apply_on_top():
    block = LLAMA
    pattern = [{"attn": {"window": 2}}, {"attn": {"window": 2}}, {}]
    layers = {3: {"attn": {"window": 4}}, 4: {"mlp": "gelu"}, "5": {"attn": "mqa"}}  # on top of the pattern
    model = build_model({"block": block, "model": {"n_layers": 7, "pattern": pattern, "layers": layers}})
    assert [b.attn.window for b in model.blocks] == [2, 2, None, 4, 2, None, 2]
    assert [b.attn.n_kv_heads for b in model.blocks] == [2, 2, 2, 2, 2, 1, 2]
    assert [type(b.mlp).__name__ for b in model.blocks] == ["SwiGLU"] * 4 + ["GeluMLP"] + ["SwiGLU"] * 2
    with pytest.raises(ConfigError) as longer:  # an entry no layer takes would do nothing: refused by name
        build_model({"block": block, "model": {"n_layers": 2, "pattern": pattern}})
    assert str(longer.value) == ("model.pattern[2]={}: past the depth: model.n_layers=2 takes pattern[0] to "
                                 "pattern[1]; drop the entries past it or raise model.n_layers")  # fmt: skip


def test_an_empty_pattern_is_the_block_on_every_layer():
    plain, empty = tiny_model("model.n_layers=3"), tiny_model("model.n_layers=3", "model.pattern=[]")
    assert str(plain) == str(empty)
    assert str(tiny_model("model.n_layers=3", "model.pattern=[{}]")) == str(plain)


@pytest.mark.parametrize(
    ("overrides", "field", "allowed"),
    [
        (["model.pattern=mqa"], "model.pattern='mqa'", "must be a list of block overrides"),
        (["model.pattern=[{},mqa]"], "model.pattern[1]='mqa'", "a mapping of block overrides"),
        (["model.pattern=[{},{attn: mqb}]"], "model.pattern[1].attn.name='mqb'", "did you mean 'mqa'"),
        (["model.pattern=[{attn: {n_kv_heads: 3}}]"], "model.pattern[0].attn.n_kv_heads=3", "must divide"),
        (["model.pattern=[{d_model: 64}]"], "model.pattern[0].d_model=64", "must equal block.d_model=32"),
        (["model.pattern=[{d_modle: 64}]"], "model.pattern[0].d_modle=64", "unknown key"),
        (["model.pattern=[{},{pos: learned}]"], "model.pattern[1].pos='learned'", "set them once with block.pos"),
        (["model.pattern=[{pos: learned},{}]"], "model.pattern[0].pos='learned'", "set them once with block.pos"),
        (["model.pattern=[{pos: sinusoidal}]", "+model.layers.2.pos=rotary"], "model.pattern[0].pos='sinusoidal'",
         "set them once with block.pos"),  # fmt: skip
        (["pos=learned", "model.pattern=[{},{pos: rotary}]"], "model.pattern[1].pos='rotary'", "set them once"),
        (["model.pattern=[{cross_attention: true}]"], "model.pattern[0].cross_attention=True", "build_seq2seq"),
        (["model.pattern=[{},{attn: gated_deltanet}]", "+model.layers.1.attn.window=2"],
         "model.layers.1.attn.window=2", "not an option of attn 'gated_deltanet'"),  # fmt: skip
    ],
)
def test_a_bad_pattern_entry_is_refused_naming_it(overrides, field, allowed):
    with pytest.raises(ConfigError) as error:
        tiny_model("model.n_layers=4", "block.max_len=16", *overrides)
    assert field in str(error.value) and allowed in str(error.value), str(error.value)


def test_a_pattern_given_as_a_mapping_in_a_dict_config_is_refused_naming_it():
    block = LLAMA
    with pytest.raises(ConfigError, match=r"model.pattern=\{'attn': 'mqa'\}: must be a list of block overrides"):
        build_model({"block": block, "model": {"n_layers": 2, "pattern": {"attn": "mqa"}}})


def test_an_encoder_takes_its_own_pattern():
    base = ["preset=vaswani", "block.d_model=32", "block.n_heads=4", "model.n_layers=2", "+encoder.n_layers=3"]
    s2s = build_seq2seq(compose([*base, "+encoder.pattern=[{attn: mqa},{}]", "model.pattern=[{attn: gqa}]"]))
    assert [b.attn.n_kv_heads for b in s2s.encoder.blocks] == [1, 4, 1]
    assert [b.attn.n_kv_heads for b in s2s.decoder.blocks] == [2, 2]
    assert all(b.cross_attn is not None for b in s2s.decoder.blocks)
    assert not any(b.attn.causal for b in s2s.encoder.blocks)
    with pytest.raises(ConfigError, match=r"encoder.pattern\[1\].attn.name='mqb'"):
        build_seq2seq(compose([*base, "+encoder.pattern=[{},{attn: mqb}]"]))


def test_a_pattern_leaves_every_existing_config_hash_as_it_was():
    """model.pattern at [] is out of the hash: the hashes below were computed before the key existed;
    set, a pattern is a new run."""
    from helpers import tiny

    from zoo.lab.records.config import config_hash

    recorded = {(): "0a7575235f9168ae", ("attn=gqa",): "0a03979dc78d43b5",
                ("attn=mla", "block.attn.kv_rank=8"): "bd419525ca1e7053"}  # fmt: skip
    for overrides, digest in recorded.items():
        config = tiny(*overrides)
        assert config["model"]["pattern"] == []
        assert config_hash(config) == digest, overrides
    before = {"seed": 3, "model": {"n_layers": 2}, "encoder": {"n_layers": 3}}  # an encoder's pattern too
    spelt = {"seed": 3, "model": {"n_layers": 2, "pattern": []}, "encoder": {"n_layers": 3, "pattern": []}}
    assert config_hash(spelt) == config_hash(before)
    hybrid = config_hash(tiny(HYBRID))
    assert hybrid != recorded[()] and hybrid != config_hash(tiny(SSSL.replace("{pos: none}", "{}"), "block.max_len=64"))


def test_a_norm_used_by_a_pattern_entry_is_no_unused_axis():
    from zoo import PLACEMENTS
    from zoo.lab.studies.variants import unused_axes
    from zoo.parts.placements import Placement

    @PLACEMENTS.register("test_nonorm", formula="x = x + f(x)")
    class NoNorm(Placement):
        """No norm anywhere: the residual sum of the branches."""

        uses_norm = False
        final_norm = False

    try:
        free = {"block": {"placement": {"name": "test_nonorm"}}, "model": {"layers": {}, "pattern": [{}]}}
        assert unused_axes(free) == ["norm"]
        assert unused_axes({**free, "model": {"layers": {}, "pattern": [{}, {"placement": "pre"}]}}) == []
        assert unused_axes({**free, "model": {"layers": {1: {"placement": "pre"}}, "pattern": []}}) == []
    finally:
        PLACEMENTS.unregister("test_nonorm")


def test_flops_per_token_counts_each_layer_of_a_pattern_by_its_own_mixer():
    """A 3:1 hybrid: the Gated DeltaNet layers by their chunked form, the full layer by 6 x seq x d; a
    local/global stack: each windowed layer by min(window, seq) keys per query, the global one by seq."""
    d, heads, seq, vocab = 16, 2, 64, 32
    d_head, d_key, chunk = d // heads, 4, 8
    block = {"d_model": d, "n_heads": heads, "d_ff": 24, "bias": False, "placement": "pre", "norm": "rmsnorm",
             "attn": "mha", "pos": "none", "mlp": "gelu", "max_len": 128}  # fmt: skip
    gdn = {"attn": {"name": "gated_deltanet", "d_key": d_key, "chunk": chunk}}
    hybrid = build_model({"block": block, "model": {"n_layers": 4, "vocab_size": vocab, "pattern": [gdn] * 3 + [{}]}})
    mixing = 6 * heads * (chunk * (3 * d_key + 2 * d_head) + 3 * d_key * d_head)
    assert hybrid.flops_per_token(seq) == 6 * hybrid.num_parameters() + 3 * mixing + 6 * seq * d
    window = {"attn": {"window": 5}}
    local = build_model({"block": block, "model": {"n_layers": 4, "vocab_size": vocab, "pattern": [window] * 3 + [{}]}})
    assert local.flops_per_token(seq) == 6 * local.num_parameters() + 3 * 6 * 5 * d + 6 * seq * d
    assert local.flops_per_token(4) == 6 * local.num_parameters() + 4 * 6 * 4 * d  # the window wider than seq
