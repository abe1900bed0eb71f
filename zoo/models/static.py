"""Decoding with static shapes: preallocated caches and one compiled step for every new token.

At batch 1 a decoding step reads every weight and the whole cache to produce one token, so its
time is set by memory bandwidth and, in eager mode, by Python and kernel-launch overhead. A step
whose shapes never change compiles once (``torch.compile``, ``fullgraph``) and, on CUDA, replays as
a CUDA graph (compile's ``reduce-overhead`` mode): the cache is written in place at a device-side
cursor and attention reads all ``max_len`` slots with the empty ones masked.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from zoo.core.errors import ConfigError
from zoo.core.interface import hook
from zoo.models.generate import check_generate_args, generate_tokens, padded_prompt
from zoo.models.language import LanguageModel
from zoo.parts.positions import LearnedEmbedding

#: step(token (b, 1), positions (b, 1), key_mask (b, max_len) or None) -> next-token logits (b, vocab)
Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


class StaticDecoder:
    """Generate from ``model`` through caches of ``max_len`` slots (prompt + new tokens at most).

    ``compile``: compile the one-token step (``fullgraph``, static shapes) with torch.compile's
    ``mode`` (default: ``reduce-overhead``, CUDA graphs, on CUDA; the default mode elsewhere) and
    ``backend`` (``aot_eager`` traces the same graph without generating code: quick checks). The
    prompt is read eagerly (its length varies); every later step runs the compiled graph, which is
    built on the first call and reused while the batch size stays. Tokens equal
    :meth:`LanguageModel.generate`'s.

        decoder = StaticDecoder(model, max_len=1024)
        new_ids = decoder.generate(prompt_ids, 128)
    """

    def __init__(
        self,
        model: LanguageModel,
        max_len: int,
        *,
        compile: bool = True,
        mode: str | None = None,
        backend: str = "inductor",
    ) -> None:
        if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 2:
            raise ConfigError("max_len", max_len, "must be an integer >= 2: prompt + new tokens")
        open_blocks = [i for i, block in enumerate(model.blocks) if not hook(block.attn, "causal")]
        if open_blocks:
            raise ConfigError("block.causal", False, f"must be true to decode: layers {open_blocks} see later tokens")
        if isinstance(model.pos_embed, LearnedEmbedding) and max_len > model.pos_embed.weight.shape[0]:
            table = model.pos_embed.weight.shape[0]
            raise ConfigError("max_len", max_len, f"must be <= block.max_len={table}: the learned positions' table")
        self.model = model
        self.max_len = max_len
        self.caches = model.new_caches(max_len, static=True)
        self.step: Step = self._step
        if compile:
            device = next(model.parameters()).device
            mode = mode if mode is not None else ("reduce-overhead" if device.type == "cuda" else None)
            torch._dynamo.config.capture_scalar_outputs = True  # MoE's per-expert token counts
            self.step = torch.compile(self._step, fullgraph=True, dynamic=False, mode=mode, backend=backend)

    def _step(self, token: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """One token per sequence against the caches: token, positions (b, 1) -> logits (b, vocab)."""
        h = self.model.hidden_states(token, key_mask=key_mask, caches=self.caches, positions=positions)
        return self.model.logits(h[:, -1])

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        *,
        key_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """As :meth:`LanguageModel.generate` (left-padded prompts with ``key_mask``); -> (b, max_new_tokens)."""
        check_generate_args(prompt_ids, max_new_tokens, temperature, top_k)
        batch, time = prompt_ids.shape
        if time + max_new_tokens > self.max_len:
            raise ConfigError(
                "max_new_tokens",
                max_new_tokens,
                f"must be <= {self.max_len - time}: the prompt's {time} tokens and the new ones "
                f"must fit max_len={self.max_len}",
            )
        # (b, t) and (b, max_len): generated tokens and empty slots count as real (the causal mask hides the latter)
        positions, full_mask = padded_prompt(prompt_ids, key_mask, self.max_len)
        if positions is None:
            positions = torch.arange(time, device=prompt_ids.device).expand(batch, time)
        for cache in self.caches:
            cache.reset()
        hidden = self.model.hidden_states(prompt_ids, key_mask=full_mask, caches=self.caches, positions=positions)
        last = positions[:, -1:]  # (b, 1): each row's last prompt position

        def next_logits(token: torch.Tensor | None, step: int) -> torch.Tensor:
            if token is None:
                return self.model.logits(hidden[:, -1])
            return self.step(token[:, None].contiguous(), last + step, full_mask)  # (b, 1) each

        return generate_tokens(next_logits, prompt_ids, max_new_tokens, temperature, top_k, generator)


__all__ = ["StaticDecoder"]
