"""A GGUF file (llama.cpp's format) as one implementation of the checkpoint-format seam
(engine/loading/formats.py): config.json's equivalent, pooling and tokenizer settings from its metadata, the
tokenizer built from its vocabulary, our families loaded from its tensors."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.checkpoint import Checkpoint
from engine.errors import CheckpointNotFound, UnsupportedCheckpoint
from engine.loading import registry, weights
from engine.loading.gguf import load, vocab
from engine.loading.gguf.arch import for_architecture
from engine.loading.gguf.head import RankHead
from engine.loading.gguf.reader import MAGIC, GGUFFile
from engine.loading.gguf.tokenizer import GGUFTokenizer
from engine.types import Pooling

# llama.h's llama_pooling_type values as stored in `{arch}.pooling_type`
_POOLING = {0: Pooling.NONE, 1: Pooling.MEAN, 2: Pooling.CLS, 3: Pooling.LAST, 4: Pooling.RANK}


class GGUFFormat:
    """One .gguf file; `file` is its parsed header (metadata and tensor directory, data memory-mapped)."""

    name = "gguf"

    def __init__(self, file: GGUFFile):
        self.file = file

    @classmethod
    def require(cls, path: Path, given: str) -> None:
        with path.open("rb") as f:
            if f.read(4) != MAGIC:
                raise CheckpointNotFound(f"{given}: a file that is not GGUF; -m takes a .gguf file or a "
                                         f"Hugging Face model folder")

    @classmethod
    def read(cls, path: Path, label: str = "") -> Checkpoint:
        """`label` is how the user named the file (llama-server reports the -m path as typed; default: the path)."""
        gguf = GGUFFile(path)
        if int(gguf.metadata.get("split.count", 1)) > 1:
            raise UnsupportedCheckpoint(f"{path}: a GGUF split into {gguf.metadata['split.count']} files is not "
                                        f"supported; merge it first (llama-gguf-split --merge)")
        arch = gguf.architecture
        mapping = for_architecture(arch, str(path))
        shapes = {name: info.shape for name, info in gguf.tensors.items()}
        try:
            config = mapping.config(gguf.metadata, arch, shapes)
        except KeyError as exc:
            raise UnsupportedCheckpoint(f"{path}: GGUF metadata {exc.args[0]!r} is missing") from None
        labels = gguf.arch_value("classifier.output_labels")
        if labels is not None and len(labels):  # llama.cpp's n_cls_out: the converter's id2label, in id order
            config["id2label"] = {str(i): str(label) for i, label in enumerate(labels)}
        stored = gguf.arch_value("pooling_type")
        if stored is not None and int(stored) not in _POOLING:
            raise UnsupportedCheckpoint(f"{path}: pooling_type {stored} is not supported")
        pooling = _POOLING[int(stored)] if stored is not None else None
        return Checkpoint(
            path=path, config=config, pooling=None if pooling is Pooling.RANK else pooling,  # rank: the head's
            tokenizer_config=special_tokens(gguf.metadata, str(path)),
            max_seq_length=int(gguf.arch_value("context_length", 0)) or None,
            label=label or str(path), format=cls(gguf))

    def open_tokenizer(self, checkpoint: Checkpoint) -> GGUFTokenizer:
        return GGUFTokenizer(checkpoint, self.file)

    def kind_of(self, checkpoint: Checkpoint, rank: bool = False) -> str:
        """A file with llama.cpp's classifier output is a cross-encoder (served with --reranking)."""
        return registry.CROSS_ENCODER if load.is_reranker(self.file) else registry.EMBEDDER

    def load(self, checkpoint: Checkpoint, kind: str, dtype: str = "auto",
             keep_quantized: bool = False) -> registry.LoadedModel:
        """The same families, weights named by the file's map; identity counted as llama.cpp does. Block
        formats are dequantized at load (MLX has no kernels for GGML's blocks), but a Q4_0 / Q4_1 / Q8_0 token
        table, which MLX's quantized embedding reads as it is (load.LOOKUP_TABLES): keep_quantized does not
        apply."""
        if checkpoint.splade is not None:
            raise UnsupportedCheckpoint(f"{checkpoint.display_path}: SPLADE pooling is not supported for a GGUF file "
                                        f"(its masked-LM head is not in llama.cpp's format); serve the "
                                        f"sentence-transformers folder")
        model, trunk, name, projection = load.build(checkpoint, self.file, dtype)
        n_params, size = load.file_counts(self.file)
        resident = weights.size(model)[1] + (weights.size(projection)[1] if projection is not None else 0)
        # llama.cpp: a file without a pooling_type gives per-token vectors unless --pooling says otherwise
        return registry.LoadedModel.of(model, trunk, projection=projection, family=name, kind=kind,
                                       n_params=n_params, size_bytes=size, ftype=load.ftype(self.file),
                                       default_pooling=Pooling.NONE,
                                       scores_are_probabilities=isinstance(model, RankHead)
                                       and model.scores_are_probabilities,
                                       weights=weights.placement(load.is_quantized(self.file), False,
                                                                 weights.module_dtype(model), model),
                                       resident_bytes=resident)


def special_tokens(meta: dict[str, Any], source: str) -> dict[str, str | None]:
    """tokenizer_config.json's bos/eos/pad tokens for a GGUF file: the ids llama.cpp uses (the file's, else its
    tokenizer model's defaults), as text; None where llama has no such token."""
    tokens = meta.get("tokenizer.ggml.tokens") or []
    rules = vocab.special_rules(meta, source)
    return {name: tokens[i] if i is not None else None
            for name, i in (("bos_token", rules.bos_id), ("eos_token", rules.eos_id), ("pad_token", rules.pad_id))}
