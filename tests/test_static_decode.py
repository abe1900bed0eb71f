"""zoo.StaticDecoder: decoding over preallocated caches with one compiled step.

The contract (tests/test_contract.py) checks the uncompiled static step against the full forward
for every combination of parts; here: the step compiles as one graph for a pairwise covering set,
is never recompiled between steps or prompts, keeps its buffers' addresses, and refuses what it
cannot decode, naming the field.
"""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo import ConfigError, LayerState, MixerState, StaticDecoder
from zoo.testing.combos import VOCAB, combo_id, covering_combinations, every_part_once, make_model

EVERY_PART = every_part_once(covering_combinations())


@pytest.mark.slow
@pytest.mark.parametrize("start", range(0, len(EVERY_PART), 5), ids=lambda s: f"rows{s}")
def test_the_step_compiles_as_one_graph_and_generates_the_eager_tokens(start):
    # aot_eager captures the graph as inductor would (a graph break is an error under fullgraph)
    # without generating code; the inductor test below runs the generated code.
    for combo in EVERY_PART[start : start + 5]:
        torch._dynamo.reset()
        try:
            model = make_model(combo).eval()
        except (ConfigError, zoo.IncompatibleParts):
            continue
        prompt = torch.randint(0, VOCAB, (2, 3))
        decoder = StaticDecoder(model, max_len=8, backend="aot_eager")
        assert torch.equal(decoder.generate(prompt, 5), model.generate(prompt, 5)), combo_id(combo)


def mixed_model() -> zoo.LanguageModel:
    """The llama preset with one layer of each mixer family: softmax (GQA), latent, linear."""
    overrides = ["preset=llama", "block.d_model=64", "block.n_heads=4", "block.attn.n_kv_heads=2"]
    overrides += ["model.n_layers=3", "+model.layers.1.attn=mla", "+model.layers.2.attn=linear"]
    torch.manual_seed(0)
    return zoo.build_model(zoo.compose(overrides)).eval()


@pytest.mark.slow
def test_the_compiled_step_is_built_once_and_reused_for_every_prompt_and_step():
    model = mixed_model()
    decoder = StaticDecoder(model, max_len=32)
    prompt = torch.randint(0, 256, (2, 5))
    assert torch.equal(decoder.generate(prompt, 8), model.generate(prompt, 8))
    buffers = [t.data_ptr() for t in held_tensors(decoder)]
    with torch._dynamo.config.patch(error_on_recompile=True):  # a new shape or constant would recompile
        for time, new in [(9, 12), (1, 31)]:
            prompt = torch.randint(0, 256, (2, time))
            assert torch.equal(decoder.generate(prompt, new), model.generate(prompt, new))
    after = [t.data_ptr() for t in held_tensors(decoder)]
    assert after == buffers, "the caches moved: a CUDA graph would read stale memory"


def held_tensors(decoder: StaticDecoder) -> list[torch.Tensor]:
    """Every tensor the caches hold: buffers of growing states, matrices of recurrent ones, cursors."""
    held = []
    for cache in decoder.caches:
        held += getattr(cache.mixer, "buffers", None) or [cache.mixer.matrix]
        held.append(cache.mixer.cursor)
    return held


def test_a_static_state_counts_on_the_device_and_rewinds():
    state = LayerState(max_len=6, static=True).mixer_state(zoo.KVCache)
    k = torch.randn(1, 2, 3, 4)
    keys, _ = state.append(k, k)
    assert keys.shape[-2] == 6 and state.length == 3 and state.cursor is not None
    assert torch.equal(keys[..., :3, :], k) and not keys[..., 3:, :].any()  # empty slots are zeros
    state.append(k[..., :1, :], k[..., :1, :])
    assert state.length == 4
    state.truncate(2)
    assert state.length == 2 and int(state.cursor) == 2
    state.reset()
    assert state.length == 0


def test_what_cannot_decode_statically_is_refused_by_name():
    model = mixed_model()
    decoder = StaticDecoder(model, max_len=8, compile=False)
    with pytest.raises(ConfigError, match=r"max_new_tokens.*<= 3.*max_len=8"):
        decoder.generate(torch.zeros(1, 5, dtype=torch.long), 4)
    with pytest.raises(ConfigError, match="max_len"):
        StaticDecoder(model, max_len=1)
    with pytest.raises(ConfigError, match="max_len"):
        LayerState(static=True)
    learned = zoo.build_model(zoo.compose(["pos=learned", "block.max_len=16", "block.d_model=32", "block.n_heads=4"]))
    with pytest.raises(ConfigError, match=r"max_len.*block.max_len=16"):
        StaticDecoder(learned, max_len=17, compile=False)
    encoder = zoo.build_model(zoo.compose(["block.causal=false", "block.d_model=32", "block.n_heads=4"]))
    with pytest.raises(ConfigError, match="block.causal"):
        StaticDecoder(encoder, max_len=8, compile=False)

    class Fixed(MixerState):
        nbytes = 0

    with pytest.raises(ValueError, match="Fixed cannot run static"):
        LayerState(max_len=4, static=True).mixer_state(Fixed)
