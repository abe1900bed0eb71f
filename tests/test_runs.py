"""Using finished runs: zoo.load_run, zoo-generate and zoo-eval (through their command lines)."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil

import pytest
import torch
from helpers import tiny

import zoo
from zoo.core.errors import ConfigError
from zoo.lab.commands.evaluate import main as eval_main
from zoo.lab.commands.generate import main as generate_main
from zoo.lab.finished.runs import evaluate_run, load_codec, text_to_tokens, tokens_to_text
from zoo.lab.records.summary import NEWER
from zoo.lab.training.run import run
from zoo.models import language


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A byte-level llama-style run (and the model object it trained) and an mqar run."""
    root = tmp_path_factory.mktemp("runs")
    built, build_model = [], language.build_model

    def keep(cfg, **resolved):  # the model the run trains, to compare with what load_run rebuilds
        built.append(build_model(cfg, **resolved))
        return built[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(language, "build_model", keep)  # what a language-model task builds
        summary = run(tiny("preset=llama", "task.eval_lengths=[1,2]"), root / "bytes")
    assert summary["status"] == "ok"
    small = ("task.n_pairs=4", "task.n_queries=4", "task.n_keys=16", "task.n_values=16")
    mqar = run(tiny(*small, task="mqar"), root / "m")
    assert mqar["status"] == "ok"
    return root, built[0].eval(), summary


def test_load_run_gives_the_trained_model_and_its_config(trained):
    root, model, summary = trained
    loaded, config = zoo.load_run(root / "bytes")
    assert config == summary["config"] and not loaded.training
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))


def test_a_checkpoint_loads_and_a_run_without_weights_says_why(tmp_path):
    run(tiny("train.save=none", "train.checkpoint_every=4"), tmp_path)
    with pytest.raises(ConfigError, match=r"has no model.safetensors \(status 'ok'; train.save=final keeps it\)"):
        zoo.load_run(tmp_path)
    model, _ = zoo.load_run(tmp_path / "checkpoints" / "step_000008")
    assert model.num_parameters() > 0


def test_zoo_eval_reproduces_the_runs_validation_and_goes_longer(trained, capsys):
    root, _, summary = trained
    metrics, errors, _ = evaluate_run(root / "bytes")
    assert metrics == {k: v for k, v in summary["final"].items() if k != "train_loss"} and not errors
    eval_main([str(root / "bytes"), "--lengths", "1,2,4"])
    out = capsys.readouterr().out
    assert "| length | tokens | val_bpb | val_loss |" in out
    assert f"| 1x | 32 | {summary['final']['val_bpb']:.4f} | {summary['final']['val_loss']:.4f} |" in out
    assert f"| 2x | 64 | {summary['final']['val_bpb_2x']:.4f} |" in out and "| 4x | 128 |" in out
    with pytest.raises(SystemExit, match="zoo-eval: --lengths='1,x': multiples of the trained length"):
        eval_main([str(root / "bytes"), "--lengths", "1,x"])


