"""block.residual: add (the default, old configs unchanged), scaled, hyper (hyper-connections, with mHC's
constraints) and mhc (the mHC paper's form; against transformers in test_families.py) against
their papers' equations written out by hand, their initial values, the stack's streams, refusals, the contract's
grid, and what optimizers, μP and the FLOP count make of them."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from zoo import ConfigError, build_block, check_combination
from zoo.assembly.combinations import choices, combinations, combo_id, default, paired_choices, product_names
from zoo.core.registry import AXES, MLPS, RESIDUALS
from zoo.models.config import layer_specs
from zoo.models.language import LanguageModel, build_model
from zoo.parts.residuals import Hyper, sinkhorn
from zoo.testing.contract import ROUNDING

D = 16
BLOCK = {"d_model": D, "n_heads": 4, "d_ff": 24, "placement": "pre", "norm": "rmsnorm", "attn": "mha", "pos": "none",
         "mlp": "gelu"}  # fmt: skip


def specs(block: dict, n_layers: int = 2) -> list:
    return layer_specs(block, n_layers, None, "model.layers")


def hyper(n_updates: int = 1, layer: int = 0, d: int = 3, **options) -> Hyper:
    from zoo.core.dims import BlockDims

    return Hyper(BlockDims(d_model=d, n_heads=1), n_updates, layer, **options).double()


def set_weights(module: Hyper, read, mix, write) -> None:
    with torch.no_grad():
        module.read.copy_(torch.tensor(read, dtype=torch.float64).flatten())
        module.mix.copy_(torch.tensor(mix, dtype=torch.float64).flatten())
        module.write.copy_(torch.tensor(write, dtype=torch.float64).flatten())


# -- the equations, by hand ---------------------------------------------------------------------------


def test_static_hyper_connection_follows_the_paper_by_hand():
    """Zhu et al. 2024, eq. (static): h = A_m^T H, H' = A_r^T H + B^T u(h), two streams of 3 features."""
    module = hyper(n_streams=2)
    set_weights(module, read=[0.25, 0.75], mix=[[0.5, 2.0], [1.0, -1.0]], write=[3.0, -0.5])
    H = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.0, 4.0]], dtype=torch.float64)[None, None]  # (1, 1, 2, 3)
    h = [0.25 * 1 + 0.75 * -1, 0.25 * 2 + 0.75 * 0, 0.25 * 3 + 0.75 * 4]  # [-0.5, 0.5, 3.75]
    u = [2 * v for v in h]  # the branch: u(h) = 2 h
    new0 = [0.5 * 1 + 1.0 * -1 + 3.0 * u[0], 0.5 * 2 + 1.0 * 0 + 3.0 * u[1], 0.5 * 3 + 1.0 * 4 + 3.0 * u[2]]
    new1 = [2.0 * 1 - 1.0 * -1 - 0.5 * u[0], 2.0 * 2 - 1.0 * 0 - 0.5 * u[1], 2.0 * 3 - 1.0 * 4 - 0.5 * u[2]]
    got = module.update(H, 0, lambda x: 2 * x)
    torch.testing.assert_close(got[0, 0], torch.tensor([new0, new1], dtype=torch.float64), rtol=0, atol=1e-15)


