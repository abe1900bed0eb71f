"""Document masking and packing (task.doc_mask, task.packing; zoo/parts/documents.py, zoo/lab/data/packing.py): no
token reads another document, in every mixer and canon site, chunked forms cut at chunk edges too; the ids' derived
positions and masks; the refusals; the packers' rules."""

from __future__ import annotations

import pytest
import torch

from zoo import ConfigError, build_block
from zoo.lab.data.packing import best_fit, bos_aligned, check_packing, document_ids, split_documents
from zoo.lab.records.config import config_hash
from zoo.lab.tasks.base import build_task
from zoo.parts.canon import Canon
from zoo.parts.documents import Documents
from zoo.parts.linear_attention import LinearAttention
from zoo.testing.combos import VOCAB, block_config, make_model, randomize

BASE = {"placement": "pre", "norm": "rmsnorm", "pos": "rotary", "mlp": "swiglu"}
#: Every mixer, its chunked forms at chunks of 2 (so a document boundary falls inside and at a chunk's edge).
MIXERS = {
    "mha": {}, "mha+window": {}, "gqa": {"backend": "math"}, "mla": {}, "linear": {"chunk": 2},
    "linear+gated": {"chunk": 2}, "linear+retnet": {"backend": "math"}, "gated_deltanet": {"chunk": 2},
    "gated_deltanet+negeig": {"backend": "math"}, "kda": {"chunk": 2}, "kda+grouped": {"backend": "math"},
    "mamba2": {"chunk": 2}, "mamba2+groups": {"backend": "math"},
}  # fmt: skip
IDS = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [0, 1, 1, 1, 1, 1, 2, 2]])


def test_positions_starts_and_taps_follow_the_ids():
    docs = Documents(IDS)
    slots = torch.arange(8)
    assert docs.positions(slots)[0].tolist() == [0, 1, 2, 0, 1, 0, 1, 2]
    assert docs.fresh(slots)[1].tolist() == [False, True, False, False, False, False, True, False]
    taps = docs.taps(torch.tensor([3, 4]), 4)[0]  # tokens 3 and 4 (document 1): taps 3, 2, 1, 0 tokens back
    assert taps.tolist() == [[False, False, False, True], [False, False, True, True]]
    same = docs.same(torch.tensor([6]), 8)[1, 0, 0]
    assert same.tolist() == [False] * 6 + [True, True]


@pytest.mark.parametrize("attn", list(MIXERS))
def test_a_token_never_reads_another_document(attn):
    """Perturb the earlier documents: the outputs of every later document stay put (every canon site on), and
    perturbing a document does move its own outputs; cached decoding across the boundaries equals the full pass."""
    name = attn.partition("+")[0]
    cfg = block_config({**BASE, "attn": attn}, canon="acd" if name in ("mla", "mamba2") else "abcd")  # no site b
    cfg["attn"] = {**cfg["attn"], **MIXERS[attn]}
    block = build_block(cfg, context="model").double().eval()
    randomize(block)
    with torch.no_grad():
        for m in block.modules():
            if isinstance(m, Canon):
                m.kernel.normal_(0, 1)
    x, docs = torch.randn(2, 8, 16, dtype=torch.float64), Documents(IDS)
    y = block(x, documents=docs)
    for row, first_later in ((0, 3), (1, 1)):  # perturb everything before a document's start
        changed = x.clone()
        changed[row, :first_later] += torch.randn(first_later, 16, dtype=x.dtype)
        moved = block(changed, documents=docs)
        torch.testing.assert_close(moved[row, first_later:], y[row, first_later:], rtol=0, atol=1e-12)
        assert not torch.allclose(moved[row, :first_later], y[row, :first_later]), f"{name}: own document unmoved"
    from zoo import LayerState

    cache, steps = LayerState(), []
    for start, end in ((0, 4), (4, 5), (5, 8)):
        steps.append(block(x[:, start:end], cache=cache, documents=Documents(IDS[:, :end])))
    torch.testing.assert_close(torch.cat(steps, dim=1), y, rtol=0, atol=1e-10)


def test_a_mixer_stating_no_reset_is_refused_by_name(monkeypatch):
    model = make_model({**BASE, "attn": "linear"})
    monkeypatch.setattr(LinearAttention, "doc_reset", None)
    with pytest.raises(ConfigError, match="task.doc_mask") as error:
        model(torch.randint(0, VOCAB, (1, 4)), doc_ids=torch.zeros(1, 4, dtype=torch.long))
    assert "LinearAttention" in str(error.value)


def test_mtp_and_wrong_spans_are_refused():
    from zoo.models.language import build_model

    model = build_model({"block": block_config({**BASE, "attn": "mha"}), "model": {"vocab_size": VOCAB},
                         "objective": {"name": "mtp"}})  # fmt: skip
    with pytest.raises(ConfigError, match="task.doc_mask"):
        model(torch.randint(0, VOCAB, (1, 4)), doc_ids=torch.zeros(1, 4, dtype=torch.long))
    plain = make_model({**BASE, "attn": "mha"})
    with pytest.raises(ValueError, match="doc_ids must be"):
        plain(torch.randint(0, VOCAB, (1, 4)), doc_ids=torch.zeros(1, 3, dtype=torch.long))


# --- packing ---------------------------------------------------------------------------------------------------
BOS = 0


