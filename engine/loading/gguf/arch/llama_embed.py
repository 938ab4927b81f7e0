"""GGUF `llama-embed` (llama.cpp's LlamaBidirectionalModel conversion: llama-embed-nemotron and other bidirectional
Llama embedders) -> engine/families/llama.py's checkpoint keys.

The `llama` file layout (q/k rows permuted by the converter, undone here) read by llama.cpp's Llama graph without
an LM head. The converter writes no pooling type (`--pooling` decides; per-token vectors without it, as
llama-server) and `attention.causal` false only where the checkpoint's config.json says `is_causal: false`;
without that key llama.cpp's default holds and llama-server runs the model causally, and so does this reading
(logged once at load).
"""
from __future__ import annotations

import logging
from typing import Any

from engine.loading.gguf.arch import llama
from engine.loading.gguf.arch.llama import FAMILY, key, transform  # noqa: F401  (the same tensor map)

CAUSAL = False

log = logging.getLogger(__name__)


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    out = llama.config(meta, arch, shapes)
    out["model_type"] = "llama"
    out["is_causal"] = bool(meta.get(f"{arch}.attention.causal", True))  # llama.cpp's default when absent
    log.warning("a llama-embed GGUF is served as llama-server serves it: pooled by --pooling (the file has no "
                "pooling type)%s", "" if not out["is_causal"] else
                "; with causal attention (the file has no llama-embed.attention.causal false)")
    return out
