"""Text Embeddings Inference's native bodies: POST /embed, /embed_all, /similarity, POST / (what
`huggingface_hub.InferenceClient(base_url)` posts), GET /info, and TEI's error body. Pure: no falcon.

Fields and shapes follow TEI's router/src/http/types.rs and server.rs:
- /embed: `inputs` (a string, a list of them, token ids, or a list of token-id lists), `normalize` (default
  true), `truncate` (null: the server's --truncate, TEI's --auto-truncate), `truncation_direction`
  (`Right`/`right`, the default; `Left`/`left` cuts an input's start), `prompt_name`, `dimensions`
  -> a bare `[[float]]`;
- /embed_all: the same minus `normalize` / `dimensions` -> `[[[float]]]`, each input's per-token rows (a model
  served with --pooling none; any other answers TEI's error naming it);
- /tokenize with `inputs` (llama's `content` body keeps llama's answer): `add_special_tokens` (default true),
  `prompt_name` -> per input [{"id", "text", "special", "start", "stop"}], offsets in UTF-8 bytes of the
  (prompted) text, special tokens with their own text and null offsets; /decode: `ids` (one list or a list
  of lists), `skip_special_tokens` (default true) -> one string per list;
- /similarity: `inputs: {source_sentence, sentences}` (`parameters`: `prompt_name`, `truncate`,
  `truncation_direction`, and our `task`) -> the cosine of each sentence with the source, in order;
- errors: `{"error", "error_type"}` with TEI's statuses (ErrorType in router/src/lib.rs, StatusCode in
  server.rs): Validation 413 (too long, too many inputs), Empty 400, Tokenizer 422 (bad token ids),
  Overloaded 429, Unhealthy 503, Backend 424. A body TEI's JSON extractor rejects (a field of the wrong type)
  is 422 there; here it is 422 in TEI's body, error_type Validation.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from compat.errors import ApiError, api_error_from_engine
from compat.wire.inputs import Prompt, is_token, parse_input_prompts, whole
from engine import check_dimensions
from engine.errors import (
    EmptyInput,
    EngineError,
    InputTooLong,
    InvalidTokens,
    NotLoaded,
    NotSparse,
    QueueFull,
    SparseOnly,
)
from engine.types import EmbedResult, ModelInfo, Pooling, TokenSpan

PER_TOKEN_SIMILARITY = ("/similarity compares one vector per sentence; this model gives one vector per token "
                        "(--pooling none, or a multi-vector model): serve it with a pooling (mean, cls, last)")
LATE_CHUNKING_EMBED_ALL = ('"late_chunking" pools each chunk\'s token rows into one vector; /embed_all answers the '
                           'rows themselves: late-chunk on /embed')
BAD_DIRECTION = '"truncation_direction" must be "Right" or "Left"'
EMPTY_INPUTS = "`inputs` cannot be empty"
BAD_SIMILARITY = '"inputs" must be {"source_sentence": string, "sentences": [string, ...]}'
NOT_POOLING_NONE = ("/embed_all answers per-token rows, which this server gives only for a model served with "
                    "--pooling none; this model pools with {pooling}: use /embed, or start it with --pooling none")

NOT_FOR_SPLADE = ("`embed_all` is not available for SPLADE models (this one gives one sparse vector per input: "
                  "POST /embed_sparse)")

# TEI's ErrorType -> status (server.rs)
_STATUS = {"Validation": 413, "Empty": 400, "Tokenizer": 422, "Overloaded": 429, "Unhealthy": 503, "Backend": 424}
_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


class TeiError(ApiError):
    """An error in TEI's body: {"error": message, "error_type": TEI's ErrorType}."""

    def __init__(self, error_type: str, message: str, status: int | None = None):
        super().__init__(status if status is not None else _STATUS[error_type], error_type, message)

    def body(self) -> dict[str, Any]:
        return {"error": self.message, "error_type": self.type}


@contextmanager
def tei_errors() -> Iterator[None]:
    """Any error of the block, ours or the engine's, answered in TEI's body."""
    try:
        yield
    except (ApiError, EngineError) as exc:
        raise tei_error(exc) from None


def tei_error(exc: ApiError | EngineError) -> TeiError:
    """Our error (an ApiError, or an engine error before compat/errors.py maps it) in TEI's body and status."""
    if isinstance(exc, TeiError):
        return exc
    if isinstance(exc, EngineError):
        if isinstance(exc, EmptyInput):
            return TeiError("Empty", str(exc) or EMPTY_INPUTS)
        if isinstance(exc, InvalidTokens):
            return TeiError("Tokenizer", str(exc) or "Prompt contains invalid tokens")
        if isinstance(exc, QueueFull):
            return TeiError("Overloaded", str(exc) or "Model is overloaded")
        if isinstance(exc, NotLoaded):
            return TeiError("Unhealthy", "Loading model")
        if isinstance(exc, (SparseOnly, NotSparse)):  # TEI: a Backend error (424) naming the model type
            return TeiError("Backend", str(exc))
        if isinstance(exc, InputTooLong):
            return TeiError("Validation", f"`inputs` must have less than {exc.limit} tokens. Given: "
                                          f"{exc.n_tokens} (send \"truncate\": true to cut it)")
        exc = api_error_from_engine(exc)
    if exc.status == 413 or exc.type == "exceed_context_size_error":
        return TeiError("Validation", exc.message)
    if exc.status < 500:
        return TeiError("Validation", exc.message, status=422)
    if exc.status == 503:
        return TeiError("Overloaded", exc.message)
    return TeiError("Backend", exc.message)


