"""model.kv_share: each group of k layers attends with its first layer's keys and values; a reading layer's
attention against the formula by hand, the cache holding one layer's keys and values per group, parameters and
FLOPs, and refusals by name."""

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from zoo import ConfigError
from zoo.models.config import layer_specs
from zoo.models.language import LanguageModel, build_model

BLOCK = {"d_model": 16, "n_heads": 4, "d_ff": 24, "placement": "pre", "norm": "rmsnorm", "attn": "gqa",
         "pos": "rotary", "mlp": "gelu", "bias": False}  # fmt: skip
T = 7


def model(kv_share: int, n_layers: int = 4, block: dict | None = None, pattern=None, **options) -> LanguageModel:
    torch.manual_seed(0)
    specs = layer_specs(block or BLOCK, n_layers, None, "model.layers", pattern)
    return LanguageModel(specs, 11, kv_share=kv_share, **options).double()


def test_a_reading_layer_attends_its_queries_over_its_group_firsts_keys_and_values():
    m = model(2)
    inputs, outputs = {}, {}
    for i in (0, 1):
        attn = m.blocks[i].attn
        attn.register_forward_pre_hook(lambda mod, args, i=i: inputs.__setitem__(i, args[0]))
        attn.register_forward_hook(lambda mod, args, out, i=i: outputs.__setitem__(i, out))
    m(torch.randint(0, 11, (2, T), generator=torch.Generator().manual_seed(1)))
    first, reader = m.blocks[0].attn, m.blocks[1].attn
    slots = torch.arange(T)
    _, k, v = first.project(inputs[0], slots)  # layer 0's keys (rotated) and values
    q = rearrange(reader.qkv(inputs[1]), "b t (h d) -> b h t d", d=reader.d_head)
    q, _ = reader.position.rotate(q, q, slots)
    group = reader.n_heads // reader.n_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = reader.out(rearrange(y, "b h t d -> b t (h d)"))
    torch.testing.assert_close(outputs[1], expected, rtol=1e-12, atol=1e-12)
    assert reader.qkv.out_features == reader.n_heads * reader.d_head  # queries alone


@pytest.mark.parametrize("k", [2, 3])
def test_the_cache_holds_one_layers_keys_and_values_per_group(k):
    plain, shared = model(1), model(k)
    ids = torch.randint(0, 11, (2, T))
    per_layer = []
    for m in (plain, shared):
        caches = m.new_caches(max_len=T)
        m(ids, caches=caches)
        assert all(cache.length == T for cache in caches)
        per_layer.append([cache.nbytes for cache in caches])
    groups = -(-4 // k)
    assert sum(per_layer[1]) == groups * per_layer[0][0]
    assert [n > 0 for n in per_layer[1]] == [i % k == 0 for i in range(4)]


def test_parameters_and_flops_lose_the_reading_layers_key_value_projections():
    plain, shared = model(1), model(2)
    attn = plain.blocks[0].attn
    removed = 2 * 2 * attn.n_kv_heads * attn.d_head * 16  # layers 1 and 3: keys and values from d_model
    assert plain.parameter_counts()["total"] - shared.parameter_counts()["total"] == removed
    assert plain.flops_per_token(8) - shared.flops_per_token(8) == 6 * removed


def test_a_config_sets_it_and_one_leaves_the_model_as_it_was():
    cfg = {"block": BLOCK, "model": {"vocab_size": 11, "n_layers": 2, "kv_share": 2}}
    assert build_model(cfg).blocks[1].attn.kv_role == "reads"
    cfg["model"]["kv_share"] = 1
    assert build_model(cfg).blocks[1].attn.kv_role is None


@pytest.mark.parametrize(
    ("block", "pattern", "options", "says"),
    [
        ({**BLOCK, "attn": "linear"}, None, {}, "holds no keys and values"),
        ({**BLOCK, "attn": "mla"}, None, {}, "holds no keys and values"),
        (BLOCK, [{"attn": "gated_deltanet"}, {}], {}, "holds no keys and values"),
        (BLOCK, [{}, {"attn": {"name": "gqa", "n_kv_heads": 4}}], {}, "differ from layer 0's"),
        (BLOCK, [{}, {"pos": "none"}], {}, "differ from layer 0's"),
        ({**BLOCK, "attn": {"name": "gqa", "value_residual": "learned"}}, None, {}, "value_residual"),
        (BLOCK, None, {"value_embeddings": True}, "value_embeddings"),
    ],
)
def test_refused_by_name_where_layers_cannot_share(block, pattern, options, says):
    with pytest.raises(ConfigError) as error:
        model(2, n_layers=2, block=block, pattern=pattern, **options)
    assert error.value.field == "model.kv_share" and error.value.value == 2 and says in str(error.value)


def test_a_bad_value_names_the_field():
    with pytest.raises(ConfigError) as error:
        build_model({"block": BLOCK, "model": {"vocab_size": 11, "n_layers": 2, "kv_share": 0}})
    assert error.value.field == "model.kv_share"


def test_export_to_transformers_refuses_it():
    from zoo.models.hf import family_for

    llama = {**BLOCK, "attn": "gqa", "mlp": "swiglu"}
    with pytest.raises(ConfigError) as error:
        family_for(model(2, n_layers=2, block=llama))
    assert error.value.field == "model.kv_share"


def test_tensor_parallel_is_refused():
    with pytest.raises(ValueError, match="kv_share"):
        model(2, n_layers=2).tp_plan()