def test_dynamic_hyper_connection_follows_the_paper_by_hand():
    """Dynamic weights: each stream j adds s tanh(norm(H_j) W) to its read weight, its write weight and its
    row of the mixing matrix (s_alpha for read and mix, s_beta for write)."""
    module = hyper(n_streams=2, dynamic=True)
    set_weights(module, read=[1.0, 0.0], mix=[[1.0, 0.0], [0.0, 1.0]], write=[1.0, 1.0])
    torch.manual_seed(0)
    with torch.no_grad():
        module.dynamic_weight.normal_()
        module.alpha_scale.fill_(0.3)
        module.beta_scale.fill_(-0.2)
    H = torch.randn(1, 1, 2, 3, dtype=torch.float64)
    W = module.dynamic_weight[0].detach()  # (4, 3): read, write, mix row
    read, write, mix = [], [], []
    for j in range(2):
        stream = H[0, 0, j]
        normed = stream / torch.sqrt((stream**2).mean() + torch.finfo(torch.float64).eps)
        z = torch.tanh(W @ normed)
        read.append(float([1.0, 0.0][j] + 0.3 * z[0]))
        write.append(float(1.0 + -0.2 * z[1]))
        mix.append([float([[1.0, 0.0], [0.0, 1.0]][j][k] + 0.3 * z[2 + k]) for k in range(2)])
    h = read[0] * H[0, 0, 0] + read[1] * H[0, 0, 1]
    expected = torch.stack(
        [mix[0][k] * H[0, 0, 0] + mix[1][k] * H[0, 0, 1] + write[k] * torch.sin(h) for k in range(2)]
    )
    torch.testing.assert_close(module.update(H, 0, torch.sin)[0, 0], expected, rtol=0, atol=1e-12)


def reference_sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """x-transformers' sinkhorn (HyperConnection, hyper_conn_sinkhorn_iters): a softmax over rows' entries of each
    column, then alternately each row and each column divided by its sum."""
    m = logits.softmax(dim=-2)
    for _ in range(iters):
        m = F.normalize(m, p=1, dim=-1)
        m = F.normalize(m, p=1, dim=-2)
    return m


def test_sinkhorn_reaches_the_doubly_stochastic_scaling_the_reference_reaches():
    """Both scale exp(logits) to the one doubly stochastic matrix D1 exp(L) D2 (Sinkhorn's theorem)."""
    torch.manual_seed(1)
    logits = torch.randn(5, 4, 4, dtype=torch.float64) * 2
    ours, theirs = sinkhorn(logits, 200), reference_sinkhorn(logits, 200)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)
    for dim in (-1, -2):
        torch.testing.assert_close(ours.sum(dim), torch.ones(5, 4, dtype=torch.float64), rtol=0, atol=1e-8)
    ratio = ours / torch.exp(logits)  # D1 exp(L) D2: the ratio has rank one per matrix
    assert torch.linalg.matrix_rank(ratio).eq(1).all()


def test_mhc_constrains_read_write_and_mix_as_the_paper():
    """mHC: read = sigmoid(logits), write = 2 sigmoid(logits), mix = Sinkhorn(exp(logits)) of 20 iterations."""
    module = hyper(n_streams=3, sinkhorn_iters=20)
    read, mix, write = [0.5, -1.0, 2.0], [[1.0, 0.2, -0.3], [0.0, 2.0, 0.1], [0.4, -0.5, 0.9]], [0.0, 1.0, -2.0]
    set_weights(module, read, mix, write)
    H = torch.randn(2, 3, 3, 3, dtype=torch.float64)
    got_read, got_mix, got_write = module.weights(H, 0)
    as_tensor = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    torch.testing.assert_close(got_read, torch.sigmoid(as_tensor(read)), rtol=0, atol=0)
    torch.testing.assert_close(got_write, 2 * torch.sigmoid(as_tensor(write)), rtol=0, atol=0)
    torch.testing.assert_close(got_mix, sinkhorn(as_tensor(mix), 20), rtol=0, atol=0)
    assert (got_mix.sum(-1) - 1).abs().max() < 1e-4 and (got_mix.sum(-2) - 1).abs().max() < 1e-12


# -- initial values -----------------------------------------------------------------------------------


