"""Hugging Face export and import: same logits both ways, for every combination a transformers class expresses."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo import build_model, compose
from zoo.core.errors import ConfigError
from zoo.models.hf import FAMILIES, to_hf_model
from zoo.models.hf.weights import convert

transformers = pytest.importorskip("transformers")  # installed by .ci/run (the hf extra)

SMALL = ["block.d_model=32", "block.n_heads=4", "model.n_layers=2", "block.max_len=48"]
EXPORTABLE = {
    "llama (gqa, rmsnorm, rotary, swiglu, no bias, tied)": ["preset=llama"],
    "llama mha, bias, untied": ["preset=llama", "attn=mha", "block.bias=true", "model.tie_embeddings=false"],
    "llama mqa, geglu, rotary base": ["preset=llama", "attn=mqa", "mlp=geglu", "block.pos.base=500.0"],
    "llama reglu, rmsnorm eps": ["preset=llama", "mlp=reglu", "block.norm.eps=1e-5"],
    "gpt2 (layernorm, learned, exact gelu)": ["preset=gpt", "pos=learned"],
    "gpt2 relu2 untied d_ff": ["preset=gpt", "pos=learned", "mlp=relu2", "model.tie_embeddings=false", "block.d_ff=40"],
    "gpt2 relu, layernorm eps": ["preset=gpt", "pos=learned", "mlp=relu", "block.norm.eps=1e-6"],
}
CLASSES = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}


def perturbed(overrides: list[str]) -> zoo.LanguageModel:
    """A random model whose norm gains and biases are not at their init values (so a swapped one shows)."""
    torch.manual_seed(0)
    model = build_model(compose([*overrides, *SMALL])).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


IDS = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("overrides", list(EXPORTABLE.values()), ids=list(EXPORTABLE))
def test_export_then_import_keeps_the_logits(overrides, tmp_path):
    model = perturbed(overrides)
    zoo.to_hf(model, tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    expected = "GPT2LMHeadModel" if "preset=gpt" in overrides else "LlamaForCausalLM"
    assert type(theirs).__name__ == expected
    back = zoo.from_hf(tmp_path)
    with torch.no_grad():
        mine = model(IDS)
        torch.testing.assert_close(theirs(IDS).logits, mine, rtol=1e-5, atol=1e-5)
        assert torch.equal(back(IDS), mine)  # the same weights, in the same layout: bit for bit


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_import_of_a_transformers_model_keeps_its_logits(kind):
    # A randomly initialized transformers model (not one zoo wrote): GQA with 2 kv heads, bias, untied.
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, attention_bias=True, mlp_bias=True, tie_word_embeddings=False, rope_theta=1000.0,
        )  # fmt: skip
    else:
        config = transformers.GPT2Config(
            vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=48, activation_function="gelu"
        )
    torch.manual_seed(0)
    theirs = getattr(transformers, CLASSES[kind])(config).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model = zoo.from_hf(theirs)
    ids = IDS % 96
    with torch.no_grad():
        torch.testing.assert_close(model(ids), theirs(ids).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "field", "part"),
    [
        (["preset=llama", "placement=post"], "block.placement='post'", "LlamaForCausalLM (llama), needs pre-norm"),
        (["preset=llama", "norm=scalenorm"], "block.norm='scalenorm'", "needs RMSNorm"),
        (["preset=llama", "pos=alibi"], "block.pos='alibi'", "needs rotary positions"),
        (["preset=llama", "block.pos.rotary_fraction=0.5"], "block.pos.rotary_fraction=0.5", "whole head"),
        (["preset=llama", "block.attn.qk_norm=rmsnorm"], "block.attn.qk_norm='rmsnorm'", "qk_norm='none'"),
        (["preset=gpt", "pos=learned", "attn=gqa"], "block.attn='gqa'", "GPT2LMHeadModel (gpt2), needs multi-head"),
        (["preset=gpt", "pos=learned", "block.bias=false"], "block.bias=False", "biases everywhere"),
        (["preset=gpt", "pos=sinusoidal"], "block.pos='sinusoidal'", "needs learned absolute positions"),
        (["preset=llama", "block.attn.window=8"], "block.attn.window=8", "needs block.attn.window=None"),
        (["preset=llama", "block.attn.xsa=true"], "block.attn.xsa=True", "needs block.attn.xsa=False"),
        (["preset=llama", "block.attn.gate=headwise"], "block.attn.gate='headwise'", "needs block.attn.gate='none'"),
        (["preset=llama", "block.attn.sink=learned"], "block.attn.sink='learned'", "needs block.attn.sink='none'"),
    ],
)
def test_a_combination_no_class_expresses_names_its_part(overrides, field, part, tmp_path):
    with pytest.raises(ConfigError, match="no transformers class has a counterpart") as error:
        zoo.to_hf(perturbed(overrides), tmp_path)
    assert str(error.value).startswith(field) and part in str(error.value), str(error.value)
    assert not any(tmp_path.iterdir())  # nothing written


def test_mixed_layers_are_refused(tmp_path):
    mixed = build_model(compose(["preset=llama", *SMALL, "+model.layers.1.attn=mha"]))
    with pytest.raises(ConfigError, match=r"model.layers.1.attn='mha': .* needs every layer alike in block.attn"):
        zoo.to_hf(mixed, tmp_path)


def test_gpt2s_gelu_new_imports_as_the_tanh_approximation_and_exports_as_pytorchs():
    """GPT-2's default activation (gelu_new, GELU's tanh approximation written out) comes in as mlp=gelu with
    approximate=tanh, with GPT-2's logits; it goes out as gelu_pytorch_tanh, the kernel zoo computes with."""
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=64)).eval()
    assert gpt2.config.activation_function == "gelu_new"
    model = zoo.from_hf(gpt2)
    assert model.blocks[0].mlp.approximate == "tanh"
    ids = IDS[:, :16] % 64
    with torch.no_grad():
        torch.testing.assert_close(model(ids), gpt2(ids).logits, rtol=1e-5, atol=1e-5)
        back = to_hf_model(model)
        assert back.config.activation_function == "gelu_pytorch_tanh"
        torch.testing.assert_close(back(ids).logits, model(ids), rtol=1e-5, atol=1e-5)


