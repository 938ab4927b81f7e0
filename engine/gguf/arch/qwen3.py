"""GGUF `qwen3` (Qwen3-Embedding, Qwen3-Reranker conversions) -> engine/families/qwen3.py's checkpoint keys.

Qwen3 is converted without llama's Q/K row permutation, so tensors map one to one.
"""
from __future__ import annotations

from typing import Any

from engine.gguf.arch import block_key

FAMILY = "qwen3"
CAUSAL = True

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    heads = int(meta[f"{arch}.attention.head_count"])
    hidden = int(meta[f"{arch}.embedding_length"])
    return {
        "model_type": "qwen3",
        "vocab_size": shapes["token_embd.weight"][0],
        "hidden_size": hidden,
        "num_hidden_layers": int(meta[f"{arch}.block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
        "intermediate_size": int(meta[f"{arch}.feed_forward_length"]),
        "rms_norm_eps": float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 1_000_000.0)),
        "max_position_embeddings": int(meta.get(f"{arch}.context_length", 32768)),
        "tie_word_embeddings": "output.weight" not in shapes,
    }


def key(name: str) -> str | None:
    return _GLOBAL.get(name) or block_key(name, _BLOCK, "model.layers.")