def test_hyper_starts_at_the_papers_values_and_the_model_init_keeps_them():
    """read = e_(i mod n) for the i-th term over the stack, mix = I, write = 1; init_stack draws none of them,
    and the dynamic weights start at 0 with scales 0.01."""
    torch.manual_seed(0)
    model = build_model({"block": {**BLOCK, "residual": {"name": "hyper", "n_streams": 3, "dynamic": True}},
                         "model": {"vocab_size": 11, "n_layers": 2}})  # fmt: skip
    for layer, block in enumerate(model.blocks):
        r = block.residual
        reads = r.read.view(2, 3)
        for i in range(2):
            assert reads[i].tolist() == F.one_hot(torch.tensor((2 * layer + i) % 3), 3).float().tolist()
        assert torch.equal(r.mix.view(2, 3, 3), torch.eye(3).expand(2, 3, 3))
        assert r.write.eq(1).all() and r.dynamic_weight.eq(0).all() and r.alpha_scale.eq(0.01).all()
    with torch.no_grad():
        model.blocks[0].residual.mix.add_(1.0)
    model.reset_parameters()
    assert torch.equal(model.blocks[0].residual.mix.view(2, 3, 3), torch.eye(3).expand(2, 3, 3))


@pytest.mark.parametrize("residual", ["scaled", "hyper", {"name": "hyper", "dynamic": True}])
@pytest.mark.parametrize("placement", ["pre", "sandwich", "reordered", "parallel"])
def test_at_init_a_model_equals_add(residual, placement):
    """scaled: the logits to the bit. hyper: every stream equals add's stream, so the final norm reads n times
    add's stream (the logits then differ only by the norm's eps, large beside init's small stream)."""
    block = {**BLOCK, "placement": placement, "pos": "learned", "max_len": 8}
    models, streams = [], []
    for choice in ("add", residual):
        torch.manual_seed(3)
        model = LanguageModel(specs({**block, "residual": choice}), 13).double()
        model.final_norm.register_forward_pre_hook(lambda m, args: streams.append(args[0]))
        models.append(model)
    ids = torch.randint(0, 13, (2, 8), generator=torch.Generator().manual_seed(0))
    plain, other = (m(ids) for m in models)
    if residual == "scaled":
        torch.testing.assert_close(other, plain, rtol=0, atol=0)
    else:
        torch.testing.assert_close(streams[1], 4 * streams[0], rtol=1e-12, atol=1e-14)