def corpus(seed: int = 0, n: int = 40) -> list[torch.Tensor]:
    """Documents of 1..30 tokens, each a BOS then its own id repeated (so a window's pieces name their document)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 30, (n,), generator=g).tolist()
    return [torch.tensor([BOS] + [i + 1] * (m - 1)) for i, m in enumerate(lengths)]


@pytest.mark.parametrize("pack", [bos_aligned, best_fit])
def test_packers_fill_windows_with_whole_document_prefixes(pack):
    """Every window is full, starts with a BOS, and is made of pieces that each begin at a document's BOS and run
    on in order (a prefix of that document: cropped, never continued from another window); deterministic by
    seed, different by seed; the ids the model gets count BOS tokens."""
    docs = corpus()
    windows = pack(docs, 20, 16, torch.Generator().manual_seed(1))
    assert windows.shape == (16, 20) and (windows[:, 0] == BOS).all()
    for row in windows:
        for piece in split_documents(row, BOS):
            doc = docs[int(piece[1]) - 1] if len(piece) > 1 else None
            if doc is not None:
                assert torch.equal(piece, doc[: len(piece)]), "a piece is not its document's start"
    again = pack(docs, 20, 16, torch.Generator().manual_seed(1))
    assert torch.equal(windows, again)
    assert not torch.equal(windows, pack(docs, 20, 16, torch.Generator().manual_seed(2)))
    assert document_ids(windows, BOS)[0, 0] == 1


def test_best_fit_puts_short_documents_whole_and_crops_only_the_last():
    docs = corpus()
    for row in best_fit(docs, 40, 32, torch.Generator().manual_seed(3)):
        pieces = split_documents(row, BOS)
        for piece in pieces[:-1]:  # every piece but the last is a whole document
            assert len(piece) == 1 or len(piece) == len(docs[int(piece[1]) - 1])


def test_best_fit_takes_the_longest_document_that_fits():
    """Documents of 7 and 3 tokens into windows of 10: the longest that fits first (a 7, then a 3) fills every
    window with whole documents; taking any other first (a 3) would leave a window to crop."""
    docs = [torch.tensor([BOS] + [i + 1] * (6 if i % 2 else 2)) for i in range(40)]
    for row in best_fit(docs, 10, 32, torch.Generator().manual_seed(0)):
        assert [len(piece) for piece in split_documents(row, BOS)] == [7, 3]


def test_bos_aligned_runs_on_through_the_next_documents():
    docs = corpus()
    row = bos_aligned(docs, 60, 1, torch.Generator().manual_seed(0))[0]
    first = int(row[1]) - 1 if len(docs[int(row[1]) - 1]) > 1 else None
    if first is not None:
        stream = torch.cat([*docs[first:], *docs[:first]])
        assert torch.equal(row, stream[:60])


def test_task_options_are_checked_hashed_and_refused_where_they_cannot_apply():
    with pytest.raises(ConfigError, match="task.packing"):
        check_packing("greedy")
    with pytest.raises(ConfigError, match="doc_mask"):
        build_task({"name": "mqar", "doc_mask": True})
    plain = {"task": {"name": "bytes", "seq_len": 16}}
    neutral = {"task": {"name": "bytes", "seq_len": 16, "doc_mask": False, "packing": "concat"}}
    assert config_hash(plain) == config_hash(neutral)
    assert config_hash(plain) != config_hash({"task": {**neutral["task"], "packing": "best_fit"}})
    assert config_hash(plain) != config_hash({"task": {**neutral["task"], "doc_mask": True}})


def test_bytes_task_hands_the_model_its_document_ids():
    task = build_task({"name": "bytes", "seq_len": 32, "max_bytes": 200_000, "doc_mask": True,
                       "packing": "bos_aligned"})  # fmt: skip
    batch = task.train_batch(4, torch.Generator().manual_seed(0))
    assert (batch.inputs[:, 0] == BOS).all()
    seen = {}

    def model(ids, **kwargs):
        seen.update(kwargs)
        return torch.zeros(*ids.shape, 256)

    task.logits(model, batch)
    assert torch.equal(seen["doc_ids"], document_ids(batch.inputs, BOS))


@pytest.mark.slow
def test_a_run_trains_on_packed_documents_and_refuses_a_model_that_cannot_keep_them_apart(tmp_path):
    """``task.doc_mask=true`` end to end: a run over best-fit windows trains (its documents reach the model: the
    loss differs from the same run without the mask), and one whose model cannot keep documents apart (multi-token
    prediction's extra depths) is refused by name before it trains."""
    from helpers import tiny

    from zoo.lab.records.metrics import read_metrics
    from zoo.lab.training.run import run

    texts = tmp_path / "texts"  # documents shorter than a window, so windows hold several
    texts.mkdir()
    for n in range(60):
        (texts / f"{n:02d}.txt").write_text(f"document {n}: " + "ab cd ef "[n % 5 :] * (1 + n % 4) + "\n")
    common = [f"task.path={texts}", "task.glob=*.txt", "task.packing=best_fit", "train.steps=3", "train.log_every=1",
              "train.eval_every=0"]  # fmt: skip
    losses = {}
    for mask in ("true", "false"):
        result = run(tiny(*common, f"task.doc_mask={mask}"), tmp_path / mask)
        assert result["status"] == "ok", result["error"]
        losses[mask] = [r["loss"] for r in read_metrics(tmp_path / mask) if r["kind"] == "train"]
    assert len(losses["true"]) == 3 and losses["true"] != losses["false"]
    refused = run(tiny(*common, "task.doc_mask=true", "objective=mtp"), tmp_path / "mtp")
    assert refused["status"] == "failed" and "task.doc_mask" in refused["error"] and "multi-token" in refused["error"]
    assert not (tmp_path / "mtp" / "metrics.jsonl").exists(), "the refused run trained"
