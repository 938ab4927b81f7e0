"""One GGUF tensor-name map per family: general.architecture -> the module that maps it onto our family."""
from __future__ import annotations

import importlib
from types import ModuleType

from engine.errors import UnsupportedCheckpoint

# general.architecture -> module under engine/loading/gguf/arch/
ARCHITECTURES = {"bert": "bert", "nomic-bert": "nomic_bert", "qwen3": "qwen3", "llama": "llama", "gemma3": "gemma3",
                 "gemma-embedding": "gemma_embedding", "modern-bert": "modern_bert",
                 "qwen2": "qwen2", "lfm2": "lfm2", "t5encoder": "t5encoder", "eurobert": "eurobert",
                 "nomic-bert-moe": "nomic_bert_moe", "llama-embed": "llama_embed",
                 "mistral3": "mistral3", "jina-bert-v2": "jina_bert_v2", "jina-bert-v3": "jina_bert_v3",
                 "neo-bert": "neo_bert"}


def for_architecture(architecture: str, source: str) -> ModuleType:
    name = ARCHITECTURES.get(architecture)
    if name is None:
        raise UnsupportedCheckpoint(f"{source}: GGUF architecture {architecture!r} is not supported "
                                    f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    return importlib.import_module(f"engine.loading.gguf.arch.{name}")


def block_key(name: str, names: dict[str, str], prefix: str) -> str | None:
    """`blk.N.<gguf>.<weight|bias>` -> `<prefix>N.<hf>.<weight|bias>` through a table of per-block names."""
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in names:
        return None
    return f"{prefix}{parts[1]}.{names[parts[2]]}.{parts[3]}"
