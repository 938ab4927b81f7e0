"""GGUF `modern-bert` (llama.cpp's ModernBertModel conversion) -> engine/families/modernbert.py's checkpoint keys.

llama.cpp's rules for the file: local (symmetric sliding-window) layers only when `attention.sliding_window` is
present and positive; then every `sliding_window_pattern`-th layer from layer 0 is global (3 when the key is
absent, none when 0), on `rope.freq_base`; the others on `rope.freq_base_swa` (the global base when absent).
Layer norms have no bias; layer 0 has no attn_norm. A converted ModernBertForSequenceClassification (a
reranker) keeps its head as `cls` (dense), `cls.norm` and `cls.output` (the classifier): llama.cpp scores the
mean of every token's final state (transformers' classifier_pooling "mean"; the file does not say which, and
llama-server means on a file with no pooling_type) as cls.output(norm(gelu(cls(h)))), GELU in ggml's tanh
approximation and the norm on the file's layer_norm_epsilon (head.py).
"""
from __future__ import annotations

import logging
from typing import Any

import mlx.nn as nn
import numpy as np

from engine.errors import UnsupportedCheckpoint
from engine.families.modernbert import GLOBAL, LOCAL
from engine.loading.gguf.arch import block_key
from engine.types import Pooling

log = logging.getLogger(__name__)

FAMILY = "modernbert"
CAUSAL = False

_GLOBAL = {
    "token_embd.weight": "embeddings.tok_embeddings.weight",
    "token_embd_norm.weight": "embeddings.norm.weight",
    "output_norm.weight": "final_norm.weight",
}
_BLOCK = {
    "attn_norm": "attn_norm",
    "attn_qkv": "attn.Wqkv",
    "attn_output": "attn.Wo",
    "ffn_norm": "mlp_norm",
    "ffn_up": "mlp.Wi",
    "ffn_down": "mlp.Wo",
}


def _layer_types(meta: dict[str, Any], arch: str, layers: int) -> list[str]:
    window = int(meta.get(f"{arch}.attention.sliding_window", 0))
    if window <= 0:
        return [GLOBAL] * layers
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern", 3)
    if not isinstance(pattern, (int, np.integer)):
        # llama.cpp's modern-bert loader reads one period, not per-layer flags
        raise UnsupportedCheckpoint(f"{arch}.attention.sliding_window_pattern {pattern!r} is not a layer period")
    every = int(pattern)  # 0: every layer local, as llama.cpp's set_swa_pattern has it
    return [LOCAL if every == 0 or i % every else GLOBAL for i in range(layers)]


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """config.json's equivalent, from the keys llama.cpp reads."""
    activation = meta.get(f"{arch}.hidden_activation", "gelu")
    if activation != "gelu":
        raise UnsupportedCheckpoint(f"ModernBERT hidden_activation {activation!r} is not supported (gelu)")
    layers = int(meta[f"{arch}.block_count"])
    global_base = float(meta.get(f"{arch}.rope.freq_base", 10_000.0))
    return {
        "model_type": "modernbert",
        "vocab_size": shapes["token_embd.weight"][0],
        "hidden_size": int(meta[f"{arch}.embedding_length"]),
        "num_hidden_layers": layers,
        "num_attention_heads": int(meta[f"{arch}.attention.head_count"]),
        "intermediate_size": int(meta[f"{arch}.feed_forward_length"]),
        "max_position_embeddings": int(meta.get(f"{arch}.context_length", 8192)),
        "norm_eps": _norm_eps(meta, arch),
        "local_attention": int(meta.get(f"{arch}.attention.sliding_window", 0)),
        "layer_types": _layer_types(meta, arch, layers),
        "global_rope_theta": global_base,
        "local_rope_theta": float(meta.get(f"{arch}.rope.freq_base_swa", global_base)),
        "hidden_activation": "gelu",
    }


def _norm_eps(meta: dict[str, Any], arch: str) -> float:
    """The LayerNorms' epsilon: `attention.layer_norm_epsilon`, where llama.cpp reads it. The converter at
    3f545bec writes a ModernBertModel's norm_eps as `attention.layer_norm_rms_epsilon` instead, a file its own
    llama-server refuses (key not found); the value is the same LayerNorm epsilon, so it is read from there."""
    value = meta.get(f"{arch}.attention.layer_norm_epsilon")
    if value is None:
        value = meta.get(f"{arch}.attention.layer_norm_rms_epsilon")
        if value is None:
            raise UnsupportedCheckpoint(f"this modern-bert GGUF has no {arch}.attention.layer_norm_epsilon")
        log.warning("this modern-bert GGUF holds its norm epsilon as %s.attention.layer_norm_rms_epsilon (as "
                    "llama.cpp's converter writes it; llama-server refuses such a file): read from there", arch)
    return float(value)


def head_options(config: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's rank head for modern-bert, as llama-server scores it: the mean of all tokens, GELU, then the norm
    at norm_eps."""
    return {"pooling": Pooling.MEAN, "activation": nn.gelu_approx, "norm_eps": config["norm_eps"]}


def key(name: str) -> str | None:
    return _GLOBAL.get(name) or block_key(name, _BLOCK, "layers.")
