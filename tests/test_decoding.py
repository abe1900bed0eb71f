"""The KV cache and generation: preallocated in-place writes, sampling options, padding rules."""

from __future__ import annotations

import pytest
import torch

from zoo import ConfigError, KVCache, LayerState, MixerState
from zoo.models.generate import generate_tokens
from zoo.testing.combos import VOCAB, make_model

LLAMA = {"placement": "pre", "norm": "rmsnorm", "attn": "gqa", "pos": "rotary", "mlp": "swiglu"}


def kv(batch: int = 2, heads: int = 2, time: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, heads, time, 4), torch.randn(batch, heads, time, 4)


def test_cache_writes_in_place_into_preallocated_buffers():
    cache = KVCache(max_len=8)
    k1, v1 = kv(time=3)
    keys, values = cache.append(k1, v1)
    buffer = cache.k.data_ptr()
    assert cache.k.shape == (2, 2, 8, 4) and cache.length == 3 and keys.shape == (2, 2, 3, 4)
    k2, v2 = kv(time=1)
    keys, values = cache.append(k2, v2)
    assert cache.k.data_ptr() == buffer, "a write within capacity must not reallocate"
    torch.testing.assert_close(keys, torch.cat([k1, k2], dim=2), rtol=0, atol=0)
    torch.testing.assert_close(values, torch.cat([v1, v2], dim=2), rtol=0, atol=0)
    assert cache.nbytes == 2 * 2 * 2 * 8 * 4 * 4  # k and v, float32


def test_cache_grows_past_its_capacity_keeping_what_it_holds():
    cache = KVCache(max_len=2)
    chunks = [kv(time=2), kv(time=1), kv(time=3)]
    for k, v in chunks:
        keys, values = cache.append(k, v)
    assert cache.length == 6 and cache.capacity >= 6
    torch.testing.assert_close(keys, torch.cat([k for k, _ in chunks], dim=2), rtol=0, atol=0)
    torch.testing.assert_close(values, torch.cat([v for _, v in chunks], dim=2), rtol=0, atol=0)


def test_cache_reset_reuses_buffers_and_rejects_a_different_batch_midway():
    cache = KVCache(max_len=4)
    cache.append(*kv(batch=2))
    with pytest.raises(ValueError, match="reset"):
        cache.append(*kv(batch=3, time=1))
    cache.truncate(1)
    assert cache.length == 1
    with pytest.raises(ConfigError, match="length=2"):
        cache.truncate(2)
    cache.reset()
    cache.append(*kv(batch=3, time=1))  # a fresh start may change the batch
    assert cache.length == 1 and cache.k.shape[0] == 3
    with pytest.raises(ConfigError, match="max_len=0"):
        KVCache(max_len=0)


def test_generate_greedy_equals_argmax_of_the_full_forward():
    model = make_model(LLAMA)
    prompt = torch.randint(0, VOCAB, (2, 5))
    new = model.generate(prompt, 6)
    ids = prompt
    for _ in range(6):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(new, ids[:, 5:])
    assert torch.equal(model.generate(prompt, 6, use_cache=False), new)
    assert torch.equal(model.generate(prompt, 1), ids[:, 5:6])  # one step: the prompt's forward alone
    assert model.generate(prompt, 0).shape == (2, 0)


def test_the_token_loop_feeds_each_sampled_token_back_once_and_reads_no_logits_past_the_last():
    calls = []

    def next_logits(token: torch.Tensor | None, step: int) -> torch.Tensor:
        calls.append((None if token is None else token.tolist(), step))
        return torch.nn.functional.one_hot(torch.tensor([step + 3, step + 5]), 10).float()  # argmax: step + 3, + 5

    new = generate_tokens(next_logits, torch.zeros(2, 4, dtype=torch.long), 3, temperature=0.0, top_k=None)
    assert new.tolist() == [[3, 4, 5], [5, 6, 7]]
    assert calls == [(None, 0), ([3, 5], 1), ([4, 6], 2)]
    assert generate_tokens(next_logits, torch.zeros(2, 4, dtype=torch.long), 0, 0.0, None).shape == (2, 0)
    assert len(calls) == 3  # no step for no token


