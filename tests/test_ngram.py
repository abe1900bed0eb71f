"""model.ngram: hashed bigram and trigram tables added before each layer (modded-nanogpt's bigram hash embedding),
against the hash and the sum by hand, decoding from the last n - 1 ids, parameters and FLOPs counted apart,
refused by name where it cannot serve."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny

from zoo import ConfigError, build_model, build_seq2seq
from zoo.assembly import mup
from zoo.models.ngram import MULTIPLIERS, ngram_rows

BLOCK = {"d_model": 16, "n_heads": 4, "placement": "pre", "norm": "rmsnorm", "attn": "gqa", "pos": "rotary",
         "mlp": "swiglu"}  # fmt: skip
VOCAB = 11


def model(ngram: int | None = 2, n_layers: int = 2, **options):
    torch.manual_seed(0)
    built = build_model({"block": BLOCK, "model": {"n_layers": n_layers, "vocab_size": VOCAB, "ngram": ngram,
                                                   **options}}).double().eval()  # fmt: skip
    if built.ngram is not None:
        with torch.no_grad():  # rows and scales away from their zeros and 0.1, so a wrong row shows
            built.ngram.table.weight.normal_(0, 1)
            built.ngram.scales.copy_(torch.arange(1.0, n_layers + 1))
    return built


def hashed(seq: list[int], order: int, rows: int) -> list[int]:
    """modded-nanogpt's get_bigram_hash for one sequence, written out (a third term for trigrams): the reserved
    row rows - 1 where fewer than order - 1 tokens precede."""
    out = []
    for t in range(len(seq)):
        if t < order - 1:
            out.append(rows - 1)
            continue
        h = 0
        for k in range(order):
            h ^= MULTIPLIERS[k] * seq[t - k]
        out.append(h % (rows - 1))
    return out


@pytest.mark.parametrize("order", [2, 3])
def test_the_hash_is_modded_nanogpts_on_the_last_n_ids(order):
    seq, rows = [3, 7, 7, 0, 10, 2, 5], 23
    marked = torch.tensor([[0] * (order - 1) + [s + 1 for s in seq]])
    assert ngram_rows(marked, order, rows)[0].tolist() == hashed(seq, order, rows)
    if order == 2:  # position 1: (36313 x 7) XOR (27191 x 3) mod 22, the record's formula
        assert ngram_rows(marked, 2, rows)[0, 1].item() == ((36313 * 7) ^ (27191 * 3)) % 22


def test_the_logits_are_a_model_without_ngrams_with_each_layers_rows_added_by_hand():
    """Layer i's input is the stream plus s_i T[h_t], h by the hash above: the blocks of the same weights, run
    by hand, give the same logits."""
    ids = torch.tensor([[1, 4, 4, 9, 0, 2], [10, 3, 5, 5, 5, 1]])
    built = model(3)
    table, scales, rows = built.ngram.table.weight, built.ngram.scales, built.ngram.rows
    added = torch.stack([table[hashed(seq, 3, rows)] for seq in ids.tolist()])
    x = built.embed(ids)
    for i, block in enumerate(built.blocks):
        x = block(x + scales[i] * added)
    expected = built.logits(built.final_norm(x))
    torch.testing.assert_close(built(ids), expected, rtol=0, atol=1e-12)
    plain = model(None)
    plain.load_state_dict({k: v for k, v in built.state_dict().items() if not k.startswith("ngram.")})
    with torch.no_grad():
        built.ngram.scales.zero_()
    torch.testing.assert_close(built(ids), plain(ids), rtol=0, atol=1e-12)


def test_a_position_reads_no_later_token():
    built = model(3)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[:, 5] = (ids[:, 5] + 1) % VOCAB
    torch.testing.assert_close(built(ids)[:, :5], built(changed)[:, :5], rtol=0, atol=0)


@pytest.mark.parametrize("order", [2, 3])
def test_cached_decoding_in_chunks_equals_the_full_forward(order):
    built = model(order)
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    caches = built.new_caches(7)
    steps = [built(ids[:, :3], caches=caches)] + [built(ids[:, t : t + 1], caches=caches) for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), built(ids), rtol=0, atol=1e-10)
    assert caches[0].canon["ngram"].tolist() == (ids[:, 7 - (order - 1) :] + 1).tolist()
    assert built.ngram.state_size() == order - 1


def test_a_token_after_padding_hashes_as_the_first_of_its_sequence():
    built = model(3)
    ids = torch.tensor([[1, 4, 4, 9]])
    padded = torch.tensor([[7, 8, 1, 4, 4, 9]])
    mask = torch.tensor([[False, False, True, True, True, True]])
    alone = built.generate(ids, 3)
    assert torch.equal(built.generate(padded, 3, key_mask=mask), alone)
    real = built.ngram(padded, mask)[:, 2:]
    torch.testing.assert_close(real, built.ngram(ids), rtol=0, atol=0)


def test_parameters_are_counted_apart_and_flops_count_a_scale_and_sum_per_layer():
    d, layers, seq = BLOCK["d_model"], 2, 32
    base, bigram = model(None), model(2)
    counts = bigram.parameter_counts()
    assert counts["ngram"] == 5 * VOCAB * d + layers and "ngram" not in base.parameter_counts()
    assert counts["total"] - counts["ngram"] == base.parameter_counts()["total"]
    assert bigram.flops_per_token(seq) - base.flops_per_token(seq) == 6 * layers * d
    assert model(2, ngram_table=64).parameter_counts()["ngram"] == 64 * d + layers


def test_the_table_starts_at_zeros_and_each_scale_at_ngram_scale():
    torch.manual_seed(0)
    built = build_model({"block": BLOCK, "model": {"n_layers": 3, "vocab_size": VOCAB, "ngram": 2, "ngram_scale": 0.3}})
    assert not built.ngram.table.weight.any() and torch.equal(built.ngram.scales.data, torch.full((3,), 0.3))
    built.reset_parameters(seed=1)
    assert not built.ngram.table.weight.any()


def test_mup_scales_the_table_as_the_token_embedding_and_leaves_the_scales_fixed():
    def build(width: int):
        return build_model({"block": {**BLOCK, "d_model": width}, "model": {"n_layers": 2, "vocab_size": VOCAB,
                                                                            "ngram": 2}})  # fmt: skip

    found = mup.infer(build, 32, 16)
    assert found.scalings["ngram.table.weight"] == found.scalings["embed.weight"]
    assert found.scalings["ngram.table.weight"].role == "input" and found.scalings["ngram.scales"].role == "fixed"


@pytest.mark.parametrize(
    ("key", "value"),
    [("ngram", 4), ("ngram", 1), ("ngram", True), ("ngram_table", -5), ("ngram_table", 1), ("ngram_scale", 0)],
)
def test_a_bad_value_is_refused_by_name(key, value):
    with pytest.raises(ConfigError, match=f"model.{key}="):
        build_model({"block": BLOCK, "model": {"ngram": 2, key: value}})


def test_several_residual_streams_tensor_parallelism_and_an_export_refuse_it_by_name():
    from zoo.lab.planning.plan import plan_run
    from zoo.models.hf import family_for

    with pytest.raises(ConfigError, match="model.ngram=2: null with block.residual=hyper"):
        build_model({"block": {**BLOCK, "residual": "hyper"}, "model": {"ngram": 2}})
    with pytest.raises(ConfigError, match="model.ngram=2: null under parallel.tp=2"):
        plan_run(tiny("model.ngram=2", "parallel.tp=2"), {}, world=2)
    with pytest.raises(ConfigError, match="model.ngram=2: .*needs model.ngram=None"):
        family_for(model(2))
    with pytest.raises(ConfigError, match="model.ngram=2: null in an encoder-decoder"):
        build_seq2seq({"block": BLOCK, "model": {"ngram": 2}})


def test_a_model_with_it_cannot_rewind_its_decoding_state():
    built, caches = model(2), None
    caches = built.new_caches(8)
    built(torch.tensor([[1, 2, 3]]), caches=caches)
    with pytest.raises(ConfigError, match="length=2: must be 3"):
        caches[0].truncate(2)


def test_the_defaults_stay_out_of_the_config_hash():
    from zoo.lab.records.config import config_hash

    plain = config_hash(tiny())
    assert config_hash(tiny("model.ngram=null", "model.ngram_table=null", "model.ngram_scale=0.1")) == plain
    assert config_hash(tiny("block.out_conv=none")) == plain
    assert len({plain, config_hash(tiny("model.ngram=2")), config_hash(tiny("model.ngram=3"))}) == 3
