"""Vision-language inputs: text pieces and images, in the order a request gave them, fed to a decoder family.

The contract a family (model math in engine/families/<name>.py, named after its model_type) meets to embed
such inputs:

1. `engine/multimodal/builders/<name>.py` defines `input_builder(checkpoint, tokenizer) -> InputBuilder` (the registry
   finds it by that name; family files import only MLX, so the processor lives there). The builder owns the family's
   prompt format and image processor. `build(parts, instruction)` turns an input's ordered parts (str text
   pieces and decoded `PIL.Image.Image`s) into a `PreparedInput`: the token ids of the whole prompt, with each
   image's placeholder already expanded to the run of image tokens the reference processor makes, and one
   `PreparedImage` per image in prompt order (its preprocessed arrays, and how many of the ids it covers). It
   runs on the request thread, never the engine thread; a text-only input goes through it too (the family
   decides what a query looks like). `instruction` is the request's `instruction` (or the text of its
   `prompt_name` / the default prompt); a builder whose `takes_instruction` is False never receives one (the
   engine refuses it first). Raise `engine.multimodal.images.InvalidImage` for an image the processor cannot take. A
   builder (or a reranker's pair builder) whose images get a dynamic resolution keeps its
   `engine.multimodal.qwen_images.QwenImageProcessor` as `processor`: at load the engine replaces it with one bounded by
   --image-min-tokens / --image-max-tokens.
2. The family file's `Model` (what the checkpoint format's load builds) takes text-only batches as every family does,
   `model(ids [B, L], mask [B, L], type_ids) -> [B, L, D]`, and inputs holding images through
   `model.embed_with_images(ids [1, L], images: list[dict[str, mx.array]]) -> [1, L, D]`: one input per call
   (DeepStack and M-RoPE positions are per sequence), its images' arrays in prompt order; the method runs the
   vision tower and connector and scatters the features into the placeholder positions of the token
   embeddings before the decoder. Pooling (last / mean / cls) and Dense heads stay the pipeline's.
3. A late-interaction family sets `multi_vector = True` on its Model: both calls then return per-token vectors
   with the family's projection and per-token L2 norm already applied ([B, L, d]); the engine serves it with
   pooling none, trims padding rows and answers one [n_tokens, d] list per input (and MaxSim, engine/compute/maxsim.py).
   Its `projection_prefix` names the projection module (e.g. "linear."): a Dense folder beside the checkpoint
   (modules.json, or 1_Dense) replaces those weights, as sentence-transformers loads a trained projection.

The worker runs an input that holds images alone in its pass; text-only inputs batch as usual. Every image
token counts: in the input's length (checked against the per-input limit, never truncated), the batch
budget, `usage` and /metrics.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from engine.checkpoint import read_json_optional
from engine.errors import InvalidInput, UnsupportedCheckpoint

if TYPE_CHECKING:
    from pathlib import Path

    from PIL.Image import Image

    from engine.checkpoint import Checkpoint
    from engine.text.tokenizer import TextTokenizer


@dataclass(frozen=True)
class PreparedImage:
    """One image as the model's vision tower takes it: the processor's arrays (e.g. `pixel_values` [n_tiles,
    C, H, W]) and the number of placeholder tokens of the prompt its features fill (the prompt may frame them
    with more tokens of its own: tile markers, newlines; those count as text)."""

    arrays: dict[str, np.ndarray]
    n_tokens: int


@dataclass(frozen=True)
class PreparedInput:
    """A vision-language input ready for the engine: the whole prompt's token ids, images expanded."""

    ids: list[int]
    images: tuple[PreparedImage, ...] = field(default=())

    @property
    def image_tokens(self) -> int:
        return sum(image.n_tokens for image in self.images)


class InputBuilder(ABC):
    """A family's prompt format and image processor (see the module docstring)."""

    takes_instruction: bool = False

    @abstractmethod
    def build(self, parts: Sequence[str | Image], instruction: str | None = None) -> PreparedInput:
        """Ordered text pieces and decoded images -> token ids (images expanded) and the images' arrays."""