def test_mhc_at_init_keeps_equal_streams_equal():
    """What holds for mHC at init: the mixing matrix is doubly stochastic, so streams that are equal stay equal
    (each is x + u(c x) with c = the sum of the sigmoid read weights)."""
    block = build_block({**BLOCK, "residual": {"name": "hyper", "sinkhorn_iters": 20}}).double()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    streams = block(x[:, :, None].expand(2, 5, 4, D).contiguous())
    for k in range(1, 4):
        torch.testing.assert_close(streams[:, :, k], streams[:, :, 0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("placement", ["parallel", "pre"])
def test_a_doubly_stochastic_mix_learns_only_from_streams_that_differ(placement):
    """hyper with sinkhorn_iters: on equal streams (a lone block's input expanded, a model's embedding) ``mix^T H`` is
    H whatever the logits, as every column sums to 1, and a lone block's last term is read only through the streams'
    sum, which rows summing to 1 keep: the mix's gradient is rounding (the contract's declared exception, its floor
    :data:`zoo.testing.contract.ROUNDING`). On streams that differ it gets one like every other weight."""
    torch.manual_seed(0)
    block = build_block({**BLOCK, "placement": placement, "residual": {"name": "hyper", "sinkhorn_iters": 20}})
    block = block.double()
    with torch.no_grad():
        block.residual.mix.normal_()  # a mix away from its initial identity
    x = torch.randn(2, 5, D, dtype=torch.float64)
    equal = x[:, :, None].expand(2, 5, 4, D).contiguous()  # (b, t, n, d): returned whole, not summed
    for streams, reaches in ((x, False), (equal, False), (torch.randn(2, 5, 4, D, dtype=torch.float64), True)):
        block.zero_grad(set_to_none=True)
        out = block(streams)
        (out * torch.randn_like(out)).sum().backward()
        mix, write = block.residual.mix.grad.abs().max(), block.residual.write.grad.abs().max()
        assert (mix > 1e-3 * write) if reaches else (mix < ROUNDING * write), (tuple(streams.shape), mix, write)


def test_mhc_starts_reading_the_streams_mean_writing_once_and_mixing_uniformly_and_the_model_init_keeps_it():
    """projection 0, scales 1, read 1/n, write 1, mix the uniform doubly stochastic matrix (each entry (1 - eps) / n
    once Sinkhorn settles); init_stack draws none of them."""
    torch.manual_seed(0)
    model = build_model({"block": {**BLOCK, "residual": {"name": "mhc", "n_streams": 3}},
                         "model": {"vocab_size": 11, "n_layers": 2}})  # fmt: skip
    for block in model.blocks:
        r = block.residual.double()
        assert r.projection.eq(0).all() and r.scale.eq(1).all()
        read, mix, write = r.weights(torch.randn(2, 5, 3, D, dtype=torch.float64), 1)
        torch.testing.assert_close(read, torch.full_like(read, 1 / 3), rtol=0, atol=1e-7)  # base stored in float32
        torch.testing.assert_close(write, torch.ones_like(write), rtol=0, atol=0)
        torch.testing.assert_close(mix, torch.full_like(mix, (1 - 1e-6) / 3), rtol=0, atol=1e-12)


@pytest.mark.parametrize("placement", ["pre", "sandwich", "parallel"])
def test_mhc_at_init_keeps_every_stream_at_adds_up_to_its_eps(placement):
    """Every stream equals add's stream but for the eps terms (the columns of mix sum to 1 - eps, a relative 1e-6 per
    layer), so the final norm reads n times add's stream within 1e-5 of its largest value."""
    block = {**BLOCK, "placement": placement}
    torch.manual_seed(3)
    plain = LanguageModel(specs(block), 13).double()
    torch.manual_seed(3)
    model = LanguageModel(specs({**block, "residual": "mhc"}), 13).double()
    model.load_state_dict(plain.state_dict(), strict=False)
    streams = []
    for m in (plain, model):
        m.final_norm.register_forward_pre_hook(lambda m, args: streams.append(args[0]))
    ids = torch.randint(0, 13, (2, 8), generator=torch.Generator().manual_seed(0))
    plain(ids), model(ids)
    worst = (streams[1] - 4 * streams[0]).abs().max() / (4 * streams[0]).abs().max()
    assert 0 < worst < 1e-5, worst


@pytest.mark.parametrize(("option", "value"), [("n_streams", 0), ("sinkhorn_iters", 0), ("eps", 0.0),
                                               ("norm_eps", -1.0)])  # fmt: skip
def test_bad_mhc_options_name_the_field(option, value):
    with pytest.raises(ConfigError) as error:
        build_block({**BLOCK, "residual": {"name": "mhc", option: value}})
    assert error.value.field == f"block.residual.{option}"



@pytest.mark.parametrize(("name", "option", "value", "says"), [
    ("hyper", "n_streams", 0, "must be >= 1"), ("hyper", "sinkhorn_iters", -1, "must be >= 0"),
    ("mhc", "sinkhorn_iters", 0, "must be >= 1"),
])  # fmt: skip
def test_multi_stream_residuals_refuse_too_few_streams_or_iterations_each_at_its_bound(name, option, value, says):
    """hyper takes 0 Sinkhorn iterations (plain hyper-connections), mhc at least 1 (its softmax is the first)."""
    with pytest.raises(ConfigError) as error:
        build_block({**BLOCK, "residual": {"name": name, option: value}})
    assert error.value.field == f"block.residual.{option}" and says in str(error.value)
    build_block({**BLOCK, "residual": {"name": name, "sinkhorn_iters": 1 - ("hyper" == name)}})  # the bound builds

# -- the stack, configs, refusals ---------------------------------------------------------------------


def test_the_stack_expands_the_embedding_into_the_streams_and_sums_them_before_the_final_norm():
    torch.manual_seed(0)
    model = LanguageModel(specs({**BLOCK, "residual": "hyper"}), 11).double()
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    model.final_norm.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    ids = torch.randint(0, 11, (2, 5))
    model(ids)
    embedded = model.embed(ids)
    assert seen[0].shape == (2, 5, 4, D) and all(torch.equal(seen[0][:, :, k], embedded) for k in range(4))
    streams = model.blocks[1](model.blocks[0](seen[0]))
    torch.testing.assert_close(seen[1], streams.sum(dim=2), rtol=0, atol=0)


def test_scaled_blocks_get_the_embedding_output_after_positions():
    torch.manual_seed(0)
    model = LanguageModel(specs({**BLOCK, "residual": "scaled", "pos": "learned", "max_len": 8}), 11)
    seen = []
    model.blocks[1].register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs["x0"]), with_kwargs=True)
    ids = torch.randint(0, 11, (2, 5))
    model(ids)
    torch.testing.assert_close(seen[0], model.pos_embed(model.embed(ids), torch.arange(5)), rtol=0, atol=0)


