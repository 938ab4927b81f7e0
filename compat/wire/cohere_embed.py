"""Cohere's /v1/embed and /v2/embed bodies (the `cohere` SDK's `Client.embed` and `ClientV2.embed`). Pure: no falcon.

Request: `texts` (a non-empty list of strings), `model`, `input_type`, `embedding_types`, `output_dimension`,
`truncate`. Vectors are L2-normalized, as Cohere's are, after the `output_dimension` cut (Matryoshka).

- `input_type` picks one of the checkpoint's named prompts (config_sentence_transformers.json): the first of
  INPUT_TYPE_PROMPTS[input_type] the model has (search_query: "search_query", "query"; search_document:
  "search_document", "document", "passage", "corpus"; classification: "classification"; clustering:
  "clustering"), else the model's default prompt, as a request without `input_type` gets. A model with task
  adapters (jina-embeddings-v3) also runs the adapter TASK_FOR_INPUT_TYPE names (search_query: retrieval.query,
  search_document: retrieval.passage, classification: classification, clustering: separation), unless `task`
  (ours, as on every embedding route) names one.
- `embedding_types`: float, int8, uint8, binary, ubinary (engine/compute/quantize.py makes the codes: a fixed
  linear scale for int8 / uint8, sentence-transformers' packing for binary / ubinary) and base64 (each float32
  vector's little-endian bytes, base64-encoded).
- `truncate`: END (the default) cuts a long text at its end, START at its start (the engine's
  truncation_direction "left": the end is kept), NONE refuses it.

Answers: v1 without `embedding_types` {"id","texts","embeddings":[[float]],"meta","response_type":
"embeddings_floats"}, with them the by-type object and "embeddings_by_type"; v2 {"id","texts","embeddings":
{type: [...]},"meta"} (float when no types are asked). `meta` is {"api_version":{"version"},"billed_units":
{"input_tokens"}}. Errors are Cohere's {"message": ...} (CohereError).
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from compat.errors import ApiError
from compat.wire.inputs import BAD_LATE_CHUNKING, whole
from engine import QUANTIZED_TYPES, quantize
from engine.types import EmbedResult

INPUT_TYPE_PROMPTS: dict[str, tuple[str, ...]] = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", "document", "passage", "corpus"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
EMBEDDING_TYPES = ("float", *QUANTIZED_TYPES, "base64")
TRUNCATE = ("NONE", "START", "END")

BAD_TEXTS = '"texts" must be a non-empty list of strings'
BAD_INPUT_TYPE = f'"input_type" must be one of {", ".join(INPUT_TYPE_PROMPTS)}'
BAD_EMBEDDING_TYPES = f'"embedding_types" must be a non-empty list of {", ".join(EMBEDDING_TYPES)}'
BAD_OUTPUT_DIMENSION = '"output_dimension" must be an integer from 1 to {width} (the model\'s embedding width)'
BAD_TRUNCATE = '"truncate" must be one of NONE, START, END'
NO_IMAGES = '"{key}" is not supported on /{version}/embed here: send texts in "texts"'


class CohereError(ApiError):
    """An error in Cohere's envelope: {"message": ...}, with the status it maps to."""

    def body(self) -> dict[str, Any]:
        return {"message": self.message}


def cohere_error(error: ApiError) -> CohereError:
    return CohereError(error.status, error.type, error.message)


def _bad(message: str) -> CohereError:
    return CohereError(400, "invalid_request_error", message)


@dataclass(frozen=True)
class CohereEmbedRequest:
    texts: list[str]
    version: int  # 1 or 2
    embedding_types: tuple[str, ...] | None  # None: v1's legacy float list (v2 answers float by type)
    prompt_name: str | None  # the checkpoint prompt input_type maps to; None: the model's default
    dimensions: int | None
    truncate: bool  # END and START: True, NONE: False
    truncation_direction: str = "right"  # START: "left" (a cut keeps the text's end)
    late_chunking: bool = False  # our extension, as on every embedding route: the texts are chunks of one document
    task: str | None = None  # the task adapter (`task`, else input_type's); None: the model's default


