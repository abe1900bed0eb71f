"""``zoo-generate DIR PROMPT``: sample from a trained run (KV-cached), text in and out for bytes and
tokenizer runs, else token ids.

    zoo-generate runs/quick/pos=rotary,mlp=swiglu,seed=0 "def main(" --max-new-tokens 80 --temperature 0.8
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from zoo.core.errors import ConfigError
from zoo.lab.data.tokenizer import Codec


def main(argv: Sequence[str] | None = None) -> None:
    """``zoo-generate DIR PROMPT``: continue PROMPT with the run's model (KV-cached sampling)."""
    parser = argparse.ArgumentParser(
        prog="zoo-generate",
        description="Sample from a trained run: text in and out for bytes and tokenizer runs, else token ids.",
    )
    parser.add_argument("run", help="a run folder (or one of its checkpoints/step_<N> folders)")
    parser.add_argument("prompt", help="text (bytes or tokenizer runs) or token ids separated by spaces")
    parser.add_argument("--max-new-tokens", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy (argmax)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    parser.add_argument("--seed", type=int, default=0, help="the sampling generator's seed")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    import torch  # the arguments first: --help and a bad flag answer before torch loads

    from zoo.lab.finished.runs import load_codec, load_run
    from zoo.lab.planning.run_model import is_language_model
    from zoo.lab.planning.train_config import checked_device

    try:
        checked_device(args.device, cpu="--device=cpu")
        model, _ = load_run(args.run, args.device)
        is_language_model(model, "zoo-generate", " (an encoder-decoder run decodes its sources: zoo-eval scores it)")
        codec = load_codec(args.run)
        ids = codec.encode(args.prompt)
        if not ids:
            raise ConfigError("prompt", args.prompt, "at least one token")
        vocab = model.embed.num_embeddings
        if max(ids) >= vocab or min(ids) < 0:
            raise ConfigError("prompt", args.prompt, f"token ids in 0..{vocab - 1}")
        prompt = torch.tensor([ids], device=args.device)
        generator = torch.Generator(args.device).manual_seed(args.seed)
        new = model.generate(
            prompt, args.max_new_tokens, args.temperature, args.top_k, use_cache=True, generator=generator
        )
    except ConfigError as error:
        sys.exit(f"zoo-generate: {error}")
    print(continuation(codec, args.prompt, ids, new[0].tolist()))


def continuation(codec: Codec, prompt: str, ids: Sequence[int], new: Sequence[int]) -> str:
    """What zoo-generate prints: the prompt and its continuation as text (bytes: the prompt as typed;
    a tokenizer: prompt and new tokens decoded together, so no character is cut), else the new ids."""
    if codec.kind == "bytes":
        return prompt + codec.decode(new)
    if codec.kind == "tokenizer":
        return codec.decode([*ids, *new])
    return codec.decode(new)