def _bool(body: dict[str, Any], key: str, default: bool | None) -> bool | None:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise TeiError("Validation", f'"{key}" must be a boolean', status=422)
    return value


def _truncation(body: dict[str, Any]) -> tuple[bool | None, bool]:
    """(`truncate`, None: the server's default; whether `truncation_direction` is Left)."""
    direction = body.get("truncation_direction")
    if direction is not None and direction not in ("Right", "right", "Left", "left"):
        raise TeiError("Validation", BAD_DIRECTION, status=422)
    return _bool(body, "truncate", None), direction in ("Left", "left")


def _prompt_name(body: dict[str, Any]) -> str | None:
    name = body.get("prompt_name")
    if name is not None and not isinstance(name, str):
        raise TeiError("Validation", '"prompt_name" must be a string', status=422)
    return name


@dataclass(frozen=True)
class TeiEmbedRequest:
    prompts: list[Prompt]
    embd_normalize: int  # 2 (L2) when `normalize`, else -1 (raw)
    truncate: bool | None
    prompt_name: str | None
    dimensions: int | None
    truncate_left: bool = False
    late_chunking: bool = False  # our extension, as on every embedding route (/embed only)
    task: str | None = None  # our extension, as on every embedding route: a task adapter (jina-embeddings-v3)


def _prompts(value: Any) -> list[Prompt]:
    if value is None or value == [] or value == "":
        raise TeiError("Empty", EMPTY_INPUTS)
    try:
        return parse_input_prompts(value)
    except ApiError as exc:
        raise tei_error(exc) from None


def _task(fields: dict[str, Any]) -> str | None:
    """Our `task` (a task adapter, jina-embeddings-v3): on /embed beside `inputs`, on /similarity in `parameters`."""
    task = fields.get("task")
    if task is not None and not isinstance(task, str):
        raise TeiError("Validation", '"task" must be a string', status=422)
    return task


def parse_embed_request(body: dict[str, Any], *, width: int, per_token: bool = False) -> TeiEmbedRequest:
    """/embed (per_token: /embed_all, which has no `normalize` nor `dimensions`)."""
    prompts = _prompts(body.get("inputs"))
    truncate, left = _truncation(body)
    prompt_name = _prompt_name(body)
    task = _task(body)
    late_chunking = _bool(body, "late_chunking", False)
    if per_token:
        if late_chunking:
            raise TeiError("Validation", LATE_CHUNKING_EMBED_ALL, status=422)
        return TeiEmbedRequest(prompts, -1, truncate, prompt_name, None, left, task=task)
    normalize = _bool(body, "normalize", True)
    dimensions = whole(body.get("dimensions"))
    try:
        check_dimensions(dimensions, width)
    except EngineError as exc:
        raise tei_error(exc) from None
    return TeiEmbedRequest(prompts, 2 if normalize else -1, truncate, prompt_name, dimensions, left, late_chunking,
                           task)


def render_embed_response(result: EmbedResult) -> list[np.ndarray]:
    """[[float]] for /embed; [[[float]]] (each input's rows) for /embed_all."""
    return [np.asarray(vector, dtype=np.float64) for vector in result.vectors]


def check_similarity(info: ModelInfo) -> None:
    """/similarity compares one vector per sentence: a model giving one per token cannot answer it."""
    if info.pooling is Pooling.NONE or info.multi_vector:
        raise TeiError("Backend", PER_TOKEN_SIMILARITY)


def check_embed_all(info: ModelInfo) -> None:
    if info.is_sparse:
        raise TeiError("Backend", NOT_FOR_SPLADE)
    if info.pooling is not Pooling.NONE or info.multi_vector:
        raise TeiError("Backend", NOT_POOLING_NONE.format(pooling=info.pooling.value))


@dataclass(frozen=True)
class SimilarityRequest:
    source: str
    sentences: list[str]
    truncate: bool | None
    prompt_name: str | None
    truncate_left: bool = False
    task: str | None = None


