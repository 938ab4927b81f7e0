"""GGUF `qwen2` (Qwen2Model / Qwen2ForCausalLM conversions: gte-Qwen2 and other Qwen2 embedders) ->
engine/families/qwen2.py's checkpoint keys.

The Llama layout with biased q/k/v (`blk.N.attn_{q,k,v}.bias`); converted without Llama's q/k row permutation
(rotate-half rotary, as the original). llama.cpp's qwen2 graph has no sliding window: every layer is global, as
Qwen's configs have it without use_sliding_window.
"""
from __future__ import annotations

from typing import Any

from engine.loading.gguf.arch import block_key
from engine.loading.gguf.arch.llama import BLOCK, GLOBAL, decoder_config

FAMILY = "qwen2"
CAUSAL = True


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    out = decoder_config(meta, arch, shapes)
    out["rope_theta"] = float(meta.get(f"{arch}.rope.freq_base", 10_000.0))  # llama.cpp's default
    out["use_sliding_window"] = False
    return out


def key(name: str) -> str | None:
    return GLOBAL.get(name) or block_key(name, BLOCK, "model.layers.")
