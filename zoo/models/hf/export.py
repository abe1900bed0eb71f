"""Export a zoo LanguageModel to a transformers causal LM, and import one back.

Which family a model exports to is decided by its settings alone (:class:`zoo.models.hf.family.Family`): the
first family that holds every setting of every layer, else a ConfigError naming the first setting the nearest
family cannot hold, before anything is written. A model under μP (zoo.assembly.mup) exports with its score and
logit multipliers folded into the weights (:func:`folded_weights`). ``transformers`` is imported only inside
these functions (the ``hf`` extra); nothing is downloaded.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from zoo.core.errors import ConfigError
from zoo.models.hf.deepseek_v3 import DEEPSEEK_V3
from zoo.models.hf.family import Family, model_settings, refused, transformers_module
from zoo.models.hf.gemma3 import GEMMA3
from zoo.models.hf.gpt2 import GPT2
from zoo.models.hf.gpt_oss import GPT_OSS
from zoo.models.hf.llama import LLAMA
from zoo.models.hf.olmo_hybrid import OLMO_HYBRID
from zoo.models.hf.qwen3_next import QWEN3_NEXT
from zoo.models.hf.smollm3 import SMOLLM3
from zoo.models.hf.weights import convert
from zoo.models.language import LanguageModel, build_model
from zoo.parts.attention import fuse_qkv, split_qkv

#: Every family zoo exports to and imports from, by name, in the order an export tries them.
FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (LLAMA, GPT2, SMOLLM3, GPT_OSS, DEEPSEEK_V3, GEMMA3, OLMO_HYBRID, QWEN3_NEXT)
}


def family_for(model: LanguageModel, family: str | None = None) -> Family:
    """The family that holds every setting of ``model`` (``family``: that one, by name); else a ConfigError
    naming the first setting the nearest (or the named) family cannot hold, and what it needs instead."""
    if not isinstance(model, LanguageModel):
        raise ConfigError("model", type(model).__name__, "a zoo LanguageModel (decoder-only)")
    if family is not None and family not in FAMILIES:
        raise ConfigError("family", family, f"one of {', '.join(FAMILIES)}")
    candidates = [FAMILIES[family]] if family is not None else list(FAMILIES.values())
    refusals = {candidate.name: candidate.refusals(model) for candidate in candidates}
    nearest = min(candidates, key=lambda candidate: len(refusals[candidate.name]))
    if refusals[nearest.name]:
        raise refused(refusals[nearest.name][0], nearest, named=family is not None)
    return nearest


def folded_weights(model: LanguageModel) -> dict[str, torch.Tensor]:
    """``model``'s state dict (float32, detached copies) with the forward-time multipliers μP sets
    (zoo.assembly.mup.apply) folded into the weights, so a transformers class computes the same logits:

    - an attention's ``score_scale`` s (q . k x s instead of 1 / sqrt(d_head)): the query rows of
      ``attn.qkv`` (weight and bias) x s sqrt(d_head), which the standard 1 / sqrt(d_head) brings back
      to s (rotary rotates each position's query linearly, so it commutes with the factor); under a
      qk-norm, its query norm's output x that factor instead (:func:`scaled_gain`);
    - the ``logit_scale`` m: the head x m; a tied head becomes an untied ``head.weight`` = m x the
      embedding (the input embedding unchanged).

    The rest of what μP sets is in the weights already (the init factors) or read only by the optimizer
    (``model.mup``). Multi-token prediction's extra heads (``mtp.*``) train beside the next-token head and
    predict nothing at inference: left out. ``model`` itself is not changed."""
    weights = {k: v.detach().float().clone() for k, v in model.state_dict().items() if not k.startswith("mtp.")}
    for i, block in enumerate(model.blocks):
        scale = getattr(block.attn, "score_scale", None)  # a mixer without scores (Gated DeltaNet) has none
        if scale is None:
            continue
        factor = scale * math.sqrt(block.attn.d_head)
        q_norm = getattr(block.attn, "q_norm", None)
        if q_norm is not None:  # the queries are normalized after qkv: the factor goes on the norm's gain instead
            weights.update(scaled_gain(weights, f"blocks.{i}.attn.q_norm", q_norm, factor))
            continue
        for p in ("weight", "bias"):
            if (key := f"blocks.{i}.attn.qkv.{p}") in weights:
                q, k, v = split_qkv(weights[key], block.attn.n_heads, block.attn.n_kv_heads)
                weights[key] = fuse_qkv(q * factor, k, v, block.attn.n_kv_heads)
    logit_scale = model.logit_scale
    if logit_scale is not None and logit_scale != 1.0:
        head = weights.get("head.weight", weights["embed.weight"])
        weights["head.weight"] = head * logit_scale
    return weights


def scaled_gain(
    weights: dict[str, torch.Tensor], prefix: str, norm: nn.Module, factor: float
) -> dict[str, torch.Tensor]:
    """The norm at ``prefix``'s weight and bias with its output times ``factor`` (a zero-centred gain 1 + w: w becomes
    (1 + w) factor - 1)."""
    scaled = {}
    if f"{prefix}.weight" in weights:
        w = weights[f"{prefix}.weight"]
        scaled[f"{prefix}.weight"] = (1 + w) * factor - 1 if getattr(norm, "zero_centred", False) else w * factor
    if f"{prefix}.bias" in weights:
        scaled[f"{prefix}.bias"] = weights[f"{prefix}.bias"] * factor
    return scaled


def to_hf_model(model: LanguageModel, family: str | None = None) -> nn.Module:
    """A transformers model (float32, eval mode) computing the same logits as ``model``, of the family that
    holds it (``family``: that one, by name), μP's multipliers folded into its weights (:func:`folded_weights`;
    a tied head under a logit multiplier is exported untied). A setting no family holds is refused by name."""
    chosen = family_for(model, family)
    transformers = transformers_module()
    zoo_weights = folded_weights(model)
    tied = "head.weight" not in zoo_weights
    layers, _ = model_settings(model)
    hf_model = getattr(transformers, chosen.hf_class)(chosen.hf_config(model, layers, tied))
    weights = convert(zoo_weights, chosen.weights, chosen.geometries(model), to="hf", name=chosen.title)
    missing, unexpected = hf_model.load_state_dict({k: v.contiguous() for k, v in weights.items()}, strict=False)
    assert not unexpected and set(missing) <= ({"lm_head.weight"} if tied else set()), (missing, unexpected)
    if tied:
        hf_model.tie_weights()
    return hf_model.float().eval()


def to_hf(model: LanguageModel, out_dir: str | Path, family: str | None = None) -> Path:
    """Write ``model`` as a transformers checkpoint (config.json + model.safetensors) in ``out_dir``;
    ``AutoModelForCausalLM.from_pretrained(out_dir)`` then computes the same logits. A model no family holds
    (or ``family`` does not) is refused by name before anything is written."""
    out = Path(out_dir)
    to_hf_model(model, family).save_pretrained(out)
    return out


def from_hf(source: str | Path | nn.Module) -> LanguageModel:
    """A zoo LanguageModel from a transformers model of a family zoo converts: a local checkpoint folder
    (nothing is downloaded) or a loaded model. Same logits as the source, in float32, eval mode."""
    transformers = transformers_module()
    if isinstance(source, nn.Module):
        hf_model = source
    else:
        folder = Path(source)
        if not (folder / "config.json").exists():
            raise ConfigError("source", str(source), "a local folder holding a transformers checkpoint (config.json)")
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    kind = getattr(hf_model.config, "model_type", None)
    family = next((f for f in FAMILIES.values() if f.model_type == kind), None)
    if family is None:
        raise ConfigError("model_type", kind, f"one of {', '.join(f.model_type for f in FAMILIES.values())} "
                          "(the transformers families zoo converts)")  # fmt: skip
    model = build_model(family.zoo_config(hf_model.config))
    weights = {k: v.detach().float() for k, v in hf_model.named_parameters()}  # a tied head once, as the embedding
    persistent = hf_model.state_dict()  # and each saved buffer the table maps (a router's bias)
    buffers = {k: v for k, v in hf_model.named_buffers() if k in persistent}
    weights.update({k: v.detach().float() for k, v in buffers.items() if any(e.match("hf", k) for e in family.weights)})
    model.load_state_dict(convert(weights, family.weights, family.geometries(model), to="zoo", name=family.title))
    return model.eval()  # parameters float32 as built (.float() would also cast rotary's float64 buffer)
