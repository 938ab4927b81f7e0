"""GGUF `eurobert` (llama.cpp's EuroBertModel conversion: EuroBERT, jina-embeddings-v5) ->
engine/families/eurobert.py's checkpoint keys.

Llama's tensor names without Llama's q/k row permutation (llama.cpp runs eurobert with NEOX rotary, the HF
rotate-half layout), the `model.` prefix stripped by the converter, a final `output_norm`; the converter marks the
file `attention.causal` false and writes the pooling type of a sentence-transformers folder (none for a bare
EuroBertModel: `--pooling` decides, as llama-server). llama.cpp builds no attention-output or MLP biases for this
architecture (EuroBERT has none), so a bias tensor has no place here either.
"""
from __future__ import annotations

from typing import Any

from engine.loading.gguf.arch import block_key
from engine.loading.gguf.arch.llama import BLOCK, GLOBAL, decoder_config

FAMILY = "eurobert"
CAUSAL = False


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    out = decoder_config(meta, arch, shapes)
    out["rope_theta"] = float(meta.get(f"{arch}.rope.freq_base", 10_000.0))
    out["rms_norm_eps"] = float(meta[f"{arch}.attention.layer_norm_rms_epsilon"])
    return out


def key(name: str) -> str | None:
    if name.endswith(".bias"):
        return None
    return GLOBAL.get(name) or block_key(name, BLOCK, "model.layers.")
