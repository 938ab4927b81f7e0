"""The checkpoint record: what every file format reads from a model's files (engine/loading/formats.py), and the
JSON reading its readers and the input builders share."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import CheckpointNotFound, UnsupportedCheckpoint
from engine.types import Pooling


@dataclass(frozen=True)
class Splade:
    """sentence-transformers' SpladePooling (a SparseEncoder's 1_SpladePooling/config.json), or TEI's --pooling
    splade (max, relu): log(1 + relu(logits)) of the masked LM's logits, twice for "log1p_relu", then the max
    (or the sum) over the input's tokens; max_active_dims (config_sentence_transformers.json): keep only the
    largest entries of each vector."""

    strategy: str = "max"  # "max" | "sum"
    activation: str = "relu"  # "relu" | "log1p_relu"
    max_active_dims: int | None = None


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    config: dict[str, Any]
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    special_tokens: dict[str, Any] = field(default_factory=dict)
    module_types: tuple[str, ...] = ()
    pooling: Pooling | None = None  # the pooling the checkpoint stores (1_Pooling/config.json, a GGUF's pooling_type)
    max_seq_length: int | None = None  # sentence_bert_config or tokenizer_config model_max_length
    # config_sentence_transformers.json: named prompts prepended to texts, and the one used by default
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    # sentence_bert_config.json (sentence-transformers >= 6): a "message" modality means texts are sent as chat
    # messages through the tokenizer's chat template; processing_kwargs["chat_template"] are its render options
    message_modality: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    dense_folders: tuple[Path, ...] = ()  # modules.json Dense modules (2_Dense, 3_Dense, ...), in order
    # a yes/no reranker's LogitScore module (Qwen3-VL-Reranker's 1_LogitScore): (true_token_id, false_token_id)
    logit_score: tuple[int, int] | None = None
    splade: Splade | None = None  # a sparse encoder: its masked-LM head pooled by SPLADE
    # GGUF only: llama.cpp LoRA adapter files merged at load, with their scales (--lora, --lora-scaled)
    lora: tuple[tuple[str, float], ...] = ()
    label: str = ""  # the path as the user gave it (llama-server reports -m as typed)
    # the file format that read it, and that opens its tokenizer and loads its model: an
    # engine.loading.formats.CheckpointFormat (typed loosely here: the formats live above this record)
    format: Any = field(kw_only=True)

    @property
    def display_path(self) -> str:
        return self.label or str(self.path)

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))

    @property
    def architecture(self) -> str:
        archs = self.config.get("architectures") or [""]
        return str(archs[0])


def special_token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json and special_tokens_map.json write it: a string, or a serialized
    AddedToken ({"content": ...}); None when it is absent or neither."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def read_json(path: Path) -> Any:
    """A checkpoint's JSON file: CheckpointNotFound when it is missing, UnsupportedCheckpoint naming it when invalid."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CheckpointNotFound(f"{path}: missing") from exc
    except json.JSONDecodeError as exc:
        raise UnsupportedCheckpoint(f"{path}: invalid JSON: {exc}") from exc


def read_json_optional(path: Path) -> Any:
    """A checkpoint's optional JSON file ({} when absent); invalid JSON is an UnsupportedCheckpoint naming it."""
    return read_json(path) if path.is_file() else {}