def test_scaled_reinjects_the_embedding_output_not_the_blocks_own_input():
    """With every branch silenced, layer l maps its input x to r_l x + a_l e (e: the embedding output), so two
    layers give (r_1 (r_0 + a_0) + a_1) e before the final norm. Re-injecting the block's own input instead
    would give (r_1 + a_1)(r_0 + a_0) e: a lone block cannot tell them apart, two layers can."""
    torch.manual_seed(0)
    model = LanguageModel(specs({**BLOCK, "residual": "scaled", "bias": False}), 11).double()
    (r0, a0), (r1, a1) = (0.5, 0.75), (2.0, -1.5)
    with torch.no_grad():
        for block, (r, a) in zip(model.blocks, ((r0, a0), (r1, a1)), strict=True):
            block.attn.out.weight.zero_()
            block.mlp.down.weight.zero_()
            block.residual.resid_lambda.fill_(r)
            block.residual.x0_lambda.fill_(a)
    seen = []
    model.final_norm.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    ids = torch.randint(0, 11, (2, 5))
    model(ids)
    expected = (r1 * (r0 + a0) + a1) * model.embed(ids)  # 1.0 e, where the block's own input would give 0.625 e
    torch.testing.assert_close(seen[0], expected, rtol=0, atol=1e-15)


def test_every_layer_of_a_stack_keeps_as_many_streams():
    cfg = {"block": {**BLOCK, "residual": "hyper"}, "model": {"vocab_size": 11, "n_layers": 2,
           "layers": {1: {"residual": "scaled"}}}}  # fmt: skip
    with pytest.raises(ConfigError) as error:
        build_model(cfg)
    assert error.value.field == "model.layers.1.residual" and "residual stream" in str(error.value)
    cfg["model"]["layers"] = {1: {"residual": {"name": "hyper", "dynamic": True}}}  # the same 4 streams
    build_model(cfg)


def test_post_norm_beside_hyper_is_refused_by_name_before_any_tensor_work():
    reason = check_combination({**BLOCK, "placement": "post", "residual": "hyper"})
    assert "block.residual.name='hyper'" in reason and "use placement=pre|sandwich|reordered|parallel" in reason
    assert "residual=add|scaled with placement=post" in reason
    assert check_combination({**BLOCK, "placement": "post", "residual": "scaled"}) is None


@pytest.mark.parametrize(("option", "value"), [("n_streams", 0), ("sinkhorn_iters", -1), ("dynamic", "yes")])
def test_bad_hyper_options_name_the_field(option, value):
    with pytest.raises(ConfigError) as error:
        build_block({**BLOCK, "residual": {"name": "hyper", option: value}})
    assert error.value.field == f"block.residual.{option}"