def is_similarity(body: dict[str, Any]) -> bool:
    """POST /: `inputs` as an object is a sentence-similarity request (InferenceClient.sentence_similarity)."""
    return isinstance(body.get("inputs"), dict)


def parse_similarity_request(body: dict[str, Any]) -> SimilarityRequest:
    inputs = body.get("inputs")
    if not isinstance(inputs, dict):
        raise TeiError("Validation", BAD_SIMILARITY, status=422)
    source, sentences = inputs.get("source_sentence"), inputs.get("sentences")
    if not isinstance(source, str) or not isinstance(sentences, list) \
            or not all(isinstance(s, str) for s in sentences):
        raise TeiError("Validation", BAD_SIMILARITY, status=422)
    if not source or not sentences or not all(sentences):
        raise TeiError("Empty", EMPTY_INPUTS)
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise TeiError("Validation", '"parameters" must be an object', status=422)
    truncate, left = _truncation(parameters)
    return SimilarityRequest(source, sentences, truncate, _prompt_name(parameters), left, _task(parameters))


def render_similarity_response(result: EmbedResult) -> list[float]:
    """The cosine of each sentence's vector with the source's (the first vector)."""
    vectors = np.asarray(result.vectors, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1)
    norms[norms == 0] = 1.0
    unit = vectors / norms[:, np.newaxis]
    return [float(score) for score in np.clip(unit[1:] @ unit[0], -1.0, 1.0)]


def render_info_response(info: ModelInfo, *, model_id: str, version: str, max_concurrent_requests: int,
                         max_client_batch_size: int, auto_truncate: bool, tokenization_workers: int) -> dict[str, Any]:
    """TEI's Info (router/src/lib.rs), from the loaded model and the server's settings."""
    if info.is_reranker or info.is_classifier:
        # TEI: a classifier with one class is a reranker
        labels = info.labels or ("LABEL_0",)
        model_type: dict[str, Any] = {"classifier" if info.is_classifier else "reranker": {
            "id2label": {str(i): label for i, label in enumerate(labels)},
            "label2id": {label: i for i, label in enumerate(labels)}}}
    else:
        model_type = {"embedding": {"pooling": info.pooling.value}}
    return {"model_id": model_id, "model_sha": None,
            "model_dtype": _DTYPES.get(info.ftype.upper(), info.ftype.lower()),
            "model_type": model_type, "max_concurrent_requests": max_concurrent_requests,
            "max_input_length": info.max_input_tokens, "max_batch_tokens": info.batch_tokens,
            "max_batch_requests": info.batch_rows or None, "max_client_batch_size": max_client_batch_size,
            "auto_truncate": auto_truncate, "tokenization_workers": tokenization_workers,
            "version": version, "sha": None, "docker_label": None}


@dataclass(frozen=True)
class TeiTokenizeRequest:
    texts: list[str]
    add_special: bool
    prompt_name: str | None


def is_tei_tokenize(body: dict[str, Any]) -> bool:
    """POST /tokenize: TEI's body has `inputs`; llama's has `content` (which wins when both are there)."""
    return "inputs" in body and "content" not in body


def parse_tokenize_request(body: dict[str, Any]) -> TeiTokenizeRequest:
    """`inputs`: a text or a list of texts; `add_special_tokens` (default true), `prompt_name`."""
    inputs = body.get("inputs")
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise TeiError("Validation", '"inputs" must be a string or a list of strings', status=422)
    if not texts:
        raise TeiError("Empty", EMPTY_INPUTS)
    return TeiTokenizeRequest(texts, bool(_bool(body, "add_special_tokens", True)), _prompt_name(body))


def render_tokenize_response(spans: list[list[TokenSpan]]) -> list[list[dict[str, Any]]]:
    """Per input, TEI's SimpleToken objects."""
    return [[{"id": s.id, "text": s.text, "special": s.special, "start": s.start, "stop": s.stop} for s in one]
            for one in spans]


@dataclass(frozen=True)
class TeiDecodeRequest:
    ids: list[list[int]]
    skip_special: bool


def parse_decode_request(body: dict[str, Any]) -> TeiDecodeRequest:
    """`ids`: one list of token ids, or a list of them; `skip_special_tokens` (default true)."""
    ids = body.get("ids")
    batch = ids if isinstance(ids, list) and ids and all(isinstance(one, list) for one in ids) else [ids]
    for one in batch:
        if not isinstance(one, list) or not all(is_token(t) for t in one):
            raise TeiError("Validation", '"ids" must be a list of token ids, or a list of such lists', status=422)
    if not any(batch):
        raise TeiError("Empty", "`ids` cannot be empty")
    return TeiDecodeRequest([[whole(t) for t in one] for one in batch],
                            bool(_bool(body, "skip_special_tokens", True)))
