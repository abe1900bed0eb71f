"""An lm-evaluation-harness model over a saved run: ``zoo-eval DIR --harness TASKS``, or lm-eval's own
command line through ``python -m zoo.lab.finished.harness --model zoo --model_args run=DIR --tasks TASKS``.

lm-eval with model plugins (after its 0.4.13 release) finds ``zoo`` through the package's
``lm_eval.models`` entry point, so ``lm_eval --model zoo`` works; 0.4.13 finds a model class only
once the module defining it is imported: importing this module registers ``zoo``, and ``python -m
zoo.lab.finished.harness`` (``zoo-lm-eval``) is lm-eval's command line with it registered. Needs the ``eval``
extra (``pip install -e ".[eval]"``: lm-eval >= 0.4, < 0.5).

Text goes in and out through the run's tokenizer (:func:`zoo.lab.finished.runs.load_codec`): UTF-8 bytes for
``bytes`` runs, the run's verified ``tokenizer.json`` for ``tokens`` runs. The zoo's models have no
beginning-of-text token: an empty context, and the first window of a rolling log-likelihood, are
conditioned on a newline, the separator of the documents they trained on. Contexts longer than the
run's trained length (``max_length``, default ``task.seq_len``) keep their last tokens.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from zoo.core.errors import ConfigError
from zoo.lab.finished.runs import load_codec, load_run
from zoo.lab.planning.run_model import is_language_model

#: What an empty context is: the documents' separator.
SEPARATOR = "\n"
#: lm-eval's default generation length.
MAX_GEN_TOKS = 256


def batch_size_of(value: int | str | None) -> int:
    """lm-eval's ``--batch_size`` (a number, or ``auto``: 8 here) as a positive int."""
    if value is None or str(value).startswith("auto"):
        return 8
    if not str(value).isdigit() or int(value) < 1:
        raise ConfigError("batch_size", value, "a positive integer (or auto)")
    return int(value)


