"""A GGUF file as a Checkpoint: config.json's equivalent, pooling and tokenizer settings from its metadata."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.checkpoint import Checkpoint
from engine.errors import UnsupportedCheckpoint
from engine.loading.gguf import vocab
from engine.loading.gguf.arch import for_architecture
from engine.loading.gguf.reader import GGUFFile
from engine.types import Pooling

# llama.h's llama_pooling_type values as stored in `{arch}.pooling_type`
_POOLING = {0: Pooling.NONE, 1: Pooling.MEAN, 2: Pooling.CLS, 3: Pooling.LAST, 4: Pooling.RANK}


def special_tokens(meta: dict[str, Any], source: str) -> dict[str, str | None]:
    """tokenizer_config.json's bos/eos/pad tokens for a GGUF file: the ids llama.cpp uses (the file's, else its
    tokenizer model's defaults), as text; None where llama has no such token."""
    tokens = meta.get("tokenizer.ggml.tokens") or []
    rules = vocab.special_rules(meta, source)
    return {name: tokens[i] if i is not None else None
            for name, i in (("bos_token", rules.bos_id), ("eos_token", rules.eos_id), ("pad_token", rules.pad_id))}


def read(path: Path, label: str) -> Checkpoint:
    """`label` is how the user named the file (llama-server reports the -m path as typed)."""
    gguf = GGUFFile(path)
    if int(gguf.metadata.get("split.count", 1)) > 1:
        raise UnsupportedCheckpoint(f"{path}: a GGUF split into {gguf.metadata['split.count']} files is not supported; "
                                    f"merge it first (llama-gguf-split --merge)")
    arch = gguf.architecture
    mapping = for_architecture(arch, str(path))
    shapes = {name: info.shape for name, info in gguf.tensors.items()}
    try:
        config = mapping.config(gguf.metadata, arch, shapes)
    except KeyError as exc:
        raise UnsupportedCheckpoint(f"{path}: GGUF metadata {exc.args[0]!r} is missing") from None
    stored = gguf.arch_value("pooling_type")
    if stored is not None and int(stored) not in _POOLING:
        raise UnsupportedCheckpoint(f"{path}: pooling_type {stored} is not supported")
    # llama.cpp: no pooling_type means none (per-token vectors) unless --pooling says otherwise
    pooling = _POOLING[int(stored)] if stored is not None else Pooling.NONE
    return Checkpoint(
        path=path, config=config, pooling=None if pooling is Pooling.RANK else pooling,
        tokenizer_config=special_tokens(gguf.metadata, str(path)),
        max_seq_length=int(gguf.arch_value("context_length", 0)) or None,
        gguf=gguf, label=label)
