"""block.residual=attnres (attention residuals, full and block): a stack against fla-core's naive_attnres loaded by
path (the paper's blocks and partial block written out here), its initial values, refusals, parameters and FLOPs."""

import importlib.util
import os

import pytest
import torch

from zoo import ConfigError, build_block, check_combination
from zoo.models.config import layer_specs
from zoo.models.language import LanguageModel

D, LAYERS = 16, 3
BLOCK = {"d_model": D, "n_heads": 4, "d_ff": 24, "placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "none",
         "mlp": "gelu"}  # fmt: skip


def naive_attnres():
    """fla-core's reference, loaded from its file (no GPU kernel imported)."""
    spec = importlib.util.find_spec("fla")
    if spec is None:
        pytest.skip("fla-core is not installed")
    path = os.path.join(os.path.dirname(spec.origin), "ops", "attnres", "naive.py")
    module_spec = importlib.util.spec_from_file_location("fla_attnres_naive", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.naive_attnres


def model(residual: dict | str, n_layers: int = LAYERS) -> LanguageModel:
    torch.manual_seed(0)
    return LanguageModel(layer_specs({**BLOCK, "residual": residual}, n_layers, None, "model.layers"), 11).double()


def paper_stack(embedding, terms, queries, gains, block_size, attnres):
    """The paper's block AttnRes: completed blocks (the embedding first) and a partial block; term j reads them all
    and its output starts a new partial block at each boundary (j % block_size == 0); the stack's sum at the end."""
    blocks, partial = [embedding], None
    for j, (term, query, gain) in enumerate(zip(terms, queries, gains, strict=True)):
        out = term(attnres(query, blocks + ([] if partial is None else [partial]), gain, rms_eps=1e-6))
        if j % block_size == 0:
            blocks += [] if partial is None else [partial]
            partial = out
        else:
            partial = partial + out
    return sum(blocks + [partial])


@pytest.mark.parametrize("block_size", [1, 2, 4])
def test_a_stack_matches_fla_cores_reference(block_size):
    attnres = naive_attnres()
    m = model({"name": "attnres", "block_size": block_size})
    with torch.no_grad():
        for name, p in m.named_parameters():
            if ".residual." in name:
                p.copy_(torch.randn_like(p))
    seen = []
    m.final_norm.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    ids = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(1))
    m(ids)
    terms, queries, gains = [], [], []
    for block in m.blocks:
        terms += block.placement.updates([block.attn, block.mlp])
        queries += list(block.residual.query.view(-1, D))
        gains += list(block.residual.key_norm.view(-1, D))
    queries, gains = [torch.zeros(D), *queries], [torch.ones(D), *gains]  # the first term: the embedding alone
    with torch.no_grad():
        expected = paper_stack(m.embed(ids), terms, queries, gains, block_size, attnres)
    torch.testing.assert_close(seen[0], expected, rtol=1e-5, atol=1e-6)  # the reference computes in float32


def test_at_init_each_term_reads_the_sources_mean_and_the_model_init_keeps_it():
    m = model("attnres")
    m.reset_parameters(seed=1)
    residual = m.blocks[1].residual
    assert residual.query.abs().max() == 0 and (residual.key_norm == 1).all()
    assert m.blocks[0].residual.query.numel() == D  # layer 0: its MLP term alone has weights
    sources = torch.randn(2, 3, 4, D, dtype=torch.float64)
    torch.testing.assert_close(residual.read(sources, 0), sources.mean(dim=2), rtol=1e-12, atol=1e-12)


def test_a_block_alone_returns_the_sum_of_its_sources():
    """Full AttnRes, one block: the attention reads the input, the MLP the mean of input and attention output
    (query 0); out: input + both outputs."""
    block = build_block({**BLOCK, "residual": "attnres"}).double()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    attn, mlp = block.placement.updates([block.attn, block.mlp])
    a = attn(x)
    torch.testing.assert_close(block(x), x + a + mlp((x + a) / 2), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("option", "value", "says"), [("block_size", 0, "must be >= 1"), ("eps", 0.0, "must be > 0")])
def test_bad_options_name_the_field(option, value, says):
    with pytest.raises(ConfigError) as error:
        build_block({**BLOCK, "residual": {"name": "attnres", option: value}})
    assert error.value.field == f"block.residual.{option}" and says in str(error.value)


def test_post_norm_beside_attnres_is_refused_by_name():
    assert "block.residual.name='attnres'" in check_combination({**BLOCK, "placement": "post", "residual": "attnres"})


@pytest.mark.parametrize("block_size", [1, 4])
def test_parameters_and_flops_are_counted(block_size):
    """A query and a key gain of d_model per term after the first; per term j > 0 over n_j = 1 + ceil(j / block_size)
    sources, forward: 4 n d (norm) + 2 n d (logits) + 2 n d (sum), 4 d of it as parameters (x 3 for backward)."""
    plain, m = model("add"), model({"name": "attnres", "block_size": block_size})
    counts = m.parameter_counts()
    assert counts["residual"] == (LAYERS * 2 - 1) * 2 * D  # none for the first term: the embedding alone
    sources = [1 + -(-j // block_size) for j in range(1, 2 * LAYERS)]
    extra = 3 * sum((8 * n - 4) * D for n in sources)
    assert m.flops_per_token(8) == plain.flops_per_token(8) + 6 * counts["residual"] + extra


def test_muon_gives_its_weights_adamw_and_mup_treats_them_as_vectors():
    from zoo.assembly import mup
    from zoo.lab.recipe.muon import treatments

    def build(width: int) -> LanguageModel:
        return LanguageModel(layer_specs({**BLOCK, "d_model": width, "residual": "attnres"}, 2, None, "x.layers"), 11)

    found = treatments(build(D))
    roles = {name: s.role for name, s in mup.infer(build, 32, 16).scalings.items()}
    for name in ("blocks.1.residual.query", "blocks.1.residual.key_norm"):
        assert found[name].kind == "adamw" and roles[name] == "vector", name
