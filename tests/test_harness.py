"""The lm-evaluation-harness model over a saved run (zoo.lab.finished.harness), checked against log-probabilities
computed directly from the model's forward pass."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny, zoo_cli

pytest.importorskip("lm_eval", reason="lm-eval is an optional extra: pip install -e '.[eval]'")
from lm_eval.api.instance import Instance  # noqa: E402

import zoo  # noqa: E402
from zoo.core.errors import ConfigError  # noqa: E402
from zoo.lab.commands.evaluate import main as eval_main  # noqa: E402
from zoo.lab.finished.harness import ZooLM  # noqa: E402
from zoo.lab.training.run import run  # noqa: E402

TEXT = "def déjà(x):\n    return x + 1  # ünï 🦒\nclass Point:\n    pass\n" * 120
#: A multiple-choice task: (question, choices, answer index).
DOCS = [
    ("def f(x):\n    return", ["x", "class", "🦒"], 0),
    ("class", ["Point:", "déjà", "1 +"], 1),
    ("# ünï", ["🦒", "return", "pass"], 2),
    ("x +", ["1", "Point", "def"], 0),
    ("    pass\nclass", ["Point:", "x(", "ünï"], 1),
    ("return x", ["+ 1", "class", ":"], 2),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A bytes run and a tokens run on a 300-token BPE of the same text (seq_len 16)."""
    root = tmp_path_factory.mktemp("harness")
    (root / "in").mkdir()
    (root / "in/doc.txt").write_text(TEXT)
    folders = {"bytes": root / "bytes", "bpe": root / "bpe"}
    text = f"task.path={root / 'in/doc.txt'}"
    assert (
        run(tiny(text, "task.seq_len=16", "train.steps=200", "train.eval_every=100"), folders["bytes"])["status"]
        == "ok"
    )
    pytest.importorskip("tokenizers")
    from zoo.lab.data.prepare import prepare

    prepare([str(root / "in")], root / "tok", tokenizer="bpe", vocab_size=300, val_fraction=0.1, progress=False)
    cfg = tiny(
        f"task.path={root / 'tok'}",
        "task.seq_len=16",
        "model.vocab_size=300",
        "train.steps=200",
        "train.eval_every=100",
        task="tokens",
    )
    assert run(cfg, folders["bpe"])["status"] == "ok"
    return folders


def encoder(kind: str, folder: Path):
    """Text to ids without zoo's wrappers: UTF-8, or the tokenizers library on the prepared tokenizer.json."""
    if kind == "bytes":
        return lambda text: list(text.encode())
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def direct_logprob(model, inputs: list[int], targets: list[int]) -> float:
    """The sum of log p(targets) at the last len(targets) positions of one unbatched forward of ``inputs``."""
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([inputs])).double(), dim=-1)[0]
    rows = logp[len(inputs) - len(targets) :]
    return float(rows.gather(-1, torch.tensor(targets)[:, None]).sum())


def pair_logprob(model, encode, context: str, continuation: str, max_length: int = 16) -> float:
    ctx = encode(context) if context else encode("\n")
    whole = encode(context + continuation) if context else ctx + encode(continuation)
    assert whole[: len(ctx)] == ctx  # the examples split cleanly at the context's end
    tokens = whole[-(max_length + 1) :]
    n = len(whole) - len(ctx)
    return direct_logprob(model, tokens[:-1], tokens[-n:])


def requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_loglikelihood_is_the_sum_of_the_models_token_log_probs(runs, kind):
    lm = ZooLM(str(runs[kind]), batch_size=3)
    model, encode = zoo.load_run(runs[kind]).model, encoder(kind, runs[kind])
    pairs = [("def f(x):", " return"), ("", "class"), ("x", " + 1"), ("déjà", "(x):\n"), (TEXT[:90], " pass")]
    got = lm.loglikelihood(requests("loglikelihood", pairs))  # batches of mixed lengths, right-padded
    for (context, continuation), (ll, _) in zip(pairs, got, strict=True):
        assert ll == pytest.approx(pair_logprob(model, encode, context, continuation), abs=1e-4)
    assert lm.loglikelihood(requests("loglikelihood", pairs[:1]))[0][0] == pytest.approx(got[0][0], abs=1e-5)
    assert len({round(ll, 3) for ll, _ in got}) == len(pairs)


def test_is_greedy_says_whether_argmax_decoding_gives_the_continuation(runs):
    lm = ZooLM(str(runs["bytes"]))
    model = zoo.load_run(runs["bytes"]).model
    context = "class Poi"
    greedy = model.generate(torch.tensor([list(context.encode())]), 3, temperature=0.0, use_cache=False)
    best = bytes(greedy[0].tolist()).decode("latin-1")
    other = "Q" if best[0] != "Q" else "R"
    got = lm.loglikelihood(requests("loglikelihood", [(context, best[:1]), (context, other)]))
    assert [g for _, g in got] == [True, False]


