"""A decoder-only language model: token embedding, a stack of blocks, final norm, LM head."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from zoo.assembly.spec import BlockSpec, to_dict
from zoo.core import tp
from zoo.core.errors import ConfigError
from zoo.core.interface import hook
from zoo.core.registry import OptionDoc
from zoo.core.tp import Plan, prefixed
from zoo.models.base import TokenModel, init_stack, residual_branches, token_init_stds
from zoo.models.config import MODEL_DEFAULTS, block_section, layer_field, model_options, stack_specs
from zoo.models.generate import check_generate_args, continued_positions, generate_tokens, padded_prompt
from zoo.models.ngram import NGRAM_DOC, ROWS_PER_TOKEN, NgramEmbedding
from zoo.models.objectives import DEFAULT as OBJECTIVE_DEFAULT
from zoo.models.objectives import Objective, objective_entry
from zoo.models.smear_backout import BACKOUT_DOC, SMEAR_DOC, Smear
from zoo.models.stack import Stack
from zoo.parts.documents import Documents
from zoo.parts.state import LayerState, query_slots

#: The options of the ``model`` section that change a decoder-only model's computation outside its blocks, for the
#: catalogue (docs/parts.md, "Model options").
MODEL_OPTION_DOCS = (
    OptionDoc(
        "scale_embedding",
        values="false, true",
        formula="x = sqrt(d_model) E[ids], the factor rounded to the table's dtype first (Gemma's embed_scale)",
        cost="none counted (elementwise)",
        reference="Gemma Team 2024, Gemma: Open Models Based on Gemini Research and Technology, arXiv:2403.08295; "
        "Gemma 3 (Gemma3TextScaledWordEmbedding)",
    ),
    OptionDoc(
        "embedding_norm",
        values="false, true",
        formula="x = norm(x) after the scale, before absolute positions and the blocks: layer 0's block.norm with its "
        "options (parameter embedding_norm)",
        cost="none counted (as every norm); the norm's parameters count in 6 x parameters",
        reference="Karpathy 2025, nanochat (norm(wte(idx)))",
    ),
    OptionDoc(
        "logit_softcap",
        values="null, a number c > 0",
        formula="logits -> c tanh(logits / c), after μP's logit multiplier",
        cost="none counted (elementwise, as the attention's softcap)",
        reference="Gemma Team 2024, Gemma 2: Improving Open Language Models at a Practical Size, arXiv:2408.00118; "
        "nanochat",
    ),
    SMEAR_DOC,
    BACKOUT_DOC,
    NGRAM_DOC,
    OptionDoc(
        "kv_share",
        values="1, an integer k > 1",
        formula="layers in groups of k: layer i attends with the keys and values of layer i - i % k (cached ones "
        "included), which alone projects and caches them; the others project queries alone",
        cost="the later layers' key/value projections removed (parameters and their 6 FLOPs each); the cache holds "
        "one layer's keys and values per group",
        reference="Brandon et al. 2024, Reducing Transformer Key-Value Cache Size with Cross-Layer Attention, "
        "arXiv:2405.12981; Gemma 3n / Gemma 4 (shared KV cache layers)",
    ),
)


class LanguageModel(TokenModel, Stack):
    """Token ids (batch, time) -> next-token logits (batch, time, vocab): the token embedding, the
    :class:`zoo.models.stack.Stack` of blocks (positions, blocks, final norm), the LM head.

    Parameter names: ``embed``, ``embedding_norm`` (``model.embedding_norm``), ``pos_embed`` (``pos=learned`` only),
    ``blocks.{i}.*``, ``backout.scale`` (``model.backout``), ``final_norm``, ``smear.*`` (``model.smear``),
    ``ngram.table``, ``ngram.scales`` (``model.ngram``: counted apart, parameter_counts' ``ngram``)
    (when the last block's placement needs one), ``value_embeds.{i}`` (``model.value_embeddings``: a table
    per layer), ``head`` (absent when tied to the embedding), ``mtp.*``
    (``objective=mtp``'s extra heads, zoo.models.mtp: run in a training forward only, their logits taken by
    :meth:`take_future_logits`; the forward returns the next-token logits alone).
    Initialization: :func:`init_stack`; under ``pos=sinusoidal`` the token embedding is drawn with std
    d_model^-0.5 and scaled by sqrt(d_model) in the forward (:class:`zoo.parts.positions.SinusoidalEmbedding`).

    The token embedding, in order: the table's rows, times sqrt(d_model) under ``scale_embedding`` (Gemma's,
    the factor rounded to the rows' dtype as Gemma's is), then the norm of the first layer's ``block.norm`` under
    ``embedding_norm`` (nanochat's), then the stack (absolute positions, the blocks). Multi-token prediction's
    extra heads embed their tokens the same way. ``logit_softcap`` c: logits -> c tanh(logits / c) (Gemma 2's,
    nanochat's), after μP's logit multiplier. ``smear`` (modded-nanogpt's, nanochat's): each embedding plus a gated
    fraction of the previous token's, after the norm (:class:`zoo.models.smear_backout.Smear`); ``backout``
    (nanochat's): the last layer's output less a learned multiple of layer n_layers // 2's, before the final norm.
    ``ngram`` (modded-nanogpt's): each position's hashed n-gram row, times a learned scale per layer, added to the
    stream before every layer (:class:`zoo.models.ngram.NgramEmbedding`; one residual stream only).
    """

    def __init__(
        self,
        spec: BlockSpec | Sequence[BlockSpec],
        vocab_size: int,
        n_layers: int | None = None,
        tie_embeddings: bool = True,
        objective: Objective | None = None,
        value_embeddings: bool = False,
        logit_softcap: float | None = None,
        embedding_norm: bool = False,
        scale_embedding: bool = False,
        smear: bool = False,
        backout: bool = False,
        kv_share: int = 1,
        ngram: int | None = None,
        ngram_table: int | None = None,
        ngram_scale: float = 0.1,
    ) -> None:
        """spec: one BlockSpec repeated ``n_layers`` times, or one BlockSpec per layer; ``objective``: the
        training objective, whose extra heads (if any) the model owns (default: next-token prediction);
        ``value_embeddings``: a value embedding table per layer (``model.value_embeddings``, zoo.parts.values);
        ``logit_softcap``, ``embedding_norm``, ``scale_embedding``, ``smear``, ``backout``: as the class says;
        ``kv_share``: each group of that many layers attends with its first layer's keys and values
        (zoo.models.stack.share_kv); ``ngram`` (2, 3), ``ngram_table`` (rows; None: 5 x vocab_size), ``ngram_scale``
        (each layer's scale at init): the hashed n-gram table (zoo.models.ngram)."""
        specs = [spec] * (n_layers or 1) if isinstance(spec, BlockSpec) else list(spec)
        if n_layers is not None and len(specs) != n_layers:
            raise ConfigError("model.n_layers", n_layers, f"must match the {len(specs)} block specs given")
        if not specs or any(s.dims.d_model != specs[0].dims.d_model for s in specs):
            raise ConfigError("block.d_model", [s.dims.d_model for s in specs], "every layer needs the same d_model")
        d_model = specs[0].dims.d_model
        embed = nn.Embedding(vocab_size, d_model)
        super().__init__(specs, "model.layers", embed=embed, value_embeddings=value_embeddings, backout=backout,
                         kv_share=kv_share)  # fmt: skip
        self.embedding_norm = specs[0].make_norm() if embedding_norm else None
        self.embedding_scale = math.sqrt(d_model) if scale_embedding else None
        self.smear = Smear(d_model) if smear else None
        if ngram is not None and self.streams != 1:
            raise ConfigError("model.ngram", ngram, "null with block.residual=hyper, mhc or attnres: the table is "
                              "added to one residual stream")  # fmt: skip
        rows = ngram_table or ROWS_PER_TOKEN * vocab_size
        self.ngram = None if ngram is None else NgramEmbedding(ngram, rows, d_model, len(specs), ngram_scale)
        self.logit_softcap = logit_softcap
        self.head = None if tie_embeddings else nn.Linear(d_model, vocab_size, bias=False)
        objective = objective or objective_entry(None)
        self.mtp = objective.heads(specs[-1])  # None under next-token prediction
        #: The model's own settings under their config keys (its layers': ``specs``), for an export to read.
        self.settings: dict[str, Any] = {
            "model.tie_embeddings": tie_embeddings,
            "model.value_embeddings": value_embeddings,
            "model.logit_softcap": logit_softcap,
            "model.embedding_norm": embedding_norm,
            "model.scale_embedding": scale_embedding,
            "model.smear": smear,
            "model.backout": backout,
            "model.kv_share": kv_share,
            "model.ngram": ngram,
            "objective": objective.name,
        }
        self.reset_parameters()

    def default_settings(self) -> dict[str, Any]:
        """What each of :attr:`settings`' keys holds when a config leaves it out."""
        return {
            key: OBJECTIVE_DEFAULT if key == "objective" else MODEL_DEFAULTS[key.removeprefix("model.")]
            for key in self.settings
        }

    def reset_parameters(self, seed: int | None = None) -> None:
        """Re-draw every weight as documented in :func:`init_stack` (seed: default the last torch.manual_seed)."""
        init_stack(self, residual_branches(self.blocks), seed, token_init_stds(self.pos_embed))
        if self.ngram is not None:
            self.ngram.reset_parameters()  # the table at zeros, not init_stack's draw

    def forward(
        self,
        ids: torch.Tensor,
        *,
        key_mask: torch.Tensor | None = None,
        caches: list[LayerState] | None = None,
        positions: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ids: (b, t) -> logits (b, t, vocab).

        key_mask: (b, t_k) bool, True at real tokens (t_k counts cached tokens too).
        caches: one LayerState per block (:meth:`new_caches`), written in place.
        positions: (b, t) per-sample position ids (left-padded batches); default: cache slots, or with
        ``doc_ids`` each token's position inside its document.
        doc_ids: (b, t_k) integer document ids (t_k counts cached tokens too; ``task.doc_mask``): no token reads
        another document (:meth:`check_documents`, zoo.parts.documents), so a packed batch gives each document's
        logits as it alone would.
        With extra heads (``objective=mtp``), a training forward with gradients also keeps their logits for
        :meth:`take_future_logits`.
        """
        h = self.hidden_states(ids, key_mask=key_mask, caches=caches, positions=positions, doc_ids=doc_ids)
        if self.mtp is not None and caches is None and self.training and torch.is_grad_enabled():
            future = self.mtp(h, ids, self.embed_tokens)  # type: ignore[arg-type]
            self.__dict__["_future_logits"] = [self.logits(state) for state in future]
        return self.logits(h)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (b, t) -> the token embeddings (b, t, d_model) the stack reads: the table's rows, scaled by
        sqrt(d_model) (``scale_embedding``; the factor in the rows' dtype) and normed (``embedding_norm``)."""
        x = self.embed(ids)
        if self.embedding_scale is not None:
            x = x * x.new_tensor(self.embedding_scale)  # in the rows' dtype, as Gemma's embed_scale
        return x if self.embedding_norm is None else self.embedding_norm(x)

    def hidden_states(
        self,
        ids: torch.Tensor,
        *,
        key_mask: torch.Tensor | None = None,
        caches: list[LayerState] | None = None,
        positions: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ids: (b, t) -> the final-normed residual stream (b, t, d_model); arguments as in forward."""
        x = self.embed_tokens(ids)
        slots = query_slots(None if caches is None else caches[0].mixer, ids.shape[1], ids.device)  # the new tokens
        documents = None
        if doc_ids is not None:
            self.check_documents(caches)
            span = (ids.shape[0], int(slots[-1]) + 1)
            if doc_ids.shape != span:
                raise ValueError(f"doc_ids must be (batch, cached + new tokens) = {span}, got {tuple(doc_ids.shape)}")
            documents = Documents(doc_ids)
            positions = documents.positions(slots) if positions is None else positions
        real = None if key_mask is None else key_mask.index_select(1, slots).bool()
        first = None if caches is None else caches[0]
        if self.smear is not None:
            fresh = None if documents is None else documents.fresh(slots)  # a document's first token: nothing in
            x = self.smear(x, real, first, fresh)
        before_layer = None
        if self.ngram is not None:
            taps = None if documents is None else documents.taps(slots, self.ngram.order)  # its n tokens' documents
            ngram, rows = self.ngram, self.ngram(ids, real, first, taps)

            def before_layer(i: int, x: torch.Tensor) -> torch.Tensor:
                return ngram.added(i, x, rows)

        return Stack.forward(self, x, key_mask=key_mask, caches=caches, positions=positions, ids=ids,
                             documents=documents, before_layer=before_layer)  # fmt: skip

    def check_documents(self, caches: list[LayerState] | None = None) -> None:
        """Refuse document ids (``task.doc_mask``, a ConfigError naming it) where a layer's mixer states no reset at a
        document's boundary (its ``doc_reset`` hook, zoo.core.interface), with multi-token prediction's extra depths
        (they run without the boundaries), or with a static cache (``caches``)."""
        why = None
        for i, block in enumerate(self.blocks):
            if hook(block.attn, "doc_reset") is None:
                why = f"layer {i}'s attention ({type(block.attn).__name__}) states no reset at a document boundary"
                break
        if self.mtp is not None:
            why = "multi-token prediction's extra depths (objective=mtp) run without the document boundaries"
        if caches and caches[0].static:
            why = "a static cache (StaticDecoder) holds no document ids"
        if why is not None:
            raise ConfigError("task.doc_mask", True, f"false here: {why}")

    def tp_plan(self, sequence_parallel: bool = True) -> Plan:
        """The model's tensor-parallel plan (``parallelize_module`` over the ``tp`` mesh dimension): the
        embedding (and an untied head) split by vocabulary rows, the stack as :meth:`Stack.tp_plan` says
        (with ``sequence_parallel``, the stream is gathered whole after the final norm for the head)."""
        if self.smear is not None or self.ngram is not None:
            raise ValueError("the smear and the n-gram table have no tensor-parallel plan (model.smear, model.ngram: "
                             "refused under tp)")  # fmt: skip
        plan: Plan = {"embed": tp.RowwiseParallel(input_layouts=tp.Replicate(), output_layouts=tp.Replicate())}
        if self.embedding_norm is not None:  # on the whole (replicated) embedding output, before the stack cuts it
            plan.update(prefixed("embedding_norm", self.embedding_norm.tp_plan(False)))
        plan.update(super().tp_plan(sequence_parallel))
        if self.head is not None:
            plan["head"] = tp.ColwiseParallel()  # its weight only: logits() reads it directly
        return plan

    def new_caches(self, max_len: int | None = None, static: bool = False) -> list[LayerState]:
        """One empty decoding state per block (each mixer fills in its own kind); ``max_len`` (prompt +
        new tokens) lets growing states preallocate. ``static``: fixed shapes for compiled decoding
        (:class:`zoo.StaticDecoder`)."""
        return [LayerState(max_len, static) for _ in self.blocks]

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        *,
        key_mask: torch.Tensor | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue each prompt by ``max_new_tokens`` tokens; returns only the new ones, (b, max_new_tokens).

        temperature 0 is greedy (argmax); otherwise sample softmax(logits / temperature), restricted
        to the ``top_k`` largest logits when given. Prompts of different lengths go in one batch
        left-padded, with ``key_mask`` (b, t) True at real tokens: each row then generates what it
        would alone. ``use_cache=False`` recomputes the whole sequence at every step (for comparison).
        Runs without gradients; call ``eval()`` first so dropout is off.
        """
        check_generate_args(prompt_ids, max_new_tokens, temperature, top_k)
        batch, time = prompt_ids.shape
        total = time + max_new_tokens
        positions, full_mask = padded_prompt(prompt_ids, key_mask, total)  # (b, t), (b, prompt + new)
        full_positions = continued_positions(positions, max_new_tokens)  # (b, prompt + new)

        if use_cache:
            caches = self.new_caches(total)

            def next_logits(token: torch.Tensor | None, step: int) -> torch.Tensor:
                if token is None:  # prefill: the whole prompt at once
                    prompt_mask = None if full_mask is None else full_mask[:, :time]
                    h = self.hidden_states(prompt_ids, key_mask=prompt_mask, caches=caches, positions=positions)
                else:  # one token against the cache
                    end = time + step
                    h = self.hidden_states(
                        token[:, None],
                        key_mask=None if full_mask is None else full_mask[:, :end],
                        caches=caches,
                        positions=None if full_positions is None else full_positions[:, end - 1 : end],
                    )
                return self.logits(h[:, -1])

        else:
            ids = torch.cat([prompt_ids, prompt_ids.new_zeros(batch, max_new_tokens)], dim=1)

            def next_logits(token: torch.Tensor | None, step: int) -> torch.Tensor:
                end = time + step
                if token is not None:
                    ids[:, end - 1] = token
                h = self.hidden_states(
                    ids[:, :end],
                    key_mask=None if full_mask is None else full_mask[:, :end],
                    positions=None if full_positions is None else full_positions[:, :end],
                )
                return self.logits(h[:, -1])

        return generate_tokens(next_logits, prompt_ids, max_new_tokens, temperature, top_k, generator)

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token at context ``seq_len`` (:meth:`TokenModel.training_flops`); multi-token
        prediction's extra depths each count their parameters, their block's attention and the shared head's
        matmul, as if run over every token (depth j runs on seq_len - j)."""
        extra = 0 if self.mtp is None else len(self.mtp.depths)
        return self.training_flops(seq_len, attention_layers=len(self.blocks) + extra, heads=1 + extra)


def build_model(cfg: Mapping[str, Any] | DictConfig, *, specs: Sequence[BlockSpec] | None = None) -> LanguageModel:
    """A model from a config with a ``block`` section and a ``model`` section: ``vocab_size``,
    ``n_layers``, ``tie_embeddings``, ``value_embeddings``, ``logit_softcap``, ``embedding_norm``,
    ``scale_embedding``, ``kv_share``, ``pattern`` (block overrides repeated over the depth,
    ``[{attn: gated_deltanet}, {}]``) and ``layers`` (per-layer block overrides on top, ``{3: {attn: mqa}}``);
    an ``objective`` section (``objective=mtp``) adds its extra heads.
    ``specs``: the layers' specs already resolved from this config (:func:`zoo.models.config.layer_specs`)."""
    raw = to_dict(cfg)
    options = model_options(raw)
    block = block_section(raw)
    if specs is None:
        specs = stack_specs(block, options)
    for i, spec in enumerate(specs):
        if spec.dims.cross_attention:
            where = "block" if block.get("cross_attention") else layer_field(options, i)
            field = f"{where}.cross_attention"
            raise ConfigError(field, True, "a decoder-only model has no encoder memory; use zoo.build_seq2seq")
    objective = objective_entry(raw.get("objective"))  # objective=mtp: the extra heads (zoo.models.objectives)
    return LanguageModel(
        specs,
        options["vocab_size"],
        tie_embeddings=options["tie_embeddings"],
        objective=objective,
        value_embeddings=options["value_embeddings"],
        logit_softcap=options["logit_softcap"],
        embedding_norm=options["embedding_norm"],
        scale_embedding=options["scale_embedding"],
        smear=options["smear"],
        backout=options["backout"],
        kv_share=options["kv_share"],
        ngram=options["ngram"],
        ngram_table=options["ngram_table"],
        ngram_scale=options["ngram_scale"],
    )


__all__ = ["MODEL_OPTION_DOCS", "LanguageModel", "build_model"]
