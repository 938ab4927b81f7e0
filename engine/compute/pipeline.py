"""One checkpoint's compute on padded numpy batches: trunk + pooling, or a scoring head. Engine thread only."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.errors import UnsupportedCheckpoint
from engine.compute.pooling import pool, pool_segments, splade
from engine.types import Pooling
from engine.multimodal.inputs import PreparedImage, to_device

Collect = Callable[[], list[np.ndarray]]


class Pipeline(ABC):
    """launch() builds the graph and starts evaluating it; the returned collect() waits and splits rows.

    The engine thread assembles the next batch between the two. Calling the pipeline does both at once.
    """

    @abstractmethod
    def launch(self, ids: np.ndarray, mask: np.ndarray, type_ids: np.ndarray, lengths: list[int]) -> Collect:
        """Start the pass for [B, W] right-padded rows. An embedder whose family has task adapters also takes
        `task=` (the pass's adapter index; engine/runtime/worker.py passes it only when one is chosen)."""

    def __call__(self, ids: np.ndarray, mask: np.ndarray, type_ids: np.ndarray,
                 lengths: list[int]) -> list[np.ndarray]:
        return self.launch(ids, mask, type_ids, lengths)()


def _started(out: mx.array) -> mx.array:
    mx.async_eval(out)
    return out


class EmbeddingPipeline(Pipeline):
    """projection: the checkpoint's Dense modules, applied to the pooled vector (engine/loading/heads.py).
    Pooling.SPLADE: the model is a masked LM (logits [B, L, vocab]) pooled as `splade` (strategy, activation)
    says (engine/checkpoint.py Splade)."""

    def __init__(self, model: nn.Module, pooling: Pooling, projection: nn.Module | None = None,
                 splade: tuple[str, str] = ("max", "relu")):
        if projection is not None and pooling is Pooling.NONE:
            raise UnsupportedCheckpoint("pooling 'none' is not supported for a checkpoint with Dense modules "
                                        "(they project the pooled vector)")
        self.model = model
        self.pooling = pooling
        self.projection = projection
        self.splade = splade
        self.pools_itself = model.pools_itself  # the family's own head gives [B, D] (engine/families/base.py Trunk)
        # last-token pooling reads one position per row: a family that can computes its last layer there only
        self.last_rows_only = pooling is Pooling.LAST and bool(getattr(model, "computes_needed_rows", False))

    def launch(self, ids: np.ndarray, mask: np.ndarray, type_ids: np.ndarray, lengths: list[int],
               task: int | None = None) -> Collect:
        """[B, W] right-padded -> one float32 vector [D] per row ([n_i, D] for pooling none). `task`: the index
        of the task adapter every row of the pass uses (families with task adapters: jina-embeddings-v3)."""
        mask_mx = mx.array(mask)
        extra = {} if task is None else {"task": task}
        if self.last_rows_only:
            last = mx.array(np.asarray(lengths, dtype=np.int32) - 1)
            hidden = self.model(mx.array(ids), mask_mx, mx.array(type_ids), needed=last, **extra)  # [B, 1, D]
            return self._pooled(hidden, mx.ones((len(lengths), 1), dtype=mx.int32), lengths)
        return self._pooled(self.model(mx.array(ids), mask_mx, mx.array(type_ids), **extra), mask_mx, lengths)

    def launch_with_images(self, ids: np.ndarray, images: tuple[PreparedImage, ...]) -> Collect:
        """One vision-language input, ids [1, L] with its images expanded (engine/multimodal/inputs.py) -> its vector
        ([L, D] for pooling none and multi-vector models), pooled exactly as a text row."""
        length = ids.shape[1]
        hidden = self.model.embed_with_images(mx.array(ids), to_device(images))
        return self._pooled(hidden, mx.ones((1, length), dtype=mx.int32), [length])

    @property
    def pools_segments(self) -> bool:
        """Whether launch_segments can serve this model (it pools hidden states itself, one vector per input)."""
        return not self.pools_itself and self.pooling not in (Pooling.NONE, Pooling.RANK, Pooling.SPLADE)

    def launch_segments(self, ids: np.ndarray, type_ids: np.ndarray,
                        segments: tuple[tuple[int, ...], ...], task: int | None = None) -> Collect:
        """Late chunking: one input, ids [1, L], in one pass; each segment (a chunk's rows) pooled as an input
        is, then projected -> one [S, D] array. `task` as launch takes it."""
        length = ids.shape[1]
        extra = {} if task is None else {"task": task}
        hidden = self.model(mx.array(ids), mx.ones((1, length), dtype=mx.int32), mx.array(type_ids), **extra)
        pooled = pool_segments(hidden[0], segments, self.pooling)
        if self.projection is not None:
            pooled = self.projection(pooled).astype(mx.float32)
        pooled = _started(pooled)
        return lambda: [np.array(pooled)]

    def _pooled(self, hidden: mx.array, mask_mx: mx.array, lengths: list[int]) -> Collect:
        if self.pools_itself:
            pooled = _started(hidden.astype(mx.float32))
            return lambda: list(np.array(pooled))
        if self.pooling is Pooling.NONE:
            tokens = _started(hidden.astype(mx.float32))
            return lambda: [row[:n] for row, n in zip(np.array(tokens), lengths)]
        if self.pooling is Pooling.SPLADE:
            pooled = splade(hidden, mask_mx, *self.splade)
        else:
            pooled = pool(hidden, mask_mx, self.pooling)
        if self.projection is not None:
            pooled = self.projection(pooled).astype(mx.float32)
        pooled = _started(pooled)
        return lambda: list(np.array(pooled))

    def launch_images(self, pixels: np.ndarray) -> Collect:
        """[B, C, H, W] preprocessed images -> one float32 vector [D] per image (the vision tower's head)."""
        pooled = _started(self.model.embed_images(mx.array(pixels)).astype(mx.float32))
        return lambda: list(np.array(pooled))


class CrossEncoderPipeline(Pipeline):
    """A sequence classifier with one label: the raw logit per (query, document) row. A GGUF reranker's head with
    several outputs (llama.cpp's n_cls_out): the row of them, which reranking reads the first of."""

    def __init__(self, model: nn.Module):
        self.model = model

    def launch(self, ids: np.ndarray, mask: np.ndarray, type_ids: np.ndarray, lengths: list[int]) -> Collect:
        logits = _started(self.model(mx.array(ids), mx.array(mask), mx.array(type_ids)).astype(mx.float32))
        return lambda: list(np.array(logits)[:, 0]) if logits.shape[1] == 1 else list(np.array(logits))


class ClassifierPipeline(Pipeline):
    """A sequence classifier with several labels: the raw logits [labels] per row (engine/compute/labels.py
    turns them into probabilities)."""

    def __init__(self, model: nn.Module):
        self.model = model

    def launch(self, ids: np.ndarray, mask: np.ndarray, type_ids: np.ndarray, lengths: list[int]) -> Collect:
        logits = _started(self.model(mx.array(ids), mx.array(mask), mx.array(type_ids)).astype(mx.float32))
        return lambda: list(np.array(logits))


class GenerativeRerankPipeline(Pipeline):
    """A causal LM scored by the yes/no recipe: sigmoid(logit_yes - logit_no) at the last position.

    Only the final hidden state of the last position meets the LM head, and only its two rows: the
    difference of the logits is h . (W_yes - W_no), so no [B, L, vocab] tensor is ever built.
    """

    def __init__(self, model: nn.Module, yes_id: int, no_id: int, pad_id: int):
        rows = model.head_rows([yes_id, no_id])
        self.model = model
        self.direction = rows[0] - rows[1]
        self.pad_id = pad_id

    def launch(self, ids: np.ndarray, mask: np.ndarray, type_ids: np.ndarray, lengths: list[int]) -> Collect:
        # Rows arrive right-padded; decoders take them left-padded so every row ends at the last position.
        width = ids.shape[1]
        left_ids = np.full_like(ids, self.pad_id)
        left_mask = np.zeros_like(mask)
        for row, n in enumerate(lengths):
            left_ids[row, width - n:] = ids[row, :n]
            left_mask[row, width - n:] = 1
        if getattr(self.model, "computes_needed_rows", False):  # only the last position meets the head
            last = mx.full((len(lengths),), width - 1, dtype=mx.int32)
            return self._scored(self.model(mx.array(left_ids), mx.array(left_mask), needed=last)[:, -1, :])
        return self._scored(self.model(mx.array(left_ids), mx.array(left_mask))[:, -1, :])

    def launch_with_images(self, ids: np.ndarray, images: tuple[PreparedImage, ...]) -> Collect:
        """One prompt holding images, ids [1, L] with its image tokens (engine/multimodal/pairs.py) -> its score."""
        return self._scored(self.model.embed_with_images(mx.array(ids), to_device(images))[:, -1, :])

    def _scored(self, hidden: mx.array) -> Collect:
        scores = _started(mx.sigmoid(hidden.astype(mx.float32) @ self.direction.astype(mx.float32)))
        return lambda: list(np.array(scores))