@register_model("zoo")
class ZooLM(LM):
    """A zoo run as an lm-eval model: ``loglikelihood`` and ``loglikelihood_rolling`` in batches of
    right-padded rows (the models are causal: padding after a row's tokens changes none of its
    logits), ``generate_until`` in left-padded batches through the KV cache."""

    def __init__(
        self,
        run: str,
        batch_size: int | str | None = 8,
        max_batch_size: int | None = None,
        device: str | None = "cpu",
        max_length: int | str | None = None,
        **_: Any,
    ) -> None:
        super().__init__()
        self._device = torch.device(device or "cpu")
        if self._device.type == "cuda" and not torch.cuda.is_available():  # lm-eval's default is cuda
            self._device = torch.device("cpu")
        self.model, self.config = load_run(run, self._device)
        is_language_model(self.model, "lm-eval", ": lm-eval scores decoder-only language models")
        self.codec = load_codec(run)
        if not self.codec.has_text:
            raise ConfigError("run", run, "a run with text: task bytes, or tokens with a tokenizer.json")
        self.batch_size = batch_size_of(batch_size)
        self.max_length = int(max_length) if max_length else int(self.config["task"]["seq_len"])
        self.prefix = self.codec.encode(SEPARATOR)[-1]

    @property
    def device(self) -> torch.device:
        return self._device

    # -- log-likelihoods ------------------------------------------------------------------------
    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Context and continuation tokens, as lm-eval's own models split them: the context's trailing
        spaces go to the continuation, and the continuation is what encoding both adds to the context."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        if not context:
            return [self.prefix], self.codec.encode(continuation)
        whole, ctx = self.codec.encode(context + continuation), self.codec.encode(context)
        return ctx, whole[len(ctx) :]

    @torch.no_grad()
    def score(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of the continuation's log-probs, whether greedy decoding gives it) per (context, continuation)."""
        results: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
        order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
        for start in range(0, len(order), self.batch_size):
            rows = [
                (i, (pairs[i][0] + pairs[i][1])[-(self.max_length + 1) :])
                for i in order[start : start + self.batch_size]
            ]
            ids = torch.zeros(len(rows), max(len(t) for _, t in rows) - 1, dtype=torch.long)
            for r, (_, tokens) in enumerate(rows):
                ids[r, : len(tokens) - 1] = torch.tensor(tokens[:-1])  # right-padded with token 0
            logp = F.log_softmax(self.model(ids.to(self.device)).float(), dim=-1)  # (b, t, vocab)
            for r, (i, tokens) in enumerate(rows):
                n = min(len(pairs[i][1]), len(tokens) - 1)
                target = torch.tensor(tokens[len(tokens) - n :], dtype=torch.long, device=self.device)
                lp = logp[r, len(tokens) - 1 - n : len(tokens) - 1]  # (n, vocab): the predictions of target
                results[i] = (float(lp.gather(-1, target[:, None]).sum()), bool((lp.argmax(-1) == target).all()))
        return results

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        results = self.score([self.encode_pair(*req.args) for req in requests])
        for req, result in zip(requests, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", req.args, result)
        return results

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood in disjoint windows of ``max_length`` tokens (the first after a newline)."""
        results = []
        for req in requests:
            ids = self.codec.encode(req.args[0])
            windows = get_rolling_token_windows(ids, self.prefix, self.max_length, 1)
            total = sum(ll for ll, _ in self.score([make_disjoint_window(w) for w in windows]))
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
            results.append(total)
        return results

    # -- generation -----------------------------------------------------------------------------
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy (or, with ``do_sample``, sampled) continuations, each cut before its first stop string."""
        results: list[str] = [""] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        for indices in groups.values():
            kwargs = dict(requests[indices[0]].args[1])
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            for start in range(0, len(indices), self.batch_size):
                batch = indices[start : start + self.batch_size]
                texts = self.generate([requests[i].args[0] for i in batch], kwargs)
                for i, text in zip(batch, texts, strict=True):
                    results[i] = cut(text, until)
                    self.cache_hook.add_partial("generate_until", requests[i].args, results[i])
        return results

    @torch.no_grad()
    def generate(self, contexts: Sequence[str], kwargs: dict[str, Any]) -> list[str]:
        """The continuations of ``contexts`` (one left-padded batch, KV-cached), decoded."""
        new_tokens = int(kwargs.get("max_gen_toks", MAX_GEN_TOKS))
        temperature = float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample") else 0.0
        keep = max(self.max_length - new_tokens, 1)
        encoded = [(self.codec.encode(c) or [self.prefix])[-keep:] for c in contexts]
        width = max(map(len, encoded))
        ids = torch.zeros(len(encoded), width, dtype=torch.long)
        mask = torch.zeros(len(encoded), width, dtype=torch.bool)
        for r, tokens in enumerate(encoded):
            ids[r, width - len(tokens) :], mask[r, width - len(tokens) :] = torch.tensor(tokens), True
        generator = torch.Generator(self.device).manual_seed(int(kwargs.get("seed", 0)))
        new = self.model.generate(
            ids.to(self.device), new_tokens, temperature, key_mask=mask.to(self.device), generator=generator
        )
        return [self.codec.decode(row) for row in new.tolist()]


def cut(text: str, until: Sequence[str]) -> str:
    """``text`` up to (not including) the first occurrence of any stop string."""
    for stop in until:
        if stop:
            text = text.split(stop, 1)[0]
    return text


def evaluate(
    run: str,
    tasks: Sequence[str],
    *,
    include_path: str | None = None,
    limit: int | None = None,
    batch_size: int = 8,
    device: str = "cpu",
) -> dict[str, Any]:
    """lm-eval's ``simple_evaluate`` of the run on ``tasks`` (task names, or YAML tasks under ``include_path``)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    model = ZooLM(run, batch_size=batch_size, device=device)
    manager = None
    if include_path is not None:  # tasks all under include_path: lm-eval's thousands of built-ins not indexed
        manager = TaskManager(include_path=include_path, include_defaults=False)
    if manager is None or any(t not in manager.all_tasks for t in tasks):
        manager = TaskManager(include_path=include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ConfigError("--harness", ",".join(unknown), "lm-eval task names (lm-eval ls tasks; --include-path DIR)")
    try:
        return simple_evaluate(model=model, tasks=list(tasks), task_manager=manager, limit=limit)
    except ConnectionError as error:  # a task whose dataset is on the Hub, from a machine that cannot reach it
        why = f"its data could not be fetched ({error}): with no route to the Hub, the dataset must be in the Hugging "
        why += "Face cache (HF_DATASETS_OFFLINE=1), or the task a YAML file over local data under --include-path"
        raise ConfigError("--harness", ",".join(tasks), why) from None


def main() -> None:
    """lm-eval's command line with the ``zoo`` model registered."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    sys.exit(main())
