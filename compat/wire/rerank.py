"""/rerank, /reranking, /v1/rerank, /v1/reranking and /v2/rerank bodies (docs/llama-server-contract.md §4). Pure: no falcon.

Score contract, the same on every route and in every shape (`relevance_score`, TEI's `score`):
- cross-encoders: the raw classifier logit, unbounded, as llama-server reports it; with --rerank-sigmoid the
  engine gives sigmoid(logit) in [0, 1] instead. Logits follow transformers / sentence-transformers (pooler,
  token-type ids), not llama.cpp's conversion (§12, §13);
- generative rerankers (Qwen3-Reranker): P("yes") = sigmoid(logit_yes - logit_no) at the last position, in
  [0, 1], whatever --rerank-sigmoid says (llama: softmax over [yes, no]).

Shapes, chosen by route and body:
- the four llama routes with `documents` (llama / Jina / Cohere v1): {"model","object":"list","usage",
  "results":[{"index","relevance_score"(,"document")}]}. The cohere SDK's v1 client reads it as is: its
  `id` and `meta` are optional;
- the same routes when the body has a `texts` key (TEI, llama's rule: the key, not its value): a bare
  [{"index","score"(,"text")}];
- /v2/rerank (Cohere v2): {"id","results":[...],"meta":{"api_version":{"version":"2"},
  "billed_units":{"search_units":N}},"model","usage"}, N = one per 100 documents. Cohere v2 truncates long
  documents by itself, so this route truncates unless the request says `"truncate": false`.

Documents are strings or {"text": ...} objects (Cohere, Jina). For rerankers that take images, the query and
each document may also hold images, in the embedding routes' forms: {"text"?, "image" or "image_url": url or
{"url"}} objects (Jina, the seed's API; "image" wins over "image_url"), an OpenAI content part or a list of them,
and llama's {"prompt_string", "multimodal_data"}, their parts kept in order; an object's image comes first and
its text follows it, as the reference rerankers format an item. Any other reranker answers 400 naming the item (llama's multimodal
message). `return_documents` echoes a string as {"text": ...} and anything else as the request sent it (an
image's data: URL or base64 included); TEI's `return_text` gives an item's text parts ("" for an image alone). Results are sorted by score descending, ties by ascending index (llama
leaves ties unspecified), then cut to `top_n` (absent or null: all). `usage` counts the tokens of every
scored pair, returned or not (every window of a document split by `max_chunks_per_doc`). Client faults llama answers with 500 (negative `top_n`, bad JSON) are 400.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

from compat.errors import ApiError, bad_request
from compat.wire.inputs import MULTIMODAL, MediaRef, Prompt, has_media, parse_media_item, whole
from engine.types import RerankResult

NO_QUERY = '"query" must be provided'
QUERY_NOT_STRING = '"query" must be a string'
BAD_DOCUMENTS = '"documents" must be a non-empty string array'
BAD_DOCUMENT_OBJECT = 'a "documents" object must have a "text" string'
BAD_ITEM_OBJECT = 'an object must have a "text" string, an "image" or an "image_url"'
BAD_IMAGE_FIELD = '"{key}" must be an image URL (data:, file://, http(s)://) or base64, or {{"url": ...}}'
BAD_TOP_N = '"top_n" must be a non-negative integer'
BAD_RANK_FIELDS = '"rank_fields" is not supported: send each document as a string or as {"text": ...}'
BAD_INSTRUCTION = '"instruction" must be a string'
BAD_MAX_CHUNKS = '"max_chunks_per_doc" must be a positive integer'

Shape = Literal["jina", "tei", "cohere-v2"]
Document = Union[str, dict[str, Any], list[Any]]
# What the model scores for the query or one document: its text, or (it holds an image) its parts
Item = Union[str, Prompt]

# Cohere / TEI fields accepted and ignored (no lookup reads them):
# - priority (Cohere v2, a scheduling hint), relevant_spans (Cohere v2; spans are optional in its answers) and
#   raw_scores (TEI; llama ignores it too: scores follow --rerank-sigmoid) cannot change scores or order;
# - max_tokens_per_doc (Cohere v2) and truncation_direction (TEI) govern long documents: a pair over the model's
#   limit is refused, or cut on the right when `truncate` is on (the default on /v2/rerank).
# max_chunks_per_doc (Cohere's field) is read on every route: a document over the limit is split into at most
# that many overlapping windows, its score the best window's (--rerank-chunks gives the default; 0 = off).
# rank_fields (Cohere v1) would change what is scored: only its no-op values are accepted.


@dataclass(frozen=True)
class RerankRequest:
    query: Item
    documents: list[Document]  # as sent: `return_documents` echoes them
    items: list[Item]  # what the model scores, one per document
    shape: Shape
    top_n: int | None  # None: every document
    return_documents: bool  # Jina / Cohere shapes: each result gets its `document`
    return_text: bool  # TEI shape: each result gets its `text`
    truncate: bool | None  # None: the server's --truncate
    instruction: str | None  # generative rerankers: overrides --rerank-instruction
    max_chunks: int | None  # max_chunks_per_doc; None: the server's --rerank-chunks
    model: str | None  # echoed when the request named one as a string


def _image_field(value: dict[str, Any], label: str) -> MediaRef | None:
    """An item object's "image" (or else "image_url"): a URL string or {"url": ...}."""
    for key in ("image", "image_url"):
        image = value.get(key)
        if image is None:
            continue
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str) or not url:
            raise bad_request(f"{label}: " + BAD_IMAGE_FIELD.format(key=key))
        return MediaRef(url)
    return None


