"""The checkpoint-format seam: what a file format provides, and the one place that chooses a format.

Two implementations: a Hugging Face model folder (engine/loading/safetensors.py) and a GGUF file
(engine/loading/gguf/format.py). `format_of` is the only code that looks at a model path to decide which one
reads it; the Checkpoint it reads carries its format, and everything else goes through that.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Protocol

from engine.checkpoint import Checkpoint
from engine.loading.registry import LoadedModel
from engine.loading.safetensors import SafetensorsFormat
from engine.text.tokenizer import TextTokenizer


class CheckpointFormat(Protocol):
    """One file format of checkpoints. `read` makes the format object a Checkpoint carries (`checkpoint.format`);
    its methods take that checkpoint back."""

    name: ClassVar[str]  # what /v1/models reports as the model's format (ModelInfo.file_format)

    @classmethod
    def require(cls, path: Path, given: str) -> None:
        """CheckpointNotFound naming `given` (the -m argument as typed) unless `path` holds this format."""

    @classmethod
    def read(cls, path: Path, label: str = "") -> Checkpoint:
        """The checkpoint's configuration (its config.json or what stands for it) as the format-neutral record;
        `label`: how the user named it."""

    def open_tokenizer(self, checkpoint: Checkpoint) -> TextTokenizer:
        """The checkpoint's tokenizer, with llama-server's prompt rules."""

    def kind_of(self, checkpoint: Checkpoint, rank: bool = False) -> str:
        """registry.EMBEDDER, CROSS_ENCODER or GENERATIVE_RERANKER; anything else is refused by name. rank: the
        server runs in rank mode (--reranking), which makes a causal LM with a yes/no recipe a reranker."""

    def load(self, checkpoint: Checkpoint, kind: str, dtype: str = "auto",
             keep_quantized: bool = False) -> LoadedModel:
        """The family's module built as `kind` with the checkpoint's weights (strict: every key must match).
        dtype: the compute dtype (auto: float32 on a CPU, the checkpoint's own on a GPU; engine/loading/weights.py).
        keep_quantized: quantized layers keep their bits on a CPU too (they always do on a GPU), where the format
        can run them quantized at all."""


def format_of(path: Path) -> type[CheckpointFormat]:
    """Which format reads `path`: a file is a GGUF (its reader refuses one without the magic), a folder a
    safetensors checkpoint."""
    if path.is_file():
        from engine.loading.gguf.format import GGUFFormat  # only a GGUF load needs its reader

        return GGUFFormat
    return SafetensorsFormat


def open_checkpoint(path: Path, label: str = "") -> Checkpoint:
    """Read every configuration file of a checkpoint folder, or the metadata of a GGUF file, by its format."""
    return format_of(path).read(path, label)


def load(checkpoint: Checkpoint, kind: str | None = None, dtype: str = "auto",
         keep_quantized: bool = False) -> LoadedModel:
    """The checkpoint's model, built by its format as `kind` (default: what it is in embedding mode)."""
    fmt: CheckpointFormat = checkpoint.format
    return fmt.load(checkpoint, kind or fmt.kind_of(checkpoint), dtype, keep_quantized)