class RetrieverInputs(InputBuilder):
    """colpali-engine's prompt recipe, shared by its retrievers (ColIdefics3, ColQwen2.5). An input of text only
    is a query: query_prefix + text + query_suffix (augmentation tokens that give MaxSim more vectors). An input
    holding images is a document: document_prefix, its parts in order (each image as the run of image tokens
    image() makes), document_text when the input has no text of its own, document_suffix; the whole text is
    tokenized at once, as the reference processors do."""

    query_prefix = ""
    query_suffix: str
    document_prefix: str
    document_text: str
    document_suffix: str
    image_token: str

    def __init__(self, tokenizer, image_token_id: int):
        self.tokenizer = tokenizer
        self.image_token_id = image_token_id

    @abstractmethod
    def image(self, image: Image) -> tuple[PreparedImage, str]:
        """One decoded image -> its arrays and the prompt text that stands for it."""

    def build(self, parts: Sequence[str | Image], instruction: str | None = None) -> PreparedInput:
        texts = [part for part in parts if isinstance(part, str)]
        if len(texts) == len(parts):
            return PreparedInput(self._ids(self.query_prefix + "".join(texts) + self.query_suffix, 0))
        images, pieces = [], []
        for part in parts:
            if isinstance(part, str):
                pieces.append(part)
                continue
            prepared, piece = self.image(part)
            images.append(prepared)
            pieces.append(piece)
        body = "".join(pieces) if "".join(texts).strip() else "".join(pieces) + self.document_text
        ids = self._ids(self.document_prefix + body + self.document_suffix, sum(i.n_tokens for i in images))
        return PreparedInput(ids, tuple(images))

    def _ids(self, text: str, n_image_tokens: int) -> list[int]:
        return encode_prompt(self.tokenizer, text, self.image_token, self.image_token_id, n_image_tokens)


def to_device(images: Sequence[PreparedImage]) -> list[dict[str, mx.array]]:
    """The images' arrays as MLX arrays, in prompt order (what embed_with_images takes)."""
    return [{name: mx.array(array) for name, array in image.arrays.items()} for image in images]


def encode_prompt(tokenizer: TextTokenizer, text: str, image_token: str, image_token_id: int,
                  n_image_tokens: int) -> list[int]:
    """A built prompt's token ids, refused when they hold other image tokens than the images' own (a caller's
    text spelling the image token would otherwise take image features meant for other positions)."""
    ids = tokenizer.encode(text)
    if sum(1 for i in ids if i == image_token_id) != n_image_tokens:
        raise InvalidInput(f"the text holds the image token {image_token}, which only an image may stand for")
    return ids


def check_prompt_tokens(folder: Path, tokenizer: TextTokenizer, markers: Sequence[str], image_token: str,
                        image_token_id: int) -> None:
    """Each marker a family's prompts use must be one token, and the image token the config's id."""
    for token in markers:
        if len(tokenizer.encode(token, add_special=False)) != 1:
            raise UnsupportedCheckpoint(f"{folder}: the tokenizer has no single token {token}")
    if tokenizer.encode(image_token, add_special=False) != [image_token_id]:
        raise UnsupportedCheckpoint(f"{folder}: {image_token} is not the image token id {image_token_id} of config.json")


def query_format(checkpoint: Checkpoint, prefix: str, augmentation_token: str) -> tuple[str, str]:
    """A colpali retriever's query prefix and augmentation token: the checkpoint's own `query_prefix` /
    `query_augmentation_token` (processor_config.json, as transformers' ColQwen2Processor saves it, then
    preprocessor_config.json; an empty one is the default, as transformers reads it), else the given defaults
    (the family's training releases)."""
    found = {}
    for name in ("preprocessor_config.json", "processor_config.json"):  # the latter wins
        path = checkpoint.path / name
        config = read_json_optional(path)
        for key in ("query_prefix", "query_augmentation_token"):
            value = config.get(key)
            if value is None or value == "":  # transformers' ColQwen2Processor: `query_prefix or "Query: "`
                continue
            if not isinstance(value, str):
                raise UnsupportedCheckpoint(f"{path}: {key} must be a string, not {value!r}")
            found[key] = value
    return found.get("query_prefix", prefix), found.get("query_augmentation_token", augmentation_token)
