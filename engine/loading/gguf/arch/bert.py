"""GGUF `bert` (llama.cpp's BertModel conversion) -> engine/families/bert.py's checkpoint keys."""
from __future__ import annotations

from typing import Any

from engine.loading.gguf.arch import block_key

FAMILY = "bert"
CAUSAL = False

_GLOBAL = {
    "token_embd.weight": "embeddings.word_embeddings.weight",
    "position_embd.weight": "embeddings.position_embeddings.weight",
    "token_types.weight": "embeddings.token_type_embeddings.weight",
    "token_embd_norm.weight": "embeddings.LayerNorm.weight",
    "token_embd_norm.bias": "embeddings.LayerNorm.bias",
}
_BLOCK = {
    "attn_q": "attention.self.query",
    "attn_k": "attention.self.key",
    "attn_v": "attention.self.value",
    "attn_output": "attention.output.dense",
    "attn_output_norm": "attention.output.LayerNorm",
    "ffn_up": "intermediate.dense",
    "ffn_down": "output.dense",
    "layer_output_norm": "output.LayerNorm",
}


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """config.json's equivalent from the metadata (table sizes from the tensors themselves)."""
    return {
        "model_type": "bert",
        "vocab_size": shapes["token_embd.weight"][0],
        "hidden_size": int(meta[f"{arch}.embedding_length"]),
        "num_hidden_layers": int(meta[f"{arch}.block_count"]),
        "num_attention_heads": int(meta[f"{arch}.attention.head_count"]),
        "intermediate_size": int(meta[f"{arch}.feed_forward_length"]),
        "max_position_embeddings": shapes["position_embd.weight"][0],
        "type_vocab_size": shapes["token_types.weight"][0] if "token_types.weight" in shapes else 1,
        "layer_norm_eps": float(meta.get(f"{arch}.attention.layer_norm_epsilon", 1e-12)),
        "hidden_act": "gelu",
    }


def key(name: str) -> str | None:
    """The checkpoint key of a trunk tensor; None for anything else (heads are read by name elsewhere)."""
    return _GLOBAL.get(name) or block_key(name, _BLOCK, "encoder.layer.")
