"""gqa and mqa (softmax attention at 2 and 1 key/value heads), and the catalogue's entries for softmax attention's
options (docs/parts.md, below the ``attn`` table): each option's values, formula, FLOPs and reference, for the parts
that take it (zoo.parts.attention, zoo.parts.latent_attention)."""

from zoo.core.registry import ATTENTIONS
from zoo.parts.attention import Attention

# mha registers with the class (zoo.parts.attention); gqa and mqa are the same class at other n_kv_heads.
ATTENTIONS.register(
    "gqa",
    summary="Grouped-query attention: groups of query heads share a key/value head (default 2).",
    formula="as mha, query head h reads kv head h // (n_heads / n_kv_heads)",
    reference="Ainslie et al. 2023, GQA, arXiv:2305.13245",
    n_kv_heads=2,
)(Attention)
ATTENTIONS.register(
    "mqa",
    summary="Multi-query attention: every query head shares one key/value head.",
    formula="as mha with n_kv_heads = 1",
    reference="Shazeer 2019, Fast Transformer Decoding, arXiv:1911.02150",
    n_kv_heads=1,
)(Attention)

ATTENTIONS.document(
    "backend",
    values="sdpa, math, flex (the softmax attentions; the linear mixers take sdpa and math)",
    formula="one function, softmax(scale q k^T + mask) v, three kernels: sdpa torch's scaled_dot_product_attention "
    "with the mask as an additive float tensor; math explicit scores in at least float32 (the reference); flex "
    "torch's FlexAttention: causality, the window, padding and documents as one block mask (blocks of keys no query "
    "sees are skipped), ALiBi's bias and the soft-cap as score modifications, a sink as softmax(s) sigmoid(lse(s) - "
    "sink_h). flex on CUDA under torch.compile: one fused kernel, the path for windows and document masks; on CPU "
    "an unfused reference, forward only (no FlexAttention backward there), and no dropout",
    cost="none (the same FLOPs counted); flex's block mask skips the key blocks a window or a document hides",
    reference="Dong et al. 2024, Flex Attention: A Programming Model for Generating Optimized Attention Kernels, "
    "arXiv:2412.05496",
)
ATTENTIONS.document(
    "window",
    values="null, a positive integer below block.max_len",
    formula="query i sees keys j with i - window < j <= i, itself included (abs(i - j) < window in an encoder block)",
    cost="6 min(window, seq_len) n_heads d_head in place of softmax attention's 6 seq_len d_model",
    reference="Child et al. 2019, Generating Long Sequences with Sparse Transformers, arXiv:1904.10509; "
    "Beltagy et al. 2020, Longformer, arXiv:2004.05150",
)
ATTENTIONS.document(
    "head_dim",
    values="null (d_model / n_heads), a positive integer",
    formula="q, k, v: n_heads (n_kv_heads) heads of head_dim features each, out: n_heads head_dim -> d_model; the "
    "position part, the gate, the cache and value embeddings at that width; n_heads need not divide d_model; "
    "gated_deltanet: n_heads value heads of head_dim features (state (d_key, head_dim) per head, gate and out at that "
    "width: OLMo-Hybrid's and Qwen3-Next's linear_value_head_dim); kda: as gated_deltanet's, and the rank of its "
    "low-rank decay and output gates",
    cost="6 seq_len n_heads head_dim for scores and weighted values in place of 6 seq_len d_model; under param=mup a "
    "set head_dim stays fixed (qkv an output matrix, out an input one, the scores at their standard scale)",
    reference="Gemma Team 2025, Gemma 3 Technical Report, arXiv:2503.19786 (head_dim 256); Qwen3-Next; OLMo-Hybrid; "
    "OpenAI 2025, gpt-oss-120b & gpt-oss-20b Model Card, arXiv:2508.10925",
)
ATTENTIONS.document(
    "scale_dim",
    values="null (head_dim), a positive integer",
    formula="softmax(q k^T scale_dim^-0.5 + mask) in place of d_head^-0.5 (Gemma 3's query_pre_attn_scalar); under "
    "param=mup, μP's sqrt(d_head_base) / d_head times sqrt(d_head / scale_dim)",
    cost="none",
    reference="Gemma Team 2025, Gemma 3 Technical Report, arXiv:2503.19786",
)
ATTENTIONS.document(
    "qk_norm_scope",
    values="head, all_heads (with a qk_norm)",
    formula="head: q_h <- norm(q_h), k_g <- norm(k_g) over each head's d_head features; all_heads: [q_1 .. q_h] <- "
    "norm([q_1 .. q_h]) over n_heads d_head features, the keys over n_kv_heads d_head, before the position part",
    cost="no FLOPs counted (as every norm); gains of n_heads d_head and n_kv_heads d_head in place of 2 d_head; "
    "refused under tensor parallelism",
    reference="OLMo et al. 2024, 2 OLMo 2 Furious, arXiv:2501.00656 (OLMo 2 and 3, OLMo-Hybrid)",
)
ATTENTIONS.document(
    "gate",
    values="none, headwise, elementwise",
    formula="y_h -> y_h * sigmoid(x W_g + b_g)_h before out: one gate per head (headwise) or per feature "
    "(elementwise), x the attention's input",
    cost="6 g (d_model + 1) + 3 (n_heads d_head + g), g = n_heads (headwise) or n_heads d_head (elementwise) "
    "gates; no + 1 without block.bias",
    reference="Qiu et al. 2025, Gated Attention for Large Language Models, arXiv:2505.06708",
)
ATTENTIONS.document(
    "sink",
    values="none, learned",
    formula="weights_h = exp(s_j) / (exp(sink_h) + sum_j' exp(s_j')) = softmax(s) sigmoid(lse(s) - sink_h): "
    "a query may attend to nothing; on sdpa a zero key and value whose mask column is sink_h",
    cost="6 n_heads + 3 n_heads d_head",
    reference="OpenAI 2025, gpt-oss-120b & gpt-oss-20b Model Card, arXiv:2508.10925; Xiao et al. 2023, "
    "Efficient Streaming Language Models with Attention Sinks, arXiv:2309.17453",
)
ATTENTIONS.document(
    "xsa",
    values="false, true",
    formula="z_h,i = y_h,i - (y_h,i . v̂_h,i) v̂_h,i, v̂ = v / norm(v), v_h,i the head's own value at position i "
    "(its key/value head's under GQA); after the sink, before the gate",
    cost="3 (3 n_kv_heads + 4 n_heads) d_head; no parameter",
    reference="Exclusive self-attention (XSA), arXiv:2603.09078",
)
ATTENTIONS.document(
    "value_residual",
    values="none, learned, per_token",
    formula="in a stack, layer n > 0: v_n <- λ1 v_n + λ2 v_1 (learned: scalars per layer, init 0.5, 0.5), or "
    "(1 - w) v_n + w v_1, w = sigmoid(x W_r + b_r) per token and key/value head (per_token); v_1 layer 0's values "
    "(zoo.core.channel), before caching; layer 0 and a block alone unchanged",
    cost="9 n_kv_heads d_head (learned), 3 (3 n_kv_heads d_head + n_kv_heads) beyond W_r's (per_token); "
    "2 (learned) or (d_model + 1) n_kv_heads (per_token) parameters per layer after the first",
    reference="Zhou et al. 2024, Value Residual Learning For Alleviating Attention Concentration In "
    "Transformers (ResFormer), arXiv:2410.17897",
)
