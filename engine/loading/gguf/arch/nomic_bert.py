"""GGUF `nomic-bert` (nomic-embed-text v1/v1.5 conversions) -> engine/families/nomic_bert.py's checkpoint keys."""
from __future__ import annotations

from typing import Any

from engine.loading.gguf.arch import block_key

FAMILY = "nomic_bert"
CAUSAL = False

_GLOBAL = {
    "token_embd.weight": "embeddings.word_embeddings.weight",
    "token_types.weight": "embeddings.token_type_embeddings.weight",
    "token_embd_norm.weight": "emb_ln.weight",
    "token_embd_norm.bias": "emb_ln.bias",
}
_BLOCK = {
    "attn_qkv": "attn.Wqkv",
    "attn_output": "attn.out_proj",
    "attn_output_norm": "norm1",
    "ffn_up": "mlp.fc11",
    "ffn_gate": "mlp.fc12",
    "ffn_down": "mlp.fc2",
    "layer_output_norm": "norm2",
}


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """The hub's config.json names; llama.cpp runs every nomic-bert with SwiGLU and whole-head rotary."""
    return {
        "model_type": "nomic_bert",
        "vocab_size": shapes["token_embd.weight"][0],
        "n_embd": int(meta[f"{arch}.embedding_length"]),
        "n_head": int(meta[f"{arch}.attention.head_count"]),
        "n_layer": int(meta[f"{arch}.block_count"]),
        "n_inner": int(meta[f"{arch}.feed_forward_length"]),
        "n_positions": int(meta[f"{arch}.context_length"]),
        "layer_norm_epsilon": float(meta.get(f"{arch}.attention.layer_norm_epsilon", 1e-12)),
        "type_vocab_size": shapes["token_types.weight"][0] if "token_types.weight" in shapes else 0,
        "activation_function": "swiglu",
        "rotary_emb_fraction": 1.0,
        "rotary_emb_base": float(meta.get(f"{arch}.rope.freq_base", 10_000.0)),
        "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False,
    }


def key(name: str) -> str | None:
    return _GLOBAL.get(name) or block_key(name, _BLOCK, "encoder.layers.")