# input_type -> the jina-embeddings-v3 task adapter that serves it (the model card's task descriptions)
TASK_FOR_INPUT_TYPE = {"search_query": "retrieval.query", "search_document": "retrieval.passage",
                       "classification": "classification", "clustering": "separation"}


def task_for(task: Any, input_type: str | None, task_names: list[str]) -> str | None:
    """`task` as given (the engine refuses one the model lacks), else input_type's task when the model has it."""
    if task is not None:
        if not isinstance(task, str):
            raise _bad('"task" must be a string naming one of the model\'s task adapters')
        return task
    name = TASK_FOR_INPUT_TYPE.get(input_type or "")
    return name if name in task_names else None


def prompt_for_input_type(input_type: str | None, prompt_names: list[str]) -> str | None:
    if input_type is None:
        return None
    return next((name for name in INPUT_TYPE_PROMPTS[input_type] if name in prompt_names), None)


def parse_cohere_embed_request(body: dict[str, Any], *, version: int, width: int,
                               prompt_names: list[str], task_names: list[str] = ()) -> CohereEmbedRequest:
    """width: the model's embedding width; prompt_names: its named prompts; task_names: its task adapters."""
    for key in ("images", "inputs"):
        if body.get(key) is not None:
            raise _bad(NO_IMAGES.format(key=key, version=f"v{version}"))
    texts = body.get("texts")
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise _bad(BAD_TEXTS)

    input_type = body.get("input_type")
    if input_type is not None and (not isinstance(input_type, str) or input_type not in INPUT_TYPE_PROMPTS):
        raise _bad(BAD_INPUT_TYPE)

    types = body.get("embedding_types")
    if types is not None:
        if not isinstance(types, list) or not types or any(not isinstance(t, str) or t not in EMBEDDING_TYPES
                                                           for t in types):
            raise _bad(BAD_EMBEDDING_TYPES)
        types = tuple(dict.fromkeys(types))
    elif version == 2:
        types = ("float",)

    dimensions = whole(body.get("output_dimension"))
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                   or not 1 <= dimensions <= width):
        raise _bad(BAD_OUTPUT_DIMENSION.format(width=width))

    truncate = body.get("truncate", "END")
    if truncate is None:
        truncate = "END"
    if not isinstance(truncate, str) or truncate.upper() not in TRUNCATE:
        raise _bad(BAD_TRUNCATE)
    late_chunking = body.get("late_chunking")
    if late_chunking is not None and not isinstance(late_chunking, bool):
        raise _bad(BAD_LATE_CHUNKING)
    return CohereEmbedRequest(texts=texts, version=version, embedding_types=types,
                              prompt_name=prompt_for_input_type(input_type, prompt_names),
                              dimensions=dimensions, truncate=truncate.upper() != "NONE",
                              truncation_direction="left" if truncate.upper() == "START" else "right",
                              late_chunking=bool(late_chunking),
                              task=task_for(body.get("task"), input_type, list(task_names)))


def _by_type(vectors: np.ndarray, kind: str) -> Any:
    if kind == "float":
        return vectors.astype(np.float64)
    if kind == "base64":
        return [base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii") for v in vectors]
    return quantize(vectors, kind)


def render_cohere_embed_response(request: CohereEmbedRequest, result: EmbedResult, *,
                                 response_id: str) -> dict[str, Any]:
    vectors = np.stack([np.asarray(v, dtype=np.float32) for v in result.vectors])
    meta = {"api_version": {"version": str(request.version)},
            "billed_units": {"input_tokens": sum(result.n_tokens)}}
    if request.embedding_types is None:  # v1's legacy answer
        return {"id": response_id, "texts": request.texts, "embeddings": vectors.astype(np.float64), "meta": meta,
                "response_type": "embeddings_floats"}
    embeddings = {kind: _by_type(vectors, kind) for kind in request.embedding_types}
    answer = {"id": response_id, "texts": request.texts, "embeddings": embeddings, "meta": meta}
    if request.version == 1:
        answer["response_type"] = "embeddings_by_type"
    return answer