def test_sampling_is_reproducible_and_stays_in_the_top_k():
    model = make_model(LLAMA)
    prompt = torch.randint(0, VOCAB, (3, 4))

    def run(**kwargs):
        return model.generate(prompt, 8, generator=torch.Generator().manual_seed(1), **kwargs)

    assert torch.equal(run(temperature=1.0), run(temperature=1.0))
    assert torch.equal(run(temperature=1.0, top_k=1), model.generate(prompt, 8))
    assert not torch.equal(run(temperature=5.0), model.generate(prompt, 8)), "sampling never left greedy"
    tokens = run(temperature=1.0, top_k=3)
    ids = torch.cat([prompt, tokens], dim=1)
    top3 = model(ids)[:, 3:-1].topk(3, dim=-1).indices  # the top 3 before each new token
    assert (top3 == tokens[..., None]).any(-1).all()


def test_sampling_runs_without_gradients_and_leaves_the_model_trainable():
    model = make_model(LLAMA).train()
    tokens = model.eval().generate(torch.randint(0, VOCAB, (1, 3)), 2)
    model.train()
    model(tokens).sum().backward()  # generated ids are ordinary tensors
    assert model.embed.weight.grad is not None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_new_tokens": -1}, "max_new_tokens=-1"),
        ({"temperature": -0.5}, "temperature=-0.5"),
        ({"top_k": 0}, "top_k=0"),
        ({"prompt_ids": torch.zeros(4, dtype=torch.long)}, "prompt_ids=(4,)"),
        ({"prompt_ids": torch.zeros(1, 3)}, "prompt_ids=(1, 3)"),
        ({"key_mask": torch.tensor([[True, True, False]])}, "key_mask='right or inner padding'"),
        ({"key_mask": torch.tensor([[True, False, True]])}, "key_mask='right or inner padding'"),
        ({"key_mask": torch.ones(1, 2, dtype=torch.bool)}, "key_mask=(1, 2)"),
    ],
)
def test_bad_generate_arguments_name_the_argument(kwargs, field):
    model = make_model(LLAMA)
    args = {"prompt_ids": torch.zeros(1, 3, dtype=torch.long), "max_new_tokens": 2, **kwargs}
    with pytest.raises(ConfigError) as error:
        model.generate(**args)
    assert field in str(error.value), str(error.value)


