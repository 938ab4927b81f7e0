"""GGUF `jina-bert-v3` (llama.cpp's XLMRobertaModel conversion of a checkpoint with `lora_adaptations`:
jina-embeddings-v3) -> engine/families/jina_embeddings_v3.py's keys (Jina's remote layout, NomicBERT's blocks).

What llama.cpp reads (src/models/bert.cpp, the BERT graph): token embeddings plus token-type row 0, the embedding
LayerNorm, then post-norm layers of a fused biased `attn_qkv`, NEOX rotary on whole heads (base `rope.freq_base`),
`attn_output`, and a plain GELU `ffn_up` / `ffn_down` with biases; no position table and no head. The converter
writes each task's LoRA adapter to its own GGUF (`lora-<task>-<name>.gguf`, general.type adapter,
`adapter.lora.alpha`, `adapter.lora.task_name`, `adapter.lora.prompt_prefix`), so this file holds the trunk without
any adapter: jina's encode(task=None); `--lora` merges them at load (engine/loading/gguf/lora.py).
"""
from __future__ import annotations

from typing import Any

from engine.loading.gguf.arch import block_key, nomic_bert

FAMILY = "jina_embeddings_v3"
CAUSAL = False

# nomic-bert's names (the same NomicBERT blocks), with the plain biased MLP instead of the gated one
_GLOBAL = nomic_bert._GLOBAL
_BLOCK = {**{k: v for k, v in nomic_bert._BLOCK.items() if k not in ("ffn_up", "ffn_gate")}, "ffn_up": "mlp.fc1"}


def config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """Jina's config.json names for the family; llama.cpp's defaults where the file is silent."""
    return {
        "model_type": "xlm-roberta",
        "architectures": ["XLMRobertaLoRA"],
        "vocab_size": shapes["token_embd.weight"][0],
        "hidden_size": int(meta[f"{arch}.embedding_length"]),
        "num_attention_heads": int(meta[f"{arch}.attention.head_count"]),
        "num_hidden_layers": int(meta[f"{arch}.block_count"]),
        "intermediate_size": int(meta[f"{arch}.feed_forward_length"]),
        "max_position_embeddings": int(meta[f"{arch}.context_length"]),
        "layer_norm_eps": float(meta[f"{arch}.attention.layer_norm_epsilon"]),
        "type_vocab_size": shapes["token_types.weight"][0] if "token_types.weight" in shapes else 0,
        "hidden_act": "gelu",
        "position_embedding_type": "rotary",
        "rotary_emb_base": float(meta.get(f"{arch}.rope.freq_base", 10_000.0)),
    }


def key(name: str) -> str | None:
    return _GLOBAL.get(name) or block_key(name, _BLOCK, "encoder.layers.")
