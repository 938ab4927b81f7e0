"""GGUF `neo-bert` (llama.cpp's NeoBert conversion of chandar-lab/NeoBERT) -> engine/families/neobert.py's keys.

What llama.cpp reads (src/models/neo-bert.cpp): the token table, per layer `attn_norm`, the fused `attn_qkv`,
`attn_output`, `ffn_norm`, `ffn_up` (SwiGLU: [gate | up], 2 * feed_forward_length rows), `ffn_down`, and the final
`enc.output_norm`; RMSNorm at `layer_norm_rms_epsilon`, RoPE (NORM mode) on `rope.freq_base`. The converter writes
CLS pooling. A converted NeoBERTForSequenceClassification keeps `cls` (dense, tanh) and `cls.output`.
"""
from __future__ import annotations

from typing import Any

from engine.loading.gguf.arch import block_key

FAMILY = "neobert"
CAUSAL = False

_GLOBAL = {
    "token_embd.weight": "encoder.weight",
    "enc.output_norm.weight": "layer_norm.weight",
}
_BLOCK = {
    "attn_norm": "attention_norm",
    "attn_qkv": "qkv",
    "attn_output": "wo",
    "ffn_norm": "ffn_norm",
    "ffn_up": "ffn.w12",
    "ffn_down": "ffn.w3",
}


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """config.json's equivalent, from the keys llama.cpp reads."""
    return {
        "model_type": "neobert",
        "vocab_size": shapes["token_embd.weight"][0],
        "hidden_size": int(meta[f"{arch}.embedding_length"]),
        "num_hidden_layers": int(meta[f"{arch}.block_count"]),
        "num_attention_heads": int(meta[f"{arch}.attention.head_count"]),
        "ffn_size": int(meta[f"{arch}.feed_forward_length"]),
        "max_position_embeddings": int(meta.get(f"{arch}.context_length", 4096)),
        "norm_eps": float(meta[f"{arch}.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10_000.0)),
    }


def key(name: str) -> str | None:
    return _GLOBAL.get(name) or block_key(name, _BLOCK, "transformer_encoder.")
