"""GGUF `qwen3` (Qwen3-Embedding, Qwen3-Reranker conversions) -> engine/families/qwen3.py's checkpoint keys.

The Llama layout plus per-head q/k norms; Qwen3 is converted without Llama's q/k row permutation.
"""
from __future__ import annotations

from typing import Any

from engine.loading.gguf.arch import block_key
from engine.loading.gguf.arch.llama import BLOCK as LLAMA_BLOCK
from engine.loading.gguf.arch.llama import GLOBAL, decoder_config

FAMILY = "qwen3"
CAUSAL = True

_BLOCK = {**LLAMA_BLOCK, "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    out = decoder_config(meta, arch, shapes)
    out["rope_theta"] = float(meta.get(f"{arch}.rope.freq_base", 1_000_000.0))
    return out


def key(name: str) -> str | None:
    return GLOBAL.get(name) or block_key(name, _BLOCK, "model.layers.")
