"""GGUF `t5encoder` (llama.cpp's T5EncoderModel conversion: sentence-t5, gtr-t5, T5 encoders) ->
engine/families/t5.py's checkpoint keys.

The converter keeps the encoder only (`enc.blk.N.*`, `enc.output_norm`), the first block's relative position bias
(`attn_rel_b`, shared by every block as in T5), the bucket count (`attention.relative_buckets_count`; llama.cpp
fixes the maximum distance at 128) and the RMS epsilon. llama.cpp runs the feed-forward as ReLU when a block has no
`ffn_gate` and as gated GELU (ggml's tanh approximation, transformers' "gated-gelu") when it has one, whatever the
original `feed_forward_proj` said; the file is read the same way.

What the file cannot say, it is read as llama-server (commit 3f545bec) reads it, and the load logs that once: it has
no pooling type and no Dense layer (sentence-t5's mean pooling and `2_Dense` are dropped by the converter), so it
is pooled by `--pooling` (per-token vectors without it); and it has no `attention.causal` key, so llama.cpp's
default holds and llama-server runs the encoder with causal attention (it embeds through llama_decode, whose mask
follows that flag; only llama_encode forces the T5 encoder bidirectional). Its vectors are then not the T5
encoder's; a file with `t5encoder.attention.causal` false is read bidirectionally, by llama-server and here.
"""
from __future__ import annotations

import logging
from typing import Any

import mlx.core as mx

FAMILY = "t5"
CAUSAL = False

log = logging.getLogger(__name__)

_GLOBAL = {
    "token_embd.weight": "shared.weight",
    "enc.output_norm.weight": "encoder.final_layer_norm.weight",
    "output.weight": "lm_head.weight",  # an LM head, if a file keeps one: dropped by the family's sanitize()
}
_BLOCK = {
    "attn_norm": "layer.0.layer_norm",
    "attn_q": "layer.0.SelfAttention.q",
    "attn_k": "layer.0.SelfAttention.k",
    "attn_v": "layer.0.SelfAttention.v",
    "attn_o": "layer.0.SelfAttention.o",
    "ffn_norm": "layer.1.layer_norm",
    "ffn_gate": "layer.1.DenseReluDense.wi_0",
    "ffn_up": "layer.1.DenseReluDense.wi",  # wi_1 beside a gate (rename below)
    "ffn_down": "layer.1.DenseReluDense.wo",
    "attn_rel_b": "layer.0.SelfAttention.relative_attention_bias",  # block 0's only: T5 shares it
}


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """config.json's equivalent, from the keys llama.cpp reads."""
    heads = int(meta[f"{arch}.attention.head_count"])
    hidden = int(meta[f"{arch}.embedding_length"])
    causal = bool(meta.get(f"{arch}.attention.causal", True))  # llama.cpp's default when the key is absent
    if meta.get(f"{arch}.pooling_type") is None or causal:
        log.warning("a t5encoder GGUF is served as llama-server serves it: %s%s; its vectors are not the original "
                    "model's", "pooled by --pooling (the file has no pooling type, and the converter drops "
                    "sentence-t5's 2_Dense)" if meta.get(f"{arch}.pooling_type") is None else "",
                    "; with causal attention (the file has no t5encoder.attention.causal false, and llama-server "
                    "runs this graph causally without it)" if causal else "")
    return {
        "model_type": "t5",
        "vocab_size": shapes["token_embd.weight"][0],
        "d_model": hidden,
        "d_kv": int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
        "d_ff": int(meta[f"{arch}.feed_forward_length"]),
        "num_layers": int(meta[f"{arch}.block_count"]),
        "num_heads": heads,
        "relative_attention_num_buckets": int(meta[f"{arch}.attention.relative_buckets_count"]),
        "relative_attention_max_distance": 128,  # llama_relative_position_bucket's constant
        "layer_norm_epsilon": float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "feed_forward_proj": "gated-gelu" if any(n.endswith(".ffn_gate.weight") for n in shapes) else "relu",
        "n_positions": int(meta.get(f"{arch}.context_length", 512)),
        "is_causal": causal,
    }


def key(name: str) -> str | None:
    if name in _GLOBAL:
        return _GLOBAL[name]
    parts = name.split(".")
    if len(parts) != 5 or parts[:2] != ["enc", "blk"] or parts[3] not in _BLOCK:
        return None
    if parts[3] == "attn_rel_b" and parts[2] != "0":
        return None  # a per-block bias table (no T5 has one): refused by the loader as a tensor with no place
    return f"encoder.block.{parts[2]}.{_BLOCK[parts[3]]}.{parts[4]}"


def rename(weights: dict[str, mx.array], config: dict[str, Any]) -> dict[str, mx.array]:
    """Beside a gate, the up projection is T5's wi_1."""
    gated = config["feed_forward_proj"].startswith("gated-")
    return {k.replace(".DenseReluDense.wi.", ".DenseReluDense.wi_1.") if gated else k: v for k, v in weights.items()}
