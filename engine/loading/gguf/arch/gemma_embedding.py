"""GGUF `gemma-embedding` (EmbeddingGemma conversions): gemma3's tensors and rules, bidirectional attention, and
sentence-transformers' two Dense layers as `dense_2` / `dense_3` when the converter kept them."""
from __future__ import annotations

from typing import Any

from engine.loading.gguf.arch import gemma3
from engine.loading.gguf.arch.gemma3 import FAMILY, key, transform  # noqa: F401  (the same tensor map)

CAUSAL = False
# (GGUF tensor, our projection key), applied after pooling in this order; identity activations, no bias
DENSE = (("dense_2.weight", "dense.0.weight"), ("dense_3.weight", "dense.1.weight"))


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    out = gemma3.config(meta, arch, shapes)
    out["use_bidirectional_attention"] = True
    return out
