"""GGUF `llama` (LlamaForCausalLM, Mistral, SmolLM conversions) -> engine/families/llama.py's checkpoint keys.

llama.cpp's converter permutes the rows of q_proj and k_proj (interleaved rotary pairs instead of the HF
rotate-half layout); transform() puts them back so the family computes what it would on the original.
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx

from engine.loading.gguf.arch import block_key

FAMILY = "llama"
CAUSAL = True

GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def decoder_config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """What every decoder GGUF states the same way."""
    heads = int(meta[f"{arch}.attention.head_count"])
    hidden = int(meta[f"{arch}.embedding_length"])
    return {
        "model_type": arch,
        "vocab_size": shapes["token_embd.weight"][0],
        "hidden_size": hidden,
        "num_hidden_layers": int(meta[f"{arch}.block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
        "intermediate_size": int(meta[f"{arch}.feed_forward_length"]),
        "rms_norm_eps": float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(meta.get(f"{arch}.context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in shapes,
    }


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    out = decoder_config(meta, arch, shapes)
    out["rope_theta"] = float(meta.get(f"{arch}.rope.freq_base", 10_000.0))
    return out


def key(name: str) -> str | None:
    return GLOBAL.get(name) or block_key(name, BLOCK, "model.layers.")


def transform(name: str, weight: mx.array, config: dict[str, Any]) -> mx.array:
    """Undo the converter's q/k row permutation: per head, rows (pair, 2) -> (2, pair)."""
    if name.endswith((".attn_q.weight", ".attn_k.weight")):
        heads = config["num_attention_heads"] if ".attn_q." in name else config["num_key_value_heads"]
        rows = weight.shape[0]
        return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    return weight
