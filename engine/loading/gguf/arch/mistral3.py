"""GGUF `mistral3` (llama.cpp's Ministral3ForCausalLM / Mistral3ForConditionalGeneration text conversion: Ministral 3,
and Nemotron-3-Embed's bidirectional Ministral 3) -> engine/families/ministral3.py's checkpoint keys.

The `llama` file layout (q/k rows permuted by the converter, undone here); Ministral 3's YaRN rotary from
`rope.scaling.*` (type, factor, original context, beta fast / slow; `yarn_log_multiplier` is mscale_all_dim, and
llama.cpp takes mscale as 1) and the Llama 4 attention scaling from `attention.temperature_scale` over the
original context, as llama.cpp reads them. Causal unless the file says `attention.causal` false (the converter
writes it where config.json has `is_causal: false`); pooling from the file, else `--pooling`.
"""
from __future__ import annotations

from typing import Any

from engine.errors import UnsupportedCheckpoint
from engine.loading.gguf.arch import llama
from engine.loading.gguf.arch.llama import key, transform  # noqa: F401  (the same tensor map)

FAMILY = "ministral3"
CAUSAL = True


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    out = llama.decoder_config(meta, arch, shapes)
    out["model_type"] = "ministral3"
    out["rms_norm_eps"] = float(meta[f"{arch}.attention.layer_norm_rms_epsilon"])
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10_000.0))}
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind == "yarn":
        rope.update({
            "rope_type": "yarn",
            "factor": float(meta[f"{arch}.rope.scaling.factor"]),
            "original_max_position_embeddings": int(meta[f"{arch}.rope.scaling.original_context_length"]),
            "beta_fast": float(meta.get(f"{arch}.rope.scaling.yarn_beta_fast", 32.0)),
            "beta_slow": float(meta.get(f"{arch}.rope.scaling.yarn_beta_slow", 1.0)),
            "mscale": 1.0,  # llama.cpp's assumption
            "mscale_all_dim": float(meta.get(f"{arch}.rope.scaling.yarn_log_multiplier", 1.0)),
        })
    elif kind != "none":
        raise UnsupportedCheckpoint(f"mistral3 rope scaling {kind!r} is not supported (yarn, none)")
    beta = float(meta.get(f"{arch}.attention.temperature_scale", 0.0))
    if beta:
        if "original_max_position_embeddings" not in rope:
            raise UnsupportedCheckpoint("mistral3 attention.temperature_scale needs rope.scaling."
                                        "original_context_length (llama.cpp refuses it too)")
        rope["llama_4_scaling_beta"] = beta
    out["rope_parameters"] = rope
    out["is_causal"] = bool(meta.get(f"{arch}.attention.causal", True))  # llama.cpp's default when absent
    return out