def test_zoo_generate_prints_text_for_bytes_and_ids_otherwise(trained, capsys):
    root, model, _ = trained
    generate_main([str(root / "bytes"), "def ", "--max-new-tokens", "12", "--temperature", "0"])
    text = capsys.readouterr().out.rstrip("\n")
    greedy = model.generate(torch.tensor([list(b"def ")]), 12, temperature=0.0, use_cache=False)
    assert text == "def " + bytes(greedy[0].tolist()).decode("utf-8", errors="replace")
    generate_main([str(root / "bytes"), "x", "--max-new-tokens", "5", "--temperature", "0.8", "--top-k", "5"])
    assert capsys.readouterr().out.startswith("x")
    generate_main([str(root / "m"), "1 17 2 18 1", "--max-new-tokens", "3", "--temperature", "0"])
    ids = capsys.readouterr().out.split()
    assert len(ids) == 3 and all(0 <= int(i) < 32 for i in ids)
    with pytest.raises(SystemExit, match="zoo-generate: prompt='1 a': token ids separated by spaces"):
        generate_main([str(root / "m"), "1 a"])


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("truncate", r"truncated: [\d,]+ bytes, manifest.json lists [\d,]+"),
        ("zero", r"altered: sha256 [0-9a-f]{16}\.\.\., manifest.json lists [0-9a-f]{16}\.\.\."),
    ],
)
def test_damaged_weights_give_one_line_naming_the_file(tmp_path, capsys, damage, problem):
    run(tiny(), tmp_path)
    weights = tmp_path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    if damage == "truncate":
        del data[-1000:]
    else:
        data[len(data) // 2 : len(data) // 2 + 1000] = bytes(1000)
    weights.write_bytes(bytes(data))
    expected = rf"file='{re.escape(str(weights))}': {problem}"
    with pytest.raises(ConfigError, match=f"^{expected}$"):  # zoo's error type (IntegrityError)
        zoo.load_run(tmp_path)
    for main, argv in ((eval_main, []), (generate_main, ["x"])):
        with pytest.raises(SystemExit) as exited:
            main([str(tmp_path), *argv])
        assert re.fullmatch(rf"zoo-(eval|generate): {expected}", str(exited.value.code)), exited.value.code
    assert capsys.readouterr().err == ""  # no traceback, no other line


@pytest.mark.parametrize(
    ("task", "text", "tokens"),
    [("bytes", "héllo", [104, 195, 169, 108, 108, 111]), ("mqar", "3 17 0", [3, 17, 0])],
)
def test_a_prompt_becomes_tokens_and_tokens_become_text_by_the_runs_task(task, text, tokens):
    config = {"task": {"name": task}}
    assert text_to_tokens(text, config) == tokens
    assert tokens_to_text(tokens, config) == text
    if task == "bytes":
        assert tokens_to_text([104, 0xFF], config) == "h\ufffd"  # a cut UTF-8 sequence is replaced, not raised
    else:
        with pytest.raises(ConfigError, match="prompt='three'"):
            text_to_tokens("three", config)


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
    """A tokens run on a 300-token BPE of a small text (zoo-prepare), and its prepared folder."""
    pytest.importorskip("tokenizers")
    from zoo.lab.data.prepare import prepare

    root = tmp_path_factory.mktemp("bpe")
    (root / "in").mkdir()
    (root / "in/doc.txt").write_text("def déjà(x):\n    return x + 1  # ünï 🦒\n" * 200)
    prepare([str(root / "in")], root / "tok", tokenizer="bpe", vocab_size=300, val_fraction=0.1, progress=False)
    cfg = tiny(f"task.path={root / 'tok'}", "task.seq_len=16", "model.vocab_size=300", task="tokens")
    summary = run(cfg, root / "run")
    assert summary["status"] == "ok", summary.get("error")
    return root, summary


def test_a_tokens_run_records_its_tokenizer_and_keeps_a_copy(bpe_run):
    root, summary = bpe_run
    record = summary["data"]["tokenizer"]
    raw = (root / "tok/tokenizer.json").read_bytes()
    assert record == {"path": str((root / "tok/tokenizer.json").resolve()), "sha256": hashlib.sha256(raw).hexdigest(),
                      "vocab_size": json.loads((root / "tok/meta.json").read_text())["vocab_size"]}  # fmt: skip
    assert (root / "run/tokenizer.json").read_bytes() == raw


def test_zoo_generate_encodes_and_decodes_through_the_runs_tokenizer(bpe_run, capsys):
    from tokenizers import Tokenizer

    root, _ = bpe_run
    prompt = "def déjà(x):\n"
    generate_main([str(root / "run"), prompt, "--max-new-tokens", "10", "--temperature", "0"])
    text = capsys.readouterr().out.removesuffix("\n")
    tok = Tokenizer.from_file(str(root / "tok/tokenizer.json"))  # independently of zoo's wrapper
    ids = tok.encode(prompt, add_special_tokens=False).ids
    assert len(ids) < len(prompt.encode())  # BPE merges, not bytes
    model, _ = zoo.load_run(root / "run")
    greedy = model.generate(torch.tensor([ids]), 10, temperature=0.0, use_cache=False)[0].tolist()
    assert text == tok.decode(ids + greedy) and text.startswith(prompt)
    assert load_codec(root / "run").decode(ids) == prompt  # the round trip, non-ASCII included


def test_a_tokenizer_whose_sha256_differs_from_the_summarys_is_refused(bpe_run, tmp_path):
    root, _ = bpe_run
    shutil.copytree(root / "run", tmp_path / "run")
    (tmp_path / "run/tokenizer.json").unlink()  # without the copy: the recorded path, verified as well
    assert load_codec(tmp_path / "run").encode("def") == load_codec(root / "run").encode("def")
    original = json.loads((root / "run/tokenizer.json").read_text())
    original["model"]["vocab"] = {k: (v + 1) % 300 for k, v in original["model"]["vocab"].items()}
    (tmp_path / "run/tokenizer.json").write_text(json.dumps(original))  # another tokenizer, same size
    with pytest.raises(SystemExit, match=r"zoo-generate: tokenizer='.*tokenizer.json': sha256 [0-9a-f]{16}\.\.\."):
        generate_main([str(tmp_path / "run"), "def", "--max-new-tokens", "2"])
    (tmp_path / "run/tokenizer.json").unlink()
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    summary["data"]["tokenizer"]["path"] = str(tmp_path / "gone.json")
    (tmp_path / "run/summary.json").write_text(json.dumps(summary))
    with pytest.raises(ConfigError, match=r"gone.json': the run's tokenizer.json"):
        load_codec(tmp_path / "run")


def test_a_tokens_run_on_prepared_bytes_takes_and_prints_text(tmp_path, capsys):
    from zoo.lab.data.prepare import prepare

    (tmp_path / "in").mkdir()
    (tmp_path / "in/doc.txt").write_text("def déjà(x):\n    return x + 1\n" * 300)
    prepare([str(tmp_path / "in")], tmp_path / "tok", val_fraction=0.1, progress=False)  # --tokenizer bytes
    summary = run(tiny(f"task.path={tmp_path / 'tok'}", "task.seq_len=16", task="tokens"), tmp_path / "run")
    assert summary["data"]["tokenizer"] == {"kind": "bytes", "vocab_size": 256}
    generate_main([str(tmp_path / "run"), "déjà", "--max-new-tokens", "6", "--temperature", "0"])
    model, _ = zoo.load_run(tmp_path / "run")
    greedy = model.generate(torch.tensor([list("déjà".encode())]), 6, temperature=0.0, use_cache=False)
    assert capsys.readouterr().out == "déjà" + bytes(greedy[0].tolist()).decode("utf-8", errors="replace") + "\n"


def test_evaluation_builds_no_optimizer(trained, monkeypatch):
    """zoo-eval scores through the trainer's Evaluator (zoo.lab.training.evaluation) alone: no optimizer."""
    from zoo.lab.recipe import Recipe

    monkeypatch.setattr(Recipe, "build", lambda *a, **k: pytest.fail("evaluation built an optimizer"))
    root, _, summary = trained
    metrics, errors, _ = evaluate_run(root / "bytes")
    assert not errors and metrics["val_bpb"] == pytest.approx(summary["final"]["val_bpb"], rel=1e-6)


def test_a_folder_that_is_no_run_is_one_line_from_zoo_eval_and_zoo_generate(tmp_path):
    for main, argv in ((eval_main, []), (generate_main, ["x"])):
        for folder in (tmp_path / "missing", tmp_path):  # nothing there; a folder without summary.json
            with pytest.raises(SystemExit) as exited:
                main([str(folder), *argv])
            message = f"run='{folder}': a run folder with a summary.json (zoo-train writes one)"
            assert str(exited.value.code).endswith(message), exited.value.code


@pytest.mark.parametrize("flag", ["--batches", "--limit", "--batch-size"])
@pytest.mark.parametrize("value", ["0", "-2", "x"])
def test_zoo_eval_refuses_a_count_below_one_naming_the_flag(tmp_path, capsys, flag, value):
    """``--batches 0`` read as "the run's own count" and ``--batches -2`` raised torch's "number of steps must be
    non-negative" after the weights loaded: argparse's error names the flag and the value, before anything loads."""
    with pytest.raises(SystemExit) as exited:
        eval_main([str(tmp_path / "missing"), flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}: {value!r}: a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        ("nosuch", "device='nosuch': cpu, cuda or cuda:<index>"),
        ("mps", "device='mps': cpu, cuda or cuda:<index>"),
        pytest.param("cuda", "device='cuda': CUDA is not available on this machine; use --device=cpu",
                     marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")),
    ],
)
def test_a_device_the_machine_cannot_run_is_one_line_from_zoo_eval_and_zoo_generate(trained, device, expected):
    """--device as zoo-train's ``device`` takes it, refused with one line before the weights load (torch's own errors
    were a traceback: "Torch not compiled with CUDA enabled", "Expected one of cpu, cuda, ... device type")."""
    root = trained[0]
    for main, argv in ((eval_main, []), (generate_main, ["x"])):
        with pytest.raises(SystemExit) as exited:
            main([str(root / "bytes"), *argv, "--device", device])
        assert str(exited.value.code) == f"zoo-{'eval' if main is eval_main else 'generate'}: {expected}"


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("cut", "summary.json is not valid JSON ("),
        ("steps", "summary.json: steps: a str, not an integer: "),
        ("schema", "summary.json: schema='99': not an integer: "),
    ],
)
def test_a_summary_that_does_not_read_is_named_with_its_problem(trained, tmp_path, damage, problem):
    root, _, summary = trained
    folder = tmp_path / "run"
    shutil.copytree(root / "bytes", folder)
    text = json.dumps({**summary, "steps": "five"} if damage == "steps" else {**summary, "schema": "99"})
    (folder / "summary.json").write_text(text[: len(text) // 2] if damage == "cut" else text)
    expected = f"run='{folder}': {problem}"
    with pytest.raises(ConfigError) as error:
        zoo.load_run(folder)
    assert str(error.value).startswith(expected), error.value
    for main, argv in ((eval_main, []), (generate_main, ["x"])):
        with pytest.raises(SystemExit) as exited:
            main([str(folder), *argv])
        assert str(exited.value.code).startswith(f"zoo-{'eval' if main is eval_main else 'generate'}: {expected}")


def test_a_summary_of_a_newer_schema_reads_with_one_warning_from_every_reader(trained, tmp_path, caplog, capsys):
    from zoo.lab.commands.report import main as report_main
    from zoo.lab.records.summary import SCHEMA

    root, _, summary = trained
    folder = tmp_path / "sweep" / "run"
    shutil.copytree(root / "bytes", folder)
    (folder / "summary.json").write_text(json.dumps({**summary, "schema": 99, "energy_j": 3.5}))
    warning = f"{folder / 'summary.json'}: schema 99, written by a newer zoo (this one writes schema {SCHEMA}): read"
    for use in (
        lambda: eval_main([str(folder)]),
        lambda: generate_main([str(folder), "x", "--max-new-tokens", "2"]),
        lambda: zoo.load_run(folder),
        lambda: report_main([str(tmp_path / "sweep"), "--no-plots"]),
    ):
        caplog.clear()
        NEWER.clear()
        use()
        assert [r.getMessage()[: len(warning)] for r in caplog.records if r.levelno >= logging.WARNING] == [warning]
    assert f"| {summary['final']['val_bpb']:.4f} |" in capsys.readouterr().out  # read, its numbers reported