def test_a_run_folder_exports(tmp_path):
    from helpers import tiny

    from zoo.lab.training.run import run

    summary = run(tiny("preset=llama"), tmp_path / "run")
    zoo.to_hf(tmp_path / "run", tmp_path / "hf")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    model, config = zoo.load_run(tmp_path / "run")
    assert config == summary["config"]
    with torch.no_grad():
        torch.testing.assert_close(theirs(IDS[:, :32]).logits, model(IDS[:, :32]), rtol=1e-5, atol=1e-5)


#: Per family, exportable models that between them hold every parameter its table maps.
COVERING = {
    "llama": [
        EXPORTABLE["llama (gqa, rmsnorm, rotary, swiglu, no bias, tied)"],
        EXPORTABLE["llama mha, bias, untied"],
    ],
    "gpt2": [EXPORTABLE["gpt2 (layernorm, learned, exact gelu)"], EXPORTABLE["gpt2 relu2 untied d_ff"]],
    "smollm3": [["preset=smollm3", "model.pattern=[{},{pos: none}]"],
                ["preset=smollm3", "model.pattern=[{},{pos: none}]", "block.bias=true", "model.tie_embeddings=false"]],
    "gpt_oss": [["preset=gpt_oss"]],  # untied; sinks, biases, router and experts on every layer
    "deepseek_v3": [["preset=deepseek_v3"], ["preset=deepseek_v3", "block.attn.q_rank=null"]],
    "gemma3": [["preset=gemma3", "model.pattern=[{attn: {window: 3}, pos: {base: 100.0}},{}]"],
               ["preset=gemma3", "model.pattern=[]", "model.tie_embeddings=false"]],
    "olmo_hybrid": [
        ["preset=olmo_hybrid", "model.pattern=[{placement: pre, pos: none, attn: {name: gated_deltanet}},{}]"],
        ["preset=olmo_hybrid", "model.tie_embeddings=true", "model.pattern=[{placement: pre, pos: none, "
         "attn: {name: gated_deltanet}},{}]"],
    ],
    "qwen3_next": [["preset=qwen3_next", "model.pattern=[{n_heads: 8, pos: none, attn: {name: gated_deltanet, "
                    "n_key_heads: 4, d_key: 8, head_dim: 8, norm_eps: 1.0e-06}}, {mlp: swiglu, d_ff: 48}]"]],
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_table_maps_every_key_of_both_sides_and_every_entry_is_used(name):
    table, used = FAMILIES[name].weights, set()
    for overrides in COVERING[name]:
        model = perturbed(overrides)
        theirs, geometries = to_hf_model(model), FAMILIES[name].geometries(model)
        state = theirs.state_dict()  # parameters, and persistent buffers (a router's bias)
        hf_keys = [k for k, _ in [*theirs.named_parameters(), *theirs.named_buffers()] if k in state]
        for side, keys in (("zoo", list(model.state_dict())), ("hf", hf_keys)):
            for key in keys:
                entries = [i for i, entry in enumerate(table) if (found := entry.match(side, key)) is not None
                           and entry.applies(geometries[int(found.get("i", 0))])]  # fmt: skip
                assert len(entries) == 1, f"{side} key {key} is mapped by {len(entries)} entries of {name}'s table"
                used.add((side, entries[0]))
    assert used == {(side, i) for i in range(len(table)) for side in ("zoo", "hf")}


def test_a_key_no_entry_maps_is_refused_by_name():
    model = perturbed(EXPORTABLE["llama (gqa, rmsnorm, rotary, swiglu, no bias, tied)"])
    llama = FAMILIES["llama"]
    table, geometries = llama.weights, llama.geometries(model)
    weights = {**model.state_dict(), "blocks.0.attn.q_norm.weight": torch.ones(8)}
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.q_norm\.weight: no entry of LlamaForCausalLM \(llama\)'s"):
        convert(weights, table, geometries, to="hf", name=llama.title)
    hf = convert(model.state_dict(), table, geometries, to="hf")
    del hf["model.layers.1.self_attn.k_proj.weight"]
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight: missing"):
        convert(hf, table, geometries, to="zoo")
    with pytest.raises(ConfigError, match=r"^to='back': hf"):
        convert(hf, table, geometries, to="back")
