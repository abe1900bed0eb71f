"""Hugging Face ``transformers`` export and import: a zoo LanguageModel <-> a transformers causal LM.

Each family (``llama``: ``LlamaForCausalLM``; ``gpt2``: ``GPT2LMHeadModel``; ``smollm3``, ``gpt_oss``, ``deepseek_v3``,
``gemma3``, ``olmo_hybrid``, ``qwen3_next``: docs/architectures.md) is one module: the settings it holds,
its weight table (zoo keys, transformers keys and the layout between them, read both ways) and its config in each
direction (:mod:`zoo.models.hf.family`). A setting no family holds is refused by name before anything is written.
"""

from zoo.models.hf.export import FAMILIES, family_for, folded_weights, from_hf, to_hf, to_hf_model
from zoo.models.hf.family import Family, Holds

__all__ = ["FAMILIES", "Family", "Holds", "family_for", "folded_weights", "from_hf", "to_hf", "to_hf_model"]
