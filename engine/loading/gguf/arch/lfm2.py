"""GGUF `lfm2` (llama.cpp's Lfm2ForCausalLM, Lfm2Model and Lfm2BidirectionalModel conversions: LFM2 with
--embedding, LFM2.5-Embedding) -> engine/families/lfm2.py's checkpoint keys.

The converter writes `attention.head_count_kv` per layer, 0 on the short-convolution layers (that is the layer
pattern), the FFN width already sized (block_auto_adjust_ff_dim applied), the conv kernel as `shortconv.l_cache`
and the conv weight squeezed to [H, L]; `token_embd_norm` is LFM2's embedding_norm, which is its final norm. A
bidirectional checkpoint is marked `attention.causal` false: attention without the causal mask and the centered
convolution, as llama.cpp's non-causal lfm2 graph. sentence-transformers' Dense layer (`dense_2`, the ColBERT
exports) is refused by name: its per-token reading is not mapped here.
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from engine.errors import UnsupportedCheckpoint
from engine.families.lfm2 import CONV, FULL
from engine.loading.gguf.arch import block_key

FAMILY = "lfm2"
CAUSAL = True

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "token_embd_norm.weight": "model.embedding_norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attn_norm": "operator_norm",
    "ffn_norm": "ffn_norm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.out_proj",
    "attn_q_norm": "self_attn.q_layernorm",
    "attn_k_norm": "self_attn.k_layernorm",
    "ffn_gate": "feed_forward.w1",
    "ffn_up": "feed_forward.w3",
    "ffn_down": "feed_forward.w2",
}
_CONV = {"conv": "conv.conv", "in_proj": "conv.in_proj", "out_proj": "conv.out_proj"}


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """config.json's equivalent, from the keys llama.cpp reads."""
    if "dense_2.weight" in shapes:
        raise UnsupportedCheckpoint("an LFM2 GGUF with a Dense layer (dense_2: a ColBERT export) is not supported")
    layers = int(meta[f"{arch}.block_count"])
    heads = int(meta[f"{arch}.attention.head_count"])
    kv = meta.get(f"{arch}.attention.head_count_kv", heads)
    kv = [int(n) for n in np.asarray(kv).reshape(-1)]
    kv = kv * layers if len(kv) == 1 else kv
    if len(kv) != layers:
        raise UnsupportedCheckpoint(f"{arch}.attention.head_count_kv has {len(kv)} entries for {layers} layers")
    width = meta[f"{arch}.feed_forward_length"]
    if np.asarray(width).size != 1:
        raise UnsupportedCheckpoint(f"{arch}.feed_forward_length per layer is not supported")
    return {
        "model_type": "lfm2",
        "vocab_size": shapes["token_embd.weight"][0],
        "hidden_size": int(meta[f"{arch}.embedding_length"]),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": max(kv) or heads,
        "layer_types": [FULL if n else CONV for n in kv],
        "intermediate_size": int(np.asarray(width).reshape(-1)[0]),
        "block_auto_adjust_ff_dim": False,  # the converter wrote the sized width
        "norm_eps": float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "conv_L_cache": int(meta[f"{arch}.shortconv.l_cache"]),
        "conv_bias": any(name.startswith("blk.") and ".shortconv." in name and name.endswith(".bias")
                         for name in shapes),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10_000.0)),  # llama.cpp's default
        "max_position_embeddings": int(meta.get(f"{arch}.context_length", 128_000)),
        "is_causal": bool(meta.get(f"{arch}.attention.causal", True)),
    }


def key(name: str) -> str | None:
    if name in _GLOBAL:
        return _GLOBAL[name]
    parts = name.split(".")
    if len(parts) == 5 and parts[0] == "blk" and parts[2] == "shortconv" and parts[3] in _CONV:
        return f"model.layers.{parts[1]}.{_CONV[parts[3]]}.{parts[4]}"
    return block_key(name, _BLOCK, "model.layers.")


def transform(name: str, weight: mx.array, config: dict[str, Any]) -> mx.array:
    """The converter squeezed the depthwise conv weight [H, 1, L] to [H, L]: put the channel axis back."""
    if name.endswith(".shortconv.conv.weight") and weight.ndim == 2:
        return weight.reshape(weight.shape[0], 1, weight.shape[1])
    return weight