def test_a_config_without_the_axis_builds_add_and_keeps_its_hash():
    """Block configs from before the axis have no residual; the default config's hash does not name it."""
    from helpers import tiny

    from zoo.lab.records.config import config_hash, semantic_config

    torch.manual_seed(0)
    old = build_block(BLOCK)
    torch.manual_seed(0)
    new = build_block({**BLOCK, "residual": "add"})
    assert old.state_dict().keys() == new.state_dict().keys()
    x = torch.randn(2, 5, D)
    torch.testing.assert_close(old(x), new(x), rtol=0, atol=0)
    recorded = {(): "0a7575235f9168ae", ("attn=gqa",): "0a03979dc78d43b5"}  # computed before the axis
    for overrides, digest in recorded.items():
        config = tiny(*overrides)
        assert config["block"]["residual"] == {"name": "add"} and "residual" not in semantic_config(config)["block"]
        assert config_hash(config) == config_hash(tiny(*overrides, "residual=add")) == digest
    changed = {config_hash(tiny("residual=scaled")), config_hash(tiny("residual=hyper")),
               config_hash(tiny("residual=hyper", "block.residual.sinkhorn_iters=20"))}  # fmt: skip
    assert len(changed | {recorded[()]}) == 4


# -- the contract's grid ------------------------------------------------------------------------------


def test_the_residual_pairs_with_every_choice_instead_of_multiplying_the_product():
    assert RESIDUALS.paired and default("residual") == "add"
    combos = combinations()
    product = [a for a in AXES if not AXES[a].paired]
    plain = [c for c in combos if c["residual"] == "add"]
    expected = {tuple(names) for names in itertools.product(*(product_names(a) for a in product))}
    assert expected <= {tuple(c[a] for a in product) for c in plain}
    assert len(combos) < 1.2 * len(plain)  # the axis adds pairs (7 labels), not a factor of 5
    base = {axis: AXES[axis].names()[0] for axis in product} | {"residual": "add"}
    for label in paired_choices("residual"):
        wanted = [{**base, "residual": label}] + [
            {**base, "residual": label, other: choice} for other in product for choice in choices(other)
        ]
        got = {combo_id(c) for c in combos if c["residual"] == label}
        assert got == {combo_id(c) for c in wanted}, label
    assert set(paired_choices("residual")) == {"scaled", "hyper", "mhc", "attnres", "hyper+sinkhorn", "hyper+dynamic",
                                               "attnres+block"}
    assert combo_id({**base}) == "-".join(base[a] for a in product)  # add leaves ids as they were
    assert combo_id({**base, "residual": "hyper"}).endswith("-hyper")


# -- optimizers, μP, counts and FLOPs -----------------------------------------------------------------


def test_a_paired_part_meets_every_choice_of_every_other_axis_outside_the_product():
    """clamped_swiglu (registered paired): it is in no product row, and it meets every choice of every other axis."""
    assert MLPS.get("clamped_swiglu").paired and "clamped_swiglu" not in product_names("mlp")
    assert "clamped_swiglu" in paired_choices("mlp")
    combos = [c for c in combinations() if c["mlp"] == "clamped_swiglu"]
    for other in AXES:
        if other != "mlp":
            assert set(choices(other)) <= {c[other] for c in combos}, other
    assert len(combos) < 2 * sum(len(choices(a)) for a in AXES)  # pairs, not a product


def hyper_model(**options) -> LanguageModel:
    torch.manual_seed(0)
    return LanguageModel(specs({**BLOCK, "residual": {"name": "hyper", **options}}), 11)


