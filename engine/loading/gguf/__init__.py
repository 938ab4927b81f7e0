"""GGUF files (llama.cpp's format) served through our MLX families: reader, tokenizer from the metadata,
one tensor-name map per family (arch/), llama.cpp's rank head."""
from __future__ import annotations

from pathlib import Path

from engine.loading.gguf.reader import MAGIC


def is_gguf(path: str | Path) -> bool:
    """A file (not a folder) that starts with the GGUF magic."""
    p = Path(path)
    if not p.is_file():
        return False
    with p.open("rb") as f:
        return f.read(4) == MAGIC