def test_rolling_loglikelihood_covers_every_token_once_in_windows(runs):
    lm = ZooLM(str(runs["bytes"]), batch_size=2)
    model, text = zoo.load_run(runs["bytes"]).model, TEXT[:41]
    tokens, length = list(text.encode()), 16
    seq = [ord("\n"), *tokens]  # the first window starts after a newline
    expected = 0.0
    for start in range(0, len(tokens), length):  # each window predicts up to 16 tokens, after 16 before them
        end = min(start + length, len(tokens))
        expected += direct_logprob(model, seq[max(end - length, 0) : end], tokens[start:end])
    (got,) = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(text,)]))
    assert got == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_generate_until_is_greedy_decoding_cut_before_the_stop_string(runs, kind):
    lm = ZooLM(str(runs[kind]), batch_size=2)
    model, encode = zoo.load_run(runs[kind]).model, encoder(kind, runs[kind])
    # different lengths (left-padded), none over 16 - 8 tokens: no context is cut to make room for 8 new tokens
    contexts = ["def d", "class", "x + 1 ü", "  return"]
    full = []
    for context in contexts:
        new = model.generate(torch.tensor([encode(context)]), 8, temperature=0.0, use_cache=False)[0].tolist()
        full.append(lm.codec.decode(new))
    assert lm.generate_until(requests("generate_until", [(c, {"max_gen_toks": 8}) for c in contexts])) == full
    # a stop string inside some continuation (not at its start): a character first seen after others
    stop = next(t[k] for t in full for k in range(1, len(t)) if t.index(t[k]) == k)
    args = [(c, {"until": ["never", stop], "max_gen_toks": 8}) for c in contexts]
    cut = lm.generate_until(requests("generate_until", args))
    assert cut == [t[: t.index(stop)] if stop in t else t for t in full]
    assert any(0 < len(c) < len(t) for c, t in zip(cut, full, strict=True))
    longer = [("# ünï 🦒\n" * 3 + contexts[3], {"max_gen_toks": 8})]  # keeps its last 8 tokens
    assert lm.generate_until(requests("generate_until", longer)) == [lm.codec.decode(model.generate(
        torch.tensor([encode(longer[0][0])[-8:]]), 8, temperature=0.0)[0].tolist())]  # fmt: skip


def write_task(folder: Path) -> Path:
    """A local multiple-choice task: a JSONL file and its lm-eval task YAML."""
    folder.mkdir(exist_ok=True)
    lines = [json.dumps({"question": q, "choices": c, "answer": a}) for q, c, a in DOCS]
    (folder / "mc.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "zoo_mc.yaml").write_text(
        "task: zoo_mc\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {folder / 'mc.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: answer\n'
        "metric_list:\n  - metric: acc\n"
    )
    return folder


def hand_accuracy(folder: Path, kind: str) -> float:
    model, encode = zoo.load_run(folder).model, encoder(kind, folder)
    right = 0
    for question, choices, answer in DOCS:
        scores = [pair_logprob(model, encode, question, " " + choice) for choice in choices]
        right += max(range(len(choices)), key=scores.__getitem__) == answer
    return right / len(DOCS)


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_zoo_eval_harness_accuracy_is_the_hand_computed_one(runs, kind, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tasks = write_task(tmp_path / "tasks")
    expected = hand_accuracy(runs[kind], kind)
    eval_main([str(runs[kind]), "--harness", "zoo_mc", "--include-path", str(tasks), "--batch-size", "4"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "zoo_mc" in line and "acc" in line)
    assert math.isclose(float(row.split("|")[7]), expected, abs_tol=5e-5), (row, expected)
    with pytest.raises(SystemExit, match="zoo-eval: --harness='no_such_task': lm-eval task names"):
        eval_main([str(runs[kind]), "--harness", "no_such_task", "--include-path", str(tasks)])


def test_a_task_whose_data_cannot_be_fetched_is_one_line_naming_it(runs, tmp_path, monkeypatch):
    """A built-in task's dataset on the Hub, from a machine with no route to it: one line naming the task and the way
    out, not the traceback of datasets' ConnectionError."""
    import lm_eval

    def unreachable(**kwargs):
        raise ConnectionError("Couldn't reach 'Rowan/hellaswag' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(lm_eval, "simple_evaluate", unreachable)
    tasks = write_task(tmp_path / "tasks")
    with pytest.raises(SystemExit) as exited:
        eval_main([str(runs["bytes"]), "--harness", "zoo_mc", "--include-path", str(tasks)])
    message = str(exited.value.code)
    assert message.startswith("zoo-eval: --harness='zoo_mc': its data could not be fetched (Couldn't reach"), message
    assert "HF_DATASETS_OFFLINE=1" in message and "\n" not in message


@pytest.mark.slow  # lm-eval's command line indexes its built-in tasks: half a minute
def test_lm_evals_command_line_runs_the_zoo_model(runs, tmp_path):
    tasks = write_task(tmp_path / "tasks")
    done = zoo_cli(
        "zoo.lab.finished.harness", "--model", "zoo", "--model_args", f"run={runs['bytes']}", "--tasks", "zoo_mc",
        "--include_path", str(tasks), "--batch_size", "4", "--device", "cpu", cwd=tmp_path,
    )  # fmt: skip
    row = next(line for line in done.stdout.splitlines() if "zoo_mc" in line)
    assert math.isclose(float(row.split("|")[7]), hand_accuracy(runs["bytes"], "bytes"), abs_tol=5e-5), row


def test_lm_evals_plugin_discovery_resolves_zoo_to_the_model_class():
    """lm-eval's model plugins (after its 0.4.13 release) read the ``lm_eval.models`` entry points into its
    registry as lazy placeholders, loaded on first lookup: zoo's entry point, installed with the package."""
    from importlib.metadata import entry_points

    from lm_eval.api.model import LM
    from lm_eval.api.registry import Registry

    (point,) = [p for p in entry_points(group="lm_eval.models") if p.name == "zoo"]
    registry = Registry("model", base_cls=LM)
    registry.register("zoo", target=point)
    assert registry.get("zoo") is ZooLM


def test_a_run_without_text_is_refused(runs, tmp_path):
    shutil.copytree(runs["bpe"], tmp_path / "ids")
    summary = json.loads((tmp_path / "ids/summary.json").read_text())
    del summary["data"]["tokenizer"]  # as a run on .bin files: token ids, no text
    (tmp_path / "ids/summary.json").write_text(json.dumps(summary))
    with pytest.raises(ConfigError, match=r"ids': a run with text: task bytes, or tokens with a tokenizer.json"):
        ZooLM(str(tmp_path / "ids"))
