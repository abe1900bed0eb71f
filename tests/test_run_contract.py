"""The run contract: a run comes back as it was trained, from a copy of its folder, from any working folder.

Over a covering set of run configs (every value of ``param``, ``optim``, ``schedule``, ``objective`` and ``task``,
every attention kind and position scheme, tied and untied embeddings, ``compile=true`` and a branch), each row is
trained a few steps, its folder copied to another path and used from another working folder (one that holds
other data under the run's relative ``task.path``), and then:

- evaluation (``zoo-eval``'s :func:`evaluate_run`) equals the metrics the run recorded, to 1e-6 relative;
- greedy generation with the KV cache equals the argmax of the full forward over what it generated;
- ``to_hf`` gives a transformers model with the same logits, or a ConfigError naming what it cannot carry;
- for the rows with checkpoints, a kill and resume equals the uninterrupted run bit for bit.

docs/testing.md says what the set covers and what it costs.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers import interrupt, tiny
from safetensors.torch import load_file

from zoo.core.errors import ConfigError
from zoo.lab.data.prepare import prepare
from zoo.lab.files import write_json_atomic
from zoo.lab.finished.runs import evaluate_run, load_run, run_task_config, to_hf
from zoo.lab.records import checkpoint as ckpt
from zoo.lab.records.summary import read_summary
from zoo.lab.tasks import build_task
from zoo.lab.tasks.transduce import BOS
from zoo.lab.training.run import run
from zoo.models.language import LanguageModel

#: A run that keeps its checkpoints (resumed from one of them; a branch starts from one).
CHECKPOINTS = ("train.checkpoint_every=4", "train.keep_checkpoints=10")


@dataclass(frozen=True)
class Row:
    """One run config of the covering set: its task, overrides, and what ``to_hf`` must do (``"logits"``: equal
    logits; else the field its ConfigError names)."""

    task: str
    overrides: tuple[str, ...]
    hf: str
    resume: bool = False
    branch: bool = False


ROWS = {
    # μP away from its base width (the logit multiplier and score scales must come back), Llama-shaped; QK-clip and
    # a tail EMA (in the checkpoints).
    "bytes-mup-llama": Row(
        "bytes",
        ("preset=llama", "param=mup", "param.base_width=16", "optim=adamw", "schedule=cosine", "init=zero_out",
         "optim.qk_clip=0.05", "train.tail_ema=0.5", "train.tail_ema_from=2", *CHECKPOINTS),
        hf="logits",
        resume=True,
    ),
    # Token files under a relative task.path; Muon, WSD, untied; branched from its stable phase.
    "tokens-muon-wsd-branch": Row(
        "tokens",
        ("attn=mqa", "pos=alibi", "optim=muon", "schedule=wsd", "model.tie_embeddings=false", *CHECKPOINTS),
        hf="block.norm",
        resume=True,
        branch=True,
    ),
    # Generated data, latent attention, SGD under μP.
    "mqar-mla-sgd-mup": Row(
        "mqar",
        ("attn=mla", "pos=none", "optim=sgd", "train.lr=0.05", "schedule=linear", "param=mup", "param.base_width=16"),
        hf="block.attn",
    ),
    # Longer evaluation lengths, linear attention, Adafactor, sinusoidal positions, untied.
    "lengthgen-linear-adafactor": Row(
        "lengthgen",
        ("attn=linear", "pos=sinusoidal", "optim=adafactor", "schedule=constant", "model.tie_embeddings=false"),
        hf="block.attn",
    ),
    # An encoder-decoder.
    "transduce-seq2seq": Row(
        "transduce", ("attn=gqa", "pos=rotary", "schedule=inverse_sqrt", "task.max_len=6", "optim=adamh"), hf="run"
    ),
    # GPT-2-shaped, every block compiled.
    "bytes-gpt-compiled": Row(
        "bytes", ("preset=gpt", "block.max_len=64", "compile=true", "optim=normuon", "optim.ns=polar_express",
                  "optim.cautious_wd=true", "init=mitchell"), hf="logits"
    ),
    # Multi-token prediction, sequential heads annealed: evaluated, generated and exported by the next-token head.
    "bytes-mtp-annealed": Row(
        "bytes",
        ("preset=llama", "objective=mtp", "objective.k=2", "objective.anneal=linear", "optim=muonh", *CHECKPOINTS),
        hf="logits",
        resume=True,
    ),
}


def row_config(row: Row, *extra: str) -> dict:
    data = ("task.path=tokens", "task.seq_len=16") if row.task == "tokens" else ()
    if row.task == "lengthgen":
        data = ("task.max_bytes=30000", "task.seq_len=16", "task.val_fraction=0.1")
    return tiny(*data, *row.overrides, *extra, task=row.task)


def branch_of(source: str | Path) -> tuple[str, ...]:
    """A branch of ``source`` at its step-4 checkpoint, 8 steps long, checkpointed at step 6."""
    return (f"train.branch.from={source}", "train.branch.step=4", "train.steps=8", "train.checkpoint_every=2")


def tokens_folder(folder: Path, text: str) -> None:
    (folder.parent / "text").mkdir(parents=True, exist_ok=True)
    (folder.parent / "text" / "a.txt").write_text(text)
    prepare([str(folder.parent / "text")], folder, tokenizer="bytes", val_fraction=0.2, progress=False)


def corpus_text(seed: int) -> str:
    words = ["alpha", "beta", "gamma", "delta", "run", "model", "token", "zoo", "\n", "def", "(x):"]
    g = torch.Generator().manual_seed(seed)
    return " ".join(words[int(i)] for i in torch.randint(len(words), (3000,), generator=g))


@pytest.fixture
def trained(request, tmp_path, monkeypatch) -> tuple[Row, dict[str, Path], Path]:
    """The row trained in ``tmp_path/work`` (and its branch), the folders moved together to another path, and
    a working folder elsewhere that holds other data under the run's relative ``task.path``. Returns (row,
    {name: moved run folder}, the original work folder)."""
    row: Row = ROWS[request.param]
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    if row.task == "tokens":
        tokens_folder(work / "tokens", corpus_text(0))
    runs = {"run": work / "runs" / "run"}
    done = run(row_config(row), runs["run"])
    assert done["status"] == "ok", done["error"]
    if row.branch:  # a decay branched at step 4 of the 12-step WSD run (its stable phase), by a relative path
        runs["branch"] = work / "runs" / "branch"
        branched = run(row_config(row, *branch_of("runs/run")), runs["branch"])
        assert branched["status"] == "ok", branched["error"]
    moved = tmp_path / "moved" / "runs"
    shutil.copytree(work / "runs", moved)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if row.task == "tokens":
        tokens_folder(elsewhere / "tokens", corpus_text(1))  # same relative name, other data
    monkeypatch.chdir(elsewhere)
    return row, {name: moved / folder.name for name, folder in runs.items()}, work


def relative_error(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def check_evaluation(folder: Path) -> None:
    recorded = read_summary(folder)["final"]
    metrics, errors, _ = evaluate_run(folder)
    assert not errors
    compared = {k: v for k, v in metrics.items() if k in recorded}
    last = {k for k in recorded if k.startswith("val_") and not k.endswith("_ema")}  # _ema: train.tail_ema's weights
    assert compared and set(compared) == last
    for key, value in compared.items():
        assert value is not None and math.isfinite(value)
        assert relative_error(value, recorded[key]) <= 1e-6, (key, value, recorded[key])


def first_divergence(generated: torch.Tensor, logits: torch.Tensor) -> None:
    """``generated`` (n,) equals the argmax of ``logits`` (n, vocab), up to a near tie (then the rest differs)."""
    full = logits.argmax(-1)
    for i, (token, best) in enumerate(zip(generated.tolist(), full.tolist(), strict=True)):
        if token != best:
            gap = (logits[i, best] - logits[i, token]).item()
            assert gap < 1e-4, f"position {i}: cached greedy gave {token}, the full forward's argmax {best} by {gap}"
            return


def check_generation(folder: Path) -> None:
    model, _ = load_run(folder)
    task = build_task(run_task_config(folder))  # the run's data, as evaluation reads it
    batch = task.val_batches(1, 1)[0]
    if isinstance(model, LanguageModel):
        prompt = batch.inputs[:, :6]
        new = model.generate(prompt, 10, temperature=0.0, use_cache=True)  # (1, 10)
        with torch.no_grad():
            logits = model(torch.cat([prompt, new], 1))[0, prompt.shape[1] - 1 : -1]  # (10, vocab)
        first_divergence(new[0], logits)
    else:  # an encoder-decoder: greedy decoding with the cross-attention cache against teacher forcing
        new = model.generate(batch.source, 8, temperature=0.0, bos_id=BOS, src_mask=batch.source_mask)
        decoder_in = torch.cat([torch.full_like(new[:, :1], BOS), new[:, :-1]], 1)
        with torch.no_grad():
            logits = model(batch.source, decoder_in, src_mask=batch.source_mask)  # (b, 8, vocab)
        for row in range(new.shape[0]):
            first_divergence(new[row], logits[row])


def check_hf(folder: Path, expected: str, out: Path) -> None:
    if expected != "logits":
        with pytest.raises(ConfigError) as refused:
            to_hf(folder, out)
        assert refused.value.field == expected, str(refused.value)
        assert not out.exists()
        return
    transformers = pytest.importorskip("transformers")
    to_hf(folder, out)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    model, _ = load_run(folder)
    ids = torch.randint(0, model.embed.num_embeddings, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf_model(ids).logits, model(ids), atol=1e-4, rtol=1e-4)


def check_resume(folder: Path, config: dict, at: int, scratch: Path) -> None:
    """Killed after its checkpoint at step ``at`` and run again: the uninterrupted run's metrics and weights,
    bit for bit."""
    killed = scratch / folder.name
    interrupt(folder, killed, at)
    resumed = run(config, killed)
    whole = read_summary(folder)
    assert resumed["status"] == "ok" and resumed["resumed_from"] == [at], resumed.get("error")
    assert resumed["final"] == whole["final"]
    a, b = load_file(folder / ckpt.WEIGHTS), load_file(killed / ckpt.WEIGHTS)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def refused_on_other_data(folder: Path, config: dict, scratch: Path) -> None:
    killed = scratch / folder.name
    interrupt(folder, killed, 4)
    files = {p: p.read_bytes() for p in killed.rglob("*") if p.is_file()}
    refused = run(config, killed)
    assert refused["status"] == "refused" and "trained on other data" in refused["error"], refused
    assert {p: p.read_bytes() for p in killed.rglob("*") if p.is_file() and ".hydra" not in p.parts} == files


@pytest.mark.slow
@pytest.mark.parametrize("trained", list(ROWS), indirect=True)
def test_a_run_comes_back_as_it_was_trained(trained, tmp_path):
    row, folders, work = trained
    for name, folder in folders.items():
        check_evaluation(folder)
        check_generation(folder)
        check_hf(folder, row.hf, tmp_path / f"hf-{name}")
    if row.resume:
        if row.task == "tokens":  # the relative task.path names other data here: refused untouched, then resumed there
            refused_on_other_data(folders["run"], row_config(row), tmp_path / "other-data")
            os.chdir(work)
        check_resume(folders["run"], row_config(row), 4, tmp_path / "killed")
    if row.branch:  # moved with its source and named by another path: done as it is, and a killed one resumes
        config = row_config(row, *branch_of(folders["run"]))
        files = {p: p.read_bytes() for p in folders["branch"].rglob("*") if p.is_file()}
        again = run(config, folders["branch"])
        assert again["status"] == "ok" and again["branch"]["step"] == 4, again.get("error")
        assert {p: p.read_bytes() for p in folders["branch"].rglob("*") if p.is_file()} == files  # already done
        check_resume(folders["branch"], config, 6, tmp_path / "killed")


@pytest.mark.parametrize("trained", ["tokens-muon-wsd-branch"], indirect=True)
def test_evaluation_reads_the_recorded_data_or_the_one_given_and_refuses_other_data(trained):
    row, folders, work = trained
    folder = folders["run"]
    recorded = read_summary(folder)
    metrics, _, _ = evaluate_run(folder, data=str(work / "tokens"))  # the run's data, named on the command line
    assert metrics["val_bpb"] == pytest.approx(recorded["final"]["val_bpb"], rel=1e-6)
    with pytest.raises(ConfigError) as other:  # the other data in this working folder
        evaluate_run(folder, data="tokens")
    assert recorded["data"]["sha256"] in str(other.value) and other.value.field == "data.sha256"
    assert recorded["data"]["paths"] == {"path": str(work / "tokens")}  # the recorded path, read without --data
    shutil.rmtree(work / "tokens")
    with pytest.raises(ConfigError) as gone:  # deleted there: both ways to give it back named
        evaluate_run(folder)
    assert "zoo-prepare" in str(gone.value) and "--data PATH" in str(gone.value) and gone.value.field == "task.path"
    tokens_folder(work / "tokens", corpus_text(1))  # replaced there by other data of the same format
    with pytest.raises(ConfigError) as replaced:
        evaluate_run(folder)
    assert recorded["data"]["sha256"] in str(replaced.value) and replaced.value.field == "data.sha256"


@pytest.mark.parametrize("trained", ["tokens-muon-wsd-branch"], indirect=True)
def test_a_run_recorded_before_absolute_paths_reads_the_working_folder_with_a_warning(trained, monkeypatch, caplog):
    _, folders, work = trained
    folder = folders["run"]
    summary = read_summary(folder)
    del summary["data"]["paths"]
    write_json_atomic(folder / "summary.json", summary)
    monkeypatch.chdir(work)
    metrics, _, _ = evaluate_run(folder)
    assert metrics["val_bpb"] == pytest.approx(summary["final"]["val_bpb"], rel=1e-6)
    assert "recorded no absolute data path" in caplog.text
