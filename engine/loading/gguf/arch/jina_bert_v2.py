"""GGUF `jina-bert-v2` (llama.cpp's JinaBertModel conversion: jina-embeddings-v2-base-en / -de / -code, and the
jina-reranker-v1 files) -> engine/families/jina_bert.py's keys.

What llama.cpp reads (src/models/jina-bert-v2.cpp): no position table (ALiBi, max_bias 8), q/k/v, optional whole-row
q/k norms (`attn_q_norm`, `attn_k_norm`), `attn_norm_2` (jina-v2-code's second norm), and a feed-forward whose
`ffn_up` holds [gate; up] (GEGLU, current conversions), or `ffn_up` + `ffn_gate` (older conversions), or a plain
`ffn_up` of feed_forward_length rows (non-gated checkpoints). The variant is read off the tensors, as llama.cpp
reads it. A reranker (jina-reranker-v1-*) keeps its classifier as `cls` [1, n_embd] with no `cls.output`:
llama.cpp scores tanh(cls(h_[CLS])) (the checkpoint's pooler is dropped by the conversion).
"""
from __future__ import annotations

from typing import Any

from engine.loading.gguf.arch import bert, block_key

FAMILY = "jina_bert"
CAUSAL = False
RANK_TENSOR = "cls.weight"  # a file with this tensor is a reranker even without cls.output

# bert's names without the position table; its attention names; the feed-forward in the family's own names
_GLOBAL = {name: hf for name, hf in bert._GLOBAL.items() if name != "position_embd.weight"}
_BLOCK = {
    **{name: hf for name, hf in bert._BLOCK.items() if name.startswith("attn_")},
    "attn_q_norm": "attention.self.layer_norm_q",
    "attn_k_norm": "attention.self.layer_norm_k",
    "attn_norm_2": "layer_norm_1",
    "ffn_up": "mlp.up_layer",
    "ffn_gate": "mlp.gate_layer",
    "ffn_down": "mlp.wo",
    "layer_output_norm": "mlp.layernorm",
}


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """config.json's equivalent, from the keys llama.cpp reads; the variant flags from layer 0's tensors."""
    return {
        "model_type": "jina_bert",
        "vocab_size": shapes["token_embd.weight"][0],
        "hidden_size": int(meta[f"{arch}.embedding_length"]),
        "num_hidden_layers": int(meta[f"{arch}.block_count"]),
        "num_attention_heads": int(meta[f"{arch}.attention.head_count"]),
        "intermediate_size": int(meta[f"{arch}.feed_forward_length"]),
        "max_position_embeddings": int(meta.get(f"{arch}.context_length", 8192)),
        "type_vocab_size": shapes["token_types.weight"][0],
        "layer_norm_eps": float(meta[f"{arch}.attention.layer_norm_epsilon"]),
        "attention_bias": "blk.0.attn_q.bias" in shapes,
        "qk_norm": "blk.0.attn_q_norm.weight" in shapes,
        "second_attention_norm": "blk.0.attn_norm_2.weight" in shapes,
        "up_rows": shapes["blk.0.ffn_up.weight"][0],
        "separate_gate": "blk.0.ffn_gate.weight" in shapes,
        "up_bias": "blk.0.ffn_up.bias" in shapes,
    }


def key(name: str) -> str | None:
    return _GLOBAL.get(name) or block_key(name, _BLOCK, "encoder.layer.")
