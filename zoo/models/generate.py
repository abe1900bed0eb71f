"""Sampling and prompt handling shared by the decoder-only and the encoder-decoder models."""

from __future__ import annotations

from collections.abc import Callable

import torch

from zoo.core.errors import ConfigError

#: next_logits(token, step): logits (batch, vocab) for the next position; token is None at step 0.
NextLogits = Callable[[torch.Tensor | None, int], torch.Tensor]


def check_generate_args(
    ids: torch.Tensor, max_new_tokens: int, temperature: float, top_k: int | None, name: str = "prompt_ids"
) -> None:
    """Fail before any tensor work on ids that are not (batch, time) integers or bad sampling options."""
    if ids.ndim != 2 or ids.shape[1] < 1 or ids.is_floating_point():
        raise ConfigError(name, tuple(ids.shape), "must be (batch, time >= 1) integer token ids")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ConfigError("max_new_tokens", max_new_tokens, "must be an integer >= 0")
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or temperature < 0:
        raise ConfigError("temperature", temperature, "must be a number >= 0 (0: greedy)")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise ConfigError("top_k", top_k, "must be a positive integer or None (no cut)")


def left_padding_positions(key_mask: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Per-sample position ids (b, t) of a left-padded batch: each sequence's first real token is 0.

    key_mask: (b, t) bool, True at real tokens; every row must be False..False True..True.
    """
    if key_mask.shape != ids.shape:
        raise ConfigError("key_mask", tuple(key_mask.shape), f"must have the prompt's shape {tuple(ids.shape)}")
    mask = key_mask.bool()
    if not bool(mask[:, -1].all()) or bool((mask[:, 1:] < mask[:, :-1]).any()):
        raise ConfigError(
            "key_mask", "right or inner padding", "prompts must be left-padded: each row False...False True...True"
        )
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def padded_prompt(
    ids: torch.Tensor, key_mask: torch.Tensor | None, width: int
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A left-padded prompt's per-sample positions (b, t) and the key mask (b, width) of the prompt
    followed by ``width - t`` generated tokens, which are real; (None, None) when no token is padding."""
    if key_mask is None:
        return None, None
    positions = left_padding_positions(key_mask, ids)  # validates the mask
    if bool(key_mask.all()):
        return None, None  # no padding: the fast path with no mask at all
    full = torch.ones(ids.shape[0], width, dtype=torch.bool, device=ids.device)
    full[:, : ids.shape[1]] = key_mask
    return positions, full


def continued_positions(positions: torch.Tensor | None, max_new_tokens: int) -> torch.Tensor | None:
    """A prompt's per-sample positions (b, t) followed by those of ``max_new_tokens`` generated tokens,
    each row counting on from its last prompt position: (b, t + max_new_tokens); None stays None."""
    if positions is None:
        return None
    steps = torch.arange(1, max_new_tokens + 1, device=positions.device)
    return torch.cat([positions, positions[:, -1:] + steps], dim=1)


def sample(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """logits (b, vocab) -> token ids (b,): argmax when temperature is 0, else softmax(logits / T) over the top k."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (b, 1): the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)[:, 0]


def generate_tokens(
    next_logits: NextLogits,
    like: torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The token loop both models' ``generate`` run: ``max_new_tokens`` steps of ``next_logits``, each
    sampled token fed back; -> (b, max_new_tokens) token ids, with ``like``'s batch, dtype and device."""
    out = like.new_empty(like.shape[0], max_new_tokens)
    if max_new_tokens == 0:
        return out
    logits = next_logits(None, 0)
    for step in range(max_new_tokens):
        out[:, step] = sample(logits, temperature, top_k, generator)
        if step + 1 < max_new_tokens:
            logits = next_logits(out[:, step], step + 1)
    return out
