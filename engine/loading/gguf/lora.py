"""llama.cpp LoRA adapter GGUFs (`--lora FNAME`, `--lora-scaled FNAME:SCALE`), merged into a base GGUF's weights
at load, as llama-server applies them to every embedding (src/llama-adapter.cpp, llm_graph_context::build_lora_mm
and build_inp_embd).

An adapter file is `general.type` adapter, `adapter.type` lora, of the base file's architecture, with
`adapter.lora.alpha` and one `<tensor>.lora_a` / `<tensor>.lora_b` pair per adapted base tensor (jina-embeddings-v3's
converter writes one such file per task). With scale s (1 for --lora), alpha and rank r (lora_b's last axis):
a weight W [out, in] gets s * alpha / r * B @ A (A [r, in], B [out, r]; alpha 0: s alone); the token embedding table
gets s * alpha / r * A @ B^T (A [vocab, r], B [dim, r]: llama.cpp stores that pair flipped). llama.cpp's graph
adds token-type row 0 without its adapter path, so a `token_types.weight` pair changes nothing there, nor here.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine.errors import CheckpointNotFound, UnsupportedCheckpoint
from engine.loading.gguf.reader import MAGIC, GGUFFile

_NOT_APPLIED = ("token_types.weight",)  # added by a view of the table in llama.cpp's graphs, never adapted


def deltas(base: GGUFFile, adapters: Sequence[tuple[str, float]]) -> dict[str, np.ndarray]:
    """Base tensor name -> the float32 sum of every adapter's change to it."""
    out: dict[str, np.ndarray] = {}
    for path, scale in adapters:
        adapter = _open(path, base)
        alpha = float(adapter.metadata.get("adapter.lora.alpha", 0.0))
        pairs = {name[: -len(".lora_a")] for name in adapter.tensors if name.endswith((".lora_a", ".lora_b"))}
        for name in sorted(pairs):
            if f"{name}.lora_a" not in adapter.tensors or f"{name}.lora_b" not in adapter.tensors:
                raise UnsupportedCheckpoint(f"{path}: LoRA tensor pair for {name!r} is missing one component")
            if name not in base.tensors:
                raise UnsupportedCheckpoint(f"{path}: LoRA tensor {name!r} does not exist in the base model "
                                            f"(another base model's adapter?)")
            a = adapter.array(f"{name}.lora_a").astype(np.float32)
            b = adapter.array(f"{name}.lora_b").astype(np.float32)
            rows, cols = base.tensors[name].shape
            rank = b.shape[1]
            embedding = name.endswith("token_embd.weight")
            fits = (a.shape, b.shape) == (((rows, rank), (cols, rank)) if embedding else ((rank, cols), (rows, rank)))
            if not fits:
                raise UnsupportedCheckpoint(f"{path}: LoRA tensor {name!r} has shapes {a.shape} / {b.shape}, "
                                            f"which do not fit the base model's {(rows, cols)}")
            if name in _NOT_APPLIED:
                continue
            factor = scale * alpha / rank if alpha else scale
            delta = factor * (a @ b.T if embedding else b @ a)
            out[name] = out[name] + delta if name in out else delta
    return out


def _open(path: str, base: GGUFFile) -> GGUFFile:
    file = Path(path).expanduser()
    if not file.is_file():
        raise CheckpointNotFound(f"--lora {path}: no such file")
    with file.open("rb") as f:
        if f.read(4) != MAGIC:
            raise UnsupportedCheckpoint(f"--lora {path}: not a GGUF file")
    adapter = GGUFFile(file)
    kind = adapter.metadata.get("general.type")
    if kind != "adapter":
        raise UnsupportedCheckpoint(f"--lora {path}: general.type is {kind!r}, not 'adapter'")
    if adapter.metadata.get("adapter.type") != "lora":
        raise UnsupportedCheckpoint(f"--lora {path}: adapter.type is {adapter.metadata.get('adapter.type')!r}, "
                                    f"not 'lora'")
    if adapter.architecture != base.architecture:
        raise UnsupportedCheckpoint(f"--lora {path}: an adapter for {adapter.architecture!r}, but the model is "
                                    f"{base.architecture!r}")
    return adapter
