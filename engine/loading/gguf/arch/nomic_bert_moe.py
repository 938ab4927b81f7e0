"""GGUF `nomic-bert-moe` (llama.cpp's NomicBertModel conversion with moe_every_n_layers: nomic-embed-text-v2-moe)
-> engine/families/nomic_bert.py's checkpoint keys (the hub's names).

nomic-bert's layout with biases (Wqkv, out_proj, fc1, fc2), plain GELU MLPs, and on every layer i with
i % `moe_every_n_layers` == 1 a router (`ffn_gate_inp`) over `expert_count` experts, each token taking its
`expert_used_count` best by softmax, the weights not renormalized (llama.cpp's build_moe_ffn as this graph calls
it). The converter stores the experts' matrices per expert (`ffn_up_exps` [E, F, D], `ffn_down_exps` [E, D, F])
and drops the experts' shared output bias (`mlp.experts.bias`), which llama.cpp's graph has no place for: the file
is computed as llama-server computes it, without that bias (the load logs it once), so its vectors are not the
original checkpoint's.
"""
from __future__ import annotations

import logging
from typing import Any

import mlx.core as mx

from engine.loading.gguf.arch import block_key, nomic_bert
from engine.loading.gguf.arch.nomic_bert import _GLOBAL

FAMILY = "nomic_bert"
CAUSAL = False

log = logging.getLogger(__name__)

_BLOCK = {
    "attn_qkv": "attn.Wqkv",
    "attn_output": "attn.out_proj",
    "attn_output_norm": "norm1",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
    "layer_output_norm": "norm2",
    "ffn_gate_inp": "mlp.router.layer",
}
_EXPERTS = {"ffn_up_exps": "mlp.experts.mlp.w1", "ffn_down_exps": "mlp.experts.mlp.w2"}


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """The hub's config.json names, from the keys llama.cpp reads."""
    log.warning("a nomic-bert-moe GGUF has no experts' output bias (the converter drops mlp.experts.bias): computed "
                "as llama-server computes it, without it; its vectors are not the original checkpoint's")
    out = nomic_bert.config(meta, arch, shapes)
    out.update({
        "layer_norm_epsilon": float(meta[f"{arch}.attention.layer_norm_epsilon"]),
        "activation_function": "gelu",
        "qkv_proj_bias": "blk.0.attn_qkv.bias" in shapes,
        "mlp_fc1_bias": "blk.0.ffn_up.bias" in shapes, "mlp_fc2_bias": "blk.0.ffn_down.bias" in shapes,
        "moe_every_n_layers": int(meta.get(f"{arch}.moe_every_n_layers", 0)),
        "num_experts": int(meta.get(f"{arch}.expert_count", 0)),
        "moe_top_k": int(meta.get(f"{arch}.expert_used_count", 1)),
        "moe_normalize_expert_weights": False,
    })
    return out


def key(name: str) -> str | None:
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _EXPERTS and parts[3] == "weight":
        return f"encoder.layers.{parts[1]}.{_EXPERTS[parts[2]]}"
    return _GLOBAL.get(name) or block_key(name, _BLOCK, "encoder.layers.")


def transform(name: str, weight: mx.array, config: dict[str, Any]) -> mx.array:
    """Per-expert matrices back to the hub's stacked [E * F, D] (down: [E, D, F] transposed first)."""
    if name.endswith(".ffn_down_exps.weight"):
        weight = weight.swapaxes(1, 2)
    if name.endswith(("_exps.weight",)):
        return weight.reshape(-1, weight.shape[-1])
    return weight


def rename(weights: dict[str, mx.array], config: dict[str, Any]) -> dict[str, mx.array]:
    """The experts' shared bias the converter drops: zero, as llama.cpp's graph adds none."""
    out = dict(weights)
    for layer in range(config["n_layer"]):
        if config["moe_every_n_layers"] and layer % config["moe_every_n_layers"] == 1:
            out[f"encoder.layers.{layer}.mlp.experts.bias"] = mx.zeros((config["n_embd"],))
    return out
