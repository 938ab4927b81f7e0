"""Generative rerankers whose prompts hold images: the contract a family's pair builder meets.

`engine/multimodal/builders/<family>_reranker.py` defines `input_builder(checkpoint, tokenizer) -> PairBuilder` (the
registry finds it by that name when the checkpoint is served as a generative reranker). The engine hands it the
query and each document as ordered parts (str text pieces and decoded `PIL.Image.Image`s) through `side`, once
per request, then asks for one prompt per document through `pair`: a `PreparedInput` (engine/multimodal/inputs.py) whose ids
hold every image token, its images in prompt order. A pair with images runs alone in its pass through the
model's `embed_with_images`; a text-only pair batches with the others; the score is read at the last position.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.multimodal.inputs import PreparedImage, PreparedInput

if TYPE_CHECKING:
    from PIL.Image import Image


@dataclass(frozen=True)
class RerankSide:
    """The query or one document, ready for pairs: the prompt template's content items and the processed
    images, in order."""

    content: tuple[dict, ...]
    images: tuple[PreparedImage, ...]


class PairBuilder(ABC):
    @abstractmethod
    def side(self, parts: Sequence[str | Image]) -> RerankSide:
        """Text pieces and decoded images, in order -> content items and processed images (raise
        engine.multimodal.images.InvalidImage for an image the processor cannot take)."""

    @abstractmethod
    def pair(self, query: RerankSide, document: RerankSide, instruction: str | None,
             limit: int | None = None) -> PreparedInput:
        """The pair's prompt; over `limit` tokens its texts are cut to fit (None: never cut)."""