def test_muon_gives_the_residual_weights_adamw_and_mup_treats_them_as_fixed_or_output():
    from zoo.assembly import mup
    from zoo.lab.recipe.muon import treatments

    model = hyper_model(dynamic=True)
    found = treatments(model)
    for name in ("read", "mix", "write", "alpha_scale", "dynamic_weight"):
        assert found[f"blocks.0.residual.{name}"].kind == "adamw", name
    assert found["blocks.0.attn.out.weight"].kind != "adamw"

    def build(width: int) -> LanguageModel:
        return LanguageModel(specs({**BLOCK, "d_model": width, "residual": {"name": "hyper",
                                          "dynamic": True}}), 11)  # fmt: skip

    roles = {name: s.role for name, s in mup.infer(build, 32, 16).scalings.items()}
    assert roles["blocks.0.residual.mix"] == roles["blocks.0.residual.read"] == "fixed"
    assert roles["blocks.0.residual.dynamic_weight"] == "output"  # d_model in, n + 2 out

    mhc = LanguageModel(specs({**BLOCK, "residual": "mhc"}), 11)
    found = treatments(mhc)
    assert {found[f"blocks.0.residual.{name}"].kind for name in ("projection", "base", "scale")} == {"adamw"}

    def build_mhc(width: int) -> LanguageModel:
        return LanguageModel(specs({**BLOCK, "d_model": width, "residual": "mhc"}), 11)

    roles = {name: s.role for name, s in mup.infer(build_mhc, 32, 16).scalings.items()}
    assert roles["blocks.0.residual.base"] == roles["blocks.0.residual.scale"] == "fixed"
    assert roles["blocks.0.residual.projection"] == "output"  # n d_model in, 2 n + n^2 out


def test_parameter_counts_name_the_residual_only_when_it_has_parameters():
    torch.manual_seed(0)
    plain = LanguageModel(specs(BLOCK), 11)
    assert "residual" not in plain.parameter_counts()
    counts = hyper_model().parameter_counts()
    assert counts["residual"] == 2 * 2 * (4 + 16 + 4)  # 2 layers x 2 terms x (read, mix, write)
    assert counts["total"] == plain.parameter_counts()["total"] + counts["residual"]


@pytest.mark.parametrize(("options", "extra"), [({}, 0), ({"dynamic": True, "sinkhorn_iters": 20}, 1)])
def test_flops_per_token_count_the_stream_mixing(options, extra):
    torch.manual_seed(0)
    plain = LanguageModel(specs(BLOCK), 11)
    model = hyper_model(**options)
    n, terms = 4, 4  # 2 layers x 2 terms
    residual_params = model.parameter_counts()["residual"]
    mixing = 3 * terms * (2 * n * n * D + 4 * n * D)
    if extra:
        mixing += 3 * terms * (2 * (n - 1) * (n + 2) * D + 4 * n * n * 20)
    assert model.flops_per_token(8) == plain.flops_per_token(8) + 6 * residual_params + mixing
    scaled = LanguageModel(specs({**BLOCK, "residual": "scaled"}), 11)
    assert scaled.flops_per_token(8) == plain.flops_per_token(8) + 6 * 4 + 2 * 9 * D


def test_mhc_counts_its_parameters_and_flops():
    """Per term: a projection of n d_model features to 2 n + n^2, as many biases, 3 scales (parameters, 6 FLOPs
    each); the norm, read, mix, write and Sinkhorn beyond them (x 3)."""
    torch.manual_seed(0)
    plain = LanguageModel(specs(BLOCK), 11)
    model = LanguageModel(specs({**BLOCK, "residual": {"name": "mhc", "n_streams": 3, "sinkhorn_iters": 5}}), 11)
    n, terms, logits = 3, 4, 2 * 3 + 9
    counts = model.parameter_counts()
    assert counts["residual"] == terms * (logits * n * D + logits + 3)
    mixing = 3 * terms * (2 * n * n * D + 7 * n * D + 4 * n * n * 5)
    assert model.flops_per_token(8) == plain.flops_per_token(8) + 6 * counts["residual"] + mixing


@pytest.mark.parametrize("residual", ["scaled", "hyper", "mhc", "attnres"])
def test_export_to_transformers_refuses_a_residual_other_than_add(residual):
    from zoo.models.hf import family_for

    llama = {**BLOCK, "attn": "gqa", "pos": "rotary", "mlp": "swiglu", "bias": False}
    assert family_for(LanguageModel(specs(llama), 11)).hf_class == "LlamaForCausalLM"
    with pytest.raises(ConfigError) as error:
        family_for(LanguageModel(specs({**llama, "residual": residual}), 11))
    assert error.value.field == "block.residual" and error.value.value == residual