def test_cached_decoding_with_per_sample_positions_equals_the_full_forward():
    model = make_model(LLAMA)
    ids = torch.randint(0, VOCAB, (2, 7))
    key_mask = torch.ones(2, 7, dtype=torch.bool)
    key_mask[0, :3] = False
    positions = (key_mask.cumsum(-1) - 1).clamp(min=0)
    full = model(ids, key_mask=key_mask, positions=positions)
    caches = model.new_caches(7)
    steps = [model(ids[:, :4], key_mask=key_mask[:, :4], positions=positions[:, :4], caches=caches)]
    for t in range(4, 7):
        steps.append(
            model(ids[:, t : t + 1], key_mask=key_mask[:, : t + 1], positions=positions[:, t : t + 1], caches=caches)
        )
    real = key_mask[..., None].expand_as(full)
    torch.testing.assert_close(torch.cat(steps, dim=1)[real], full[real], rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("top_k", [None, 4])
def test_sampling_draws_from_softmax_of_the_logits_over_the_temperature(top_k):
    """Replayed with the same generator, each new token is torch.multinomial over softmax(logits / T)
    of the full forward (restricted to the top k): the temperature scales the logits, nothing else."""
    model = make_model(LLAMA)
    prompt = torch.randint(0, VOCAB, (4, 3))
    samples = {}
    for temperature in (0.25, 1.0, 4.0):
        samples[temperature] = model.generate(prompt, 6, temperature, top_k, generator=torch.Generator().manual_seed(7))
        generator, ids = torch.Generator().manual_seed(7), prompt
        for _ in range(6):
            logits = model(ids)[:, -1].float() / temperature
            if top_k is not None:
                logits[logits < logits.topk(top_k).values[:, -1:]] = float("-inf")
            token = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
            ids = torch.cat([ids, token], dim=1)
        assert torch.equal(samples[temperature], ids[:, 3:]), temperature
    # The same random draws pick other tokens at other temperatures (else this test could not tell).
    assert not torch.equal(samples[0.25], samples[1.0]) and not torch.equal(samples[1.0], samples[4.0])


def test_cache_growth_keeps_the_positions_it_holds():
    cache = KVCache(max_len=2)
    positions = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
    for start, end in ((0, 2), (2, 3), (3, 6)):  # grows twice
        cache.append(*kv(time=end - start), positions=positions[:, start:end])
    assert cache.capacity >= 6
    assert torch.equal(cache.positions[:, : cache.length], positions)


@pytest.mark.parametrize("max_len", [7, 2], ids=["preallocated", "growing"])
@pytest.mark.parametrize("pos", ["none", "rotary", "alibi", "learned", "sinusoidal"])
def test_cached_logits_with_per_sample_positions_equal_the_full_forward_for_every_position(pos, max_len):
    """Logits, not greedy tokens: a cache that loses (or never keeps) per-sample positions changes
    ALiBi's distances by a few hundredths, which greedy decoding may not show."""
    model = make_model({**LLAMA, "pos": pos, "attn": "mha"})
    ids = torch.randint(0, VOCAB, (2, 7))
    key_mask = torch.ones(2, 7, dtype=torch.bool)
    key_mask[0, :3] = False
    positions = (key_mask.cumsum(-1) - 1).clamp(min=0)
    full = model(ids, key_mask=key_mask, positions=positions)
    caches = model.new_caches(max_len)
    steps = [model(ids[:, :3], key_mask=key_mask[:, :3], positions=positions[:, :3], caches=caches)]
    for t in range(3, 7):
        steps.append(
            model(ids[:, t : t + 1], key_mask=key_mask[:, : t + 1], positions=positions[:, t : t + 1], caches=caches)
        )
    real = key_mask[..., None].expand_as(full)
    torch.testing.assert_close(torch.cat(steps, dim=1)[real], full[real], rtol=0, atol=1e-10)


def test_a_layer_state_holds_the_state_its_mixer_makes_and_reports_it():
    layer = LayerState(max_len=8)
    assert layer.length == 0 and layer.nbytes == 0 and layer.mixer is None
    layer.truncate(0)  # nothing seen: rewinding to 0 is a no-op
    with pytest.raises(ConfigError, match="length=1"):
        layer.truncate(1)
    state = layer.mixer_state(KVCache)
    assert layer.mixer_state(KVCache) is state, "the state is made once, on first use"
    state.append(*kv(time=3))
    assert layer.length == 3 and layer.nbytes == state.nbytes == 2 * 2 * 2 * 8 * 4 * 4
    layer.cross = kv(time=5)
    assert layer.nbytes == state.nbytes + 2 * 2 * 2 * 5 * 4 * 4  # memory keys and values count too
    layer.truncate(1)
    assert layer.length == 1
    layer.reset()
    assert layer.length == 0 and layer.cross is None

    class Other(MixerState):
        nbytes = 0

    with pytest.raises(TypeError, match="holds a KVCache, not a Other"):
        layer.mixer_state(Other)


def test_the_model_gives_each_block_a_state_and_reads_only_the_interface():
    model = make_model(LLAMA)
    caches = model.new_caches(max_len=6)
    model(torch.randint(0, VOCAB, (2, 4)), caches=caches)
    assert [type(c.mixer) for c in caches] == [KVCache, KVCache]
    assert all(c.length == 4 and c.mixer.capacity == 6 for c in caches)
