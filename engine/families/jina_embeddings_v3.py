"""jina-embeddings-v3: an XLM-RoBERTa trunk with rotary positions, and its task LoRA adapters.

Two layouts. transformers' JinaEmbeddingsV3Model (model_type jina_embeddings_v3): embeddings (word, token type,
LayerNorm), then post-norm layers of separate q/k/v/o projections and a GELU fc1/fc2 MLP. Jina's remote-code
export (model_type xlm-roberta, architectures XLMRobertaLoRA, the published jinaai/jina-embeddings-v3): the
same computation in flash-attention BERT names (emb_ln, encoder.layers.N.mixer.Wqkv / out_proj, norm1, norm2)
under `roberta.`, which is NomicBERT's layout exactly, so the trunk is engine/families/nomic_bert.py's blocks
(rotary on whole heads, base rotary_emb_base / rope_theta, 20000 by default).

The remote export also carries one LoRA adapter per task (config lora_adaptations: retrieval.query,
retrieval.passage, separation, classification, text-matching) on every Linear and Embedding, as
`<layer>.parametrizations.weight.original` plus `.0.lora_A` / `.0.lora_B` stacked on the task axis: a linear
weight becomes W + (alpha / rank) * lora_B[t] @ lora_A[t] (A [tasks, rank, in], B [tasks, out, rank]), an
embedding table W + (alpha / rank) * lora_A[t] @ lora_B[t] (A [tasks, vocab, rank], B [tasks, rank, dim]), as
Jina's LoRAParametrization computes them. The task is fixed when the model loads (`task` in config.json, None:
the adapters off, Jina's encode(task=None)) and merged into the weights then; a per-request task needs the
engine to carry it to the model (see merge_task). Pooling (mean) and Matryoshka truncation (`dimensions`) are
the pipeline's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from engine.errors import UnsupportedCheckpoint
from engine.families import nomic_bert
from engine.families.base import without_prefix

DEFAULT_THETA = 20_000.0
_RENAMES = (("embeddings.LayerNorm.", "emb_ln."), ("layers.", "encoder.layers."), (".mixer.", ".attn."),
            (".self_attn.o_proj.", ".attn.out_proj."), (".post_attention_layernorm.", ".norm1."),
            (".post_mlp_layernorm.", ".norm2."))
_LORA = ".parametrizations.weight."


@dataclass
class ModelArgs(nomic_bert.ModelArgs):
    task: str | None = None
    lora_adaptations: list[str] | None = None
    lora_rank: int = 4
    lora_alpha: float = 1.0

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> ModelArgs:
        """transformers' or Jina's config.json in NomicBERT's names (the same blocks), plus the task settings."""
        rope = params.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default":
            raise UnsupportedCheckpoint(f"jina-embeddings-v3 rope_type {rope['rope_type']!r} is not supported")
        if params.get("position_embedding_type", "rotary") != "rotary":
            raise UnsupportedCheckpoint(f"jina-embeddings-v3 position_embedding_type "
                                        f"{params['position_embedding_type']!r} is not supported (only rotary)")
        hidden, heads = params["hidden_size"], params["num_attention_heads"]
        names = {k: v for k, v in params.items() if k in ("task", "lora_adaptations", "lora_rank", "lora_alpha")}
        return super().from_dict({
            "vocab_size": params["vocab_size"], "n_embd": hidden, "n_head": heads,
            "n_layer": params["num_hidden_layers"], "n_inner": params.get("intermediate_size", 4 * hidden),
            "n_positions": params.get("max_position_embeddings", 8194),
            "layer_norm_epsilon": params.get("layer_norm_eps", 1e-5),
            "type_vocab_size": params.get("type_vocab_size", 1), "activation_function": params.get("hidden_act", "gelu"),
            "rotary_emb_fraction": 1.0,
            "rotary_emb_base": float(rope.get("rope_theta") or params.get("rotary_emb_base") or DEFAULT_THETA),
            "qkv_proj_bias": True, "mlp_fc1_bias": True, "mlp_fc2_bias": True, **names})

    def __post_init__(self):
        super().__post_init__()
        if self.task is not None and self.task not in (self.lora_adaptations or ()):
            raise UnsupportedCheckpoint(f"jina-embeddings-v3 task {self.task!r} is not one of its adapters "
                                        f"({', '.join(self.lora_adaptations or ()) or 'none'})")


class Model(nomic_bert.Model):
    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Either layout -> NomicBERT's keys, the chosen task's adapters merged (or dropped: no task)."""
        weights = merge_task(weights, self.args)
        out, qkv = {}, {}
        for key, value in weights.items():
            key = without_prefix(key, ("roberta.",))
            for old, new in _RENAMES:
                if old in key and not (old == "layers." and not key.startswith("layers.")):
                    key = key.replace(old, new, 1)
            for part in ("q", "k", "v"):
                if f".self_attn.{part}_proj." in key:  # transformers' separate projections -> the fused Wqkv
                    qkv.setdefault(key.replace(f".self_attn.{part}_proj.", ".attn.Wqkv."), {})[part] = value
                    break
            else:
                out[key] = value
        for key, parts in qkv.items():
            out[key] = mx.concatenate([parts["q"], parts["k"], parts["v"]], axis=0)
        return super().sanitize(out)


def merge_task(weights: dict[str, mx.array], args: ModelArgs) -> dict[str, mx.array]:
    """Jina's parametrized weights (`<layer>.parametrizations.weight.original` and `.0.lora_A` / `.0.lora_B`)
    -> `<layer>.weight`, with args.task's adapter added (none: the original weights). What a per-request task
    would replace: the adapters kept apart and applied per row, their task index passed to the model."""
    out = {k: v for k, v in weights.items() if _LORA not in k}
    task = (args.lora_adaptations or []).index(args.task) if args.task is not None else None
    scaling = args.lora_alpha / args.lora_rank
    for key in weights:
        if not key.endswith(_LORA + "original"):
            continue
        layer = key[: -len(_LORA + "original")]
        weight = weights[key]
        if task is not None:
            a, b = weights[f"{layer}{_LORA}0.lora_A"][task], weights[f"{layer}{_LORA}0.lora_B"][task]
            # a linear's A [rank, in] and B [out, rank]; an embedding's A [vocab, rank] and B [rank, dim]
            delta = b @ a if a.shape[1] == weight.shape[1] and b.shape[0] == weight.shape[0] else a @ b
            weight = weight + (scaling * delta).astype(weight.dtype)
        out[f"{layer}.weight"] = weight
    return out
