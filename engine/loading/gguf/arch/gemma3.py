"""GGUF `gemma3` (Gemma 3 text decoders) -> engine/families/gemma3_text.py's checkpoint keys.

llama.cpp's converter stores every Gemma RMSNorm weight as 1 + w (ggml multiplies by the weight itself);
transform() takes the 1 back off. Its Gemma 3 rules: every 6th layer global, local layers on rope base
10000, and attention scaled by 1/sqrt(head_dim) except on the 62-layer 27B (1/sqrt(hidden / heads)).
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx

from engine.loading.gguf.arch import block_key
from engine.loading.gguf.arch.llama import BLOCK as LLAMA_BLOCK
from engine.loading.gguf.arch.llama import GLOBAL, decoder_config

FAMILY = "gemma3_text"
CAUSAL = True

_BLOCK = {**LLAMA_BLOCK, "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
          "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
          "post_ffw_norm": "post_feedforward_layernorm"}


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    out = decoder_config(meta, arch, shapes)
    heads, hidden, layers = out["num_attention_heads"], out["hidden_size"], out["num_hidden_layers"]
    out.update(
        model_type="gemma3_text",
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 1_000_000.0)),
        rope_local_base_freq=10_000.0,
        sliding_window=int(meta.get(f"{arch}.attention.sliding_window", 4096)),
        sliding_window_pattern=6,
        query_pre_attn_scalar=hidden // heads if layers == 62 else out["head_dim"],
        hidden_activation="gelu_pytorch_tanh",
    )
    if meta.get(f"{arch}.rope.scaling.type") == "linear":
        out["rope_scaling"] = {"rope_type": "linear", "factor": float(meta[f"{arch}.rope.scaling.factor"])}
    return out


def key(name: str) -> str | None:
    return GLOBAL.get(name) or block_key(name, _BLOCK, "model.layers.")


def transform(name: str, weight: mx.array, config: dict[str, Any]) -> mx.array:
    return weight - 1.0 if name.endswith("norm.weight") else weight
