"""/embedding, /embeddings and /v1/embeddings bodies (docs/llama-server-contract.md §3). Pure: no falcon.

The engine finishes the vectors (`dimensions`, then `embd_normalize`, engine/compute/normalize.py); this module
parses the request and writes them. A multi-vector (late-interaction) model answers one [n_tokens, d] list of
rows per input on every route: the rows the model L2-normalized one by one, image tokens included, padding
trimmed; `embd_normalize` does not apply to them (as llama's per-token rows with pooling none) and `dimensions`
is refused. base64 packs the rows row-major as float32.

Our extension of OpenAI's `encoding_format` (OAI shape only): "int8", "uint8", "binary", "ubinary" answer each
vector as a list of integer codes, made by engine/compute/quantize.py (the scheme is documented there and in
docs/routes.md), with `"encoding_format"` echoed in the item as base64 is.

Vectors leave as float64 numpy arrays so orjson (OPT_SERIALIZE_NUMPY) prints each float32 widened to double in
shortest round-trip form, as llama-server does, without a per-float Python loop; NaN/Inf print as null.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from compat.errors import bad_request
from compat.wire.inputs import (
    Prompt,
    parse_input_prompts,
    parse_late_chunking,
    parse_task,
    parse_truncation_direction,
    whole,
)
from engine import QUANTIZED_TYPES, check_dimensions, quantize
from engine.types import EmbedResult

NO_INPUT = '"input" or "content" must be provided'
BAD_FORMAT = "The format to return the embeddings in. Can be either float or base64"  # llama's words
ENCODING_FORMATS = ("float", "base64", *QUANTIZED_TYPES)
BAD_PROMPT_NAME = '"prompt_name" must be a string naming one of the model\'s prompts'
BAD_INSTRUCTION = '"instruction" must be a non-empty string'


@dataclass(frozen=True)
class EmbeddingsRequest:
    prompts: list[Prompt]
    oai: bool  # OAI response shape: the /v1 route AND the `input` field (`content` forces llama's shape)
    encoding_format: str  # "float" | "base64" | a QUANTIZED_TYPES code; only the OAI shape honours it
    embd_normalize: int
    truncate: bool | None  # None: the server's --truncate default
    model: str | None  # echoed when the request named one as a string
    prompt_name: str | None = None  # a prompt of the model's config_sentence_transformers.json
    instruction: str | None = None  # fills the family's instruction template
    dimensions: int | None = None  # keep the first N components (Matryoshka), before normalizing
    late_chunking: bool = False  # the inputs are consecutive chunks of one document (Jina's late chunking)
    truncation_direction: str = "right"  # TEI's: "left" keeps an over-long input's end
    task: str | None = None  # a task adapter (jina-embeddings-v3); None: prompt_name's task, else the default


def parse_embeddings_request(body: dict[str, Any], *, oai_route: bool, default_normalize: int,
                             width: int, takes_images: bool = False, multi_vector: bool = False) -> EmbeddingsRequest:
    """Checks in llama's order (§3.1 steps 4, 5, 8), then our fields; llama's type-error 500s are 400s here (§13).

    width: the model's embedding width, the most `dimensions` may keep; takes_images: whether it embeds images;
    multi_vector: it answers one row per token (then `dimensions` is refused).
    """
    if "input" in body:
        prompts, oai = parse_input_prompts(body["input"], takes_images), oai_route
    elif "content" in body:
        prompts, oai = parse_input_prompts(body["content"], takes_images), False
    else:
        raise bad_request(NO_INPUT)

    encoding_format = body.get("encoding_format", "float")
    if not isinstance(encoding_format, str) or encoding_format not in ENCODING_FORMATS:
        raise bad_request(BAD_FORMAT)

    embd_normalize = whole(body.get("embd_normalize", default_normalize))
    if not isinstance(embd_normalize, int) or isinstance(embd_normalize, bool):
        raise bad_request('"embd_normalize" must be an integer')

    truncate = body.get("truncate")
    if truncate is not None and not isinstance(truncate, bool):
        raise bad_request('"truncate" must be a boolean')

    prompt_name = body.get("prompt_name")
    if prompt_name is not None and not isinstance(prompt_name, str):
        raise bad_request(BAD_PROMPT_NAME)
    instruction = body.get("instruction")
    if instruction is not None and (not isinstance(instruction, str) or not instruction):
        raise bad_request(BAD_INSTRUCTION)
    dimensions = whole(body.get("dimensions"))
    check_dimensions(dimensions, width, multi_vector)

    model = body.get("model")
    return EmbeddingsRequest(prompts=prompts, oai=oai, encoding_format=encoding_format,
                             embd_normalize=embd_normalize, truncate=truncate,
                             model=model if isinstance(model, str) else None,
                             prompt_name=prompt_name, instruction=instruction, dimensions=dimensions,
                             late_chunking=parse_late_chunking(body),
                             truncation_direction=parse_truncation_direction(body), task=parse_task(body))


def _rows(vector: np.ndarray) -> np.ndarray:
    """llama's non-OAI `embedding`: pooled -> [[vector]]; pooling none -> its per-token rows."""
    if vector.ndim == 1:
        return vector.astype(np.float64)[np.newaxis, :]
    return np.asarray(vector, dtype=np.float64)


def _oai_item(vector: np.ndarray, index: int, request: EmbeddingsRequest) -> dict[str, Any]:
    if request.encoding_format == "base64":
        raw = np.asarray(vector, dtype="<f4").tobytes()
        return {"embedding": base64.b64encode(raw).decode("ascii"), "index": index, "object": "embedding",
                "encoding_format": "base64"}
    if request.encoding_format in QUANTIZED_TYPES:
        return {"embedding": quantize(vector, request.encoding_format), "index": index, "object": "embedding",
                "encoding_format": request.encoding_format}
    return {"embedding": vector.astype(np.float64), "index": index, "object": "embedding"}


def render_embeddings_response(request: EmbeddingsRequest, result: EmbedResult,
                               model_name: str) -> list[dict[str, Any]] | dict[str, Any]:
    if not request.oai:
        return [{"index": i, "embedding": _rows(vector)} for i, vector in enumerate(result.vectors)]
    n_tokens = sum(result.n_tokens)
    return {"model": request.model if request.model is not None else model_name,
            "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "data": [_oai_item(vector, i, request) for i, vector in enumerate(result.vectors)]}