def _object_parts(value: dict[str, Any], label: str, takes_images: bool) -> Prompt:
    """{"text"?, "image"?, "image_url"?}: the image first, then the text."""
    text, image = value.get("text"), _image_field(value, label)
    bad_text = text is not None and not isinstance(text, str)
    if bad_text or (text is None and image is None):
        text_only_document = image is None and not takes_images and label != "query"
        raise bad_request(BAD_DOCUMENT_OBJECT if text_only_document else f"{label}: {BAD_ITEM_OBJECT}")
    return [*([image] if image else []), *([text] if text else [])]


def _item(value: Any, label: str, takes_images: bool) -> Item | None:
    """One query or document as sent -> its text, or its parts when it holds an image; None when the value is
    no item form at all (the caller answers with llama's message for its field)."""
    if isinstance(value, str):
        return value
    try:
        parts = parse_media_item(value)
    except ApiError as exc:
        raise bad_request(f"{label}: {exc.message}") from None
    if parts is None and isinstance(value, dict):
        parts = _object_parts(value, label, takes_images)
    if parts is None:
        return None
    if not has_media(parts):
        return item_text(parts)
    if not takes_images:
        raise bad_request(f"{label}: {MULTIMODAL}")
    return parts


def item_text(item: Item) -> str:
    """An item's text parts (an image alone: "")."""
    return item if isinstance(item, str) else "".join(part for part in item if isinstance(part, str))


def _flag(body: dict[str, Any], key: str, default: bool | None) -> bool | None:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f'"{key}" must be a boolean')
    return value


def _top_n(value: Any, n_documents: int) -> int | None:
    if value is None:  # Cohere and Jina send null for "all"
        return None
    value = whole(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise bad_request(BAD_TOP_N)
    return min(value, n_documents)


def _documents(body: dict[str, Any]) -> Any:
    """`documents` wins over `texts`; a null `documents` falls back to `texts`, as llama's json_value does."""
    documents = body.get("documents")
    return body.get("texts") if documents is None else documents


def count_documents(body: dict[str, Any]) -> int:
    """How many documents the request has, read off the raw list without parsing any (0: no list, which
    parse_rerank_request refuses)."""
    documents = _documents(body)
    return len(documents) if isinstance(documents, list) else 0


def parse_rerank_request(body: dict[str, Any], *, cohere_v2: bool, takes_images: bool = False) -> RerankRequest:
    """llama's checks in its order (§4.1 steps 3-6), then the fields it does not read.

    takes_images: the reranker scores images (else an item holding one is 400 naming it)."""
    shape: Shape = "cohere-v2" if cohere_v2 else "tei" if "texts" in body else "jina"

    if "query" not in body:
        raise bad_request(NO_QUERY)
    query = _item(body["query"], "query", takes_images)
    if query is None:
        raise bad_request(QUERY_NOT_STRING)

    documents = _documents(body)
    if not isinstance(documents, list) or not documents:
        raise bad_request(BAD_DOCUMENTS)
    items = [_item(document, f"document {i}", takes_images) for i, document in enumerate(documents)]
    if any(item is None for item in items):
        raise bad_request(BAD_DOCUMENTS)

    top_n = _top_n(body.get("top_n"), len(documents))

    rank_fields = body.get("rank_fields")
    if rank_fields not in (None, [], ["text"]):
        raise bad_request(BAD_RANK_FIELDS)
    instruction = body.get("instruction")
    if instruction is not None and not isinstance(instruction, str):
        raise bad_request(BAD_INSTRUCTION)
    max_chunks = body.get("max_chunks_per_doc")
    if max_chunks is not None and (not isinstance(max_chunks, int) or isinstance(max_chunks, bool) or max_chunks < 1):
        raise bad_request(BAD_MAX_CHUNKS)
    model = body.get("model")
    return RerankRequest(
        query=query, documents=documents, items=items, shape=shape, top_n=top_n,
        return_documents=bool(_flag(body, "return_documents", False)),
        return_text=bool(_flag(body, "return_text", False)),
        truncate=_flag(body, "truncate", True if cohere_v2 else None),
        instruction=instruction, max_chunks=max_chunks, model=model if isinstance(model, str) else None)


def ranked_indices(scores: Sequence[float], top_n: int | None) -> list[int]:
    """Document indices by score descending, ties by ascending index, the first `top_n` of them."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return order if top_n is None else order[:top_n]


def _tei_result(request: RerankRequest, index: int, score: float) -> dict[str, Any]:
    item: dict[str, Any] = {"index": index, "score": score}
    if request.return_text:
        item["text"] = item_text(request.items[index])
    return item


def _result(request: RerankRequest, index: int, score: float) -> dict[str, Any]:
    item: dict[str, Any] = {"index": index, "relevance_score": score}
    if request.return_documents:
        document = request.documents[index]
        item["document"] = {"text": document} if isinstance(document, str) else document
    return item


def render_rerank_response(request: RerankRequest, result: RerankResult, model_name: str, *,
                           response_id: str) -> list[dict[str, Any]] | dict[str, Any]:
    """`response_id` is the Cohere v2 `id` (other shapes have none)."""
    order = ranked_indices(result.scores, request.top_n)
    if request.shape == "tei":
        return [_tei_result(request, i, result.scores[i]) for i in order]
    results = [_result(request, i, result.scores[i]) for i in order]
    n_tokens = sum(result.n_tokens)
    model = request.model if request.model is not None else model_name
    usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    if request.shape == "cohere-v2":
        # Cohere bills one search unit per query with up to 100 documents
        search_units = -(-len(request.documents) // 100)
        meta = {"api_version": {"version": "2"}, "billed_units": {"search_units": search_units}}
        return {"id": response_id, "results": results, "meta": meta, "model": model, "usage": usage}
    return {"model": model, "object": "list", "usage": usage, "results": results}
