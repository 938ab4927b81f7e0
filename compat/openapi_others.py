"""The /openapi.json declarations of the other servers' routes: Cohere's /v1/embed and /v2/embed
(compat/wire/cohere_embed.py) and vLLM's /score and /v1/score (compat/wire/score.py). compat/openapi.py merges
them into its schemas and operations."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compat.catalog import EMBEDDING, RERANK
from compat.openapi_serving import Refusal, Serving, known, model_field, names, refusals
from engine.types import Pooling

from compat.openapi_fields import LATE_CHUNKING, task_field

if TYPE_CHECKING:
    from compat.settings import Settings

JSON = "application/json"
Schema = dict[str, Any]

_STRING = {"type": "string"}
_INT = {"type": "integer"}
_NUMBER_OR_NULL = {"type": ["number", "null"]}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _embedders(serving: Serving) -> list:
    return serving.of_kind(EMBEDDING) if serving.router else list(serving.models)


def _cohere_schemas(serving: Serving, batch: int) -> dict[str, Schema]:
    infos = known(_embedders(serving))
    widths = [info.n_embd for info in infos]
    ints = {"type": "array", "items": {"type": "array", "items": _INT}}
    floats = {"type": "array", "items": {"type": "array", "items": _NUMBER_OR_NULL}}
    by_type = {"type": "object", "properties": {
        "float": floats, "int8": ints, "uint8": ints, "binary": ints, "ubinary": ints,
        "base64": {"type": "array", "items": {"type": "string", "contentEncoding": "base64"}}}}
    meta = {"type": "object", "required": ["api_version", "billed_units"],
            "properties": {"api_version": {"type": "object", "properties": {"version": _STRING}},
                           "billed_units": {"type": "object", "properties": {"input_tokens": _INT}}}}
    common = {"id": _STRING, "texts": {"type": "array", "items": _STRING}, "meta": meta}
    return {
        "CohereEmbedRequest": {
            "type": "object", "required": ["texts"],
            "description": "Cohere's embed request; vectors are L2-normalized. Refused by name: images, inputs, "
                           "truncate START. Other fields are ignored.",
            "properties": {
                "texts": {"type": "array", "minItems": 1, "maxItems": batch, "items": _STRING,
                          "description": f"at most {batch} (--max-client-batch-size, --max-queue-items, else 413)"},
                "model": model_field(serving, names(_embedders(serving)), "an embedding model"),
                "input_type": _nullable({"enum": ["search_query", "search_document", "classification",
                                                  "clustering"],
                                         "description": "picks the checkpoint's matching named prompt, and a "
                                                        "task-adapter model's matching task (docs/routes.md)"}),
                "embedding_types": _nullable({"type": "array", "minItems": 1, "items": {
                    "enum": ["float", "int8", "uint8", "binary", "ubinary", "base64"]}}),
                "output_dimension": _nullable({"type": "integer", "minimum": 1,
                                               **({"maximum": min(widths)} if widths else {})}),
                "truncate": _nullable({"type": "string", "pattern": "^([Nn][Oo][Nn][Ee]|[Ee][Nn][Dd]|[Ss][Tt][Aa][Rr][Tt])$",
                                       "default": "END", "description": "END cuts a long text at its end, START at "
                                                                        "its start, NONE refuses it (any case)"}),
                "images": {"type": "null", "description": "refused (400) unless null"},
                "inputs": {"type": "null", "description": "refused (400) unless null"},
                "late_chunking": LATE_CHUNKING, "task": task_field(infos),
            }},
        "CohereEmbedV1": {
            "type": "object", "required": ["id", "texts", "embeddings", "meta", "response_type"],
            "properties": {**common, "response_type": {"enum": ["embeddings_floats", "embeddings_by_type"]},
                           "embeddings": {"anyOf": [floats, by_type]}}},
        "CohereEmbedV2": {
            "type": "object", "required": ["id", "texts", "embeddings", "meta"],
            "properties": {**common, "embeddings": by_type}},
        "CohereError": {"type": "object", "required": ["message"], "properties": {"message": _STRING}},
    }


def _score_schemas(serving: Serving, batch: int) -> dict[str, Schema]:
    texts = {"anyOf": [_STRING, {"type": "array", "minItems": 1, "items": _STRING}]}
    # the schema states 1:N (one first text); N:N (two lists of one length) is served too, but no schema can say
    # "of the same length"
    one = {"anyOf": [_STRING, {"type": "array", "minItems": 1, "maxItems": 1, "items": _STRING}]}
    many = {"anyOf": [_STRING, {"type": "array", "minItems": 1, "maxItems": batch, "items": _STRING}]}
    rerankers = serving.of_kind(RERANK) if serving.router else list(serving.models)
    return {
        "ScoreRequest": {
            "type": "object",
            "description": "vLLM's score request: text_1 + text_2 or queries + documents, paired 1:1, 1:N or N:N "
                           f"(else 400); at most {batch} pairs (--max-client-batch-size, --max-queue-items, else "
                           "413). text_1 / text_2 win when either is given.",
            "anyOf": [{"required": ["text_1", "text_2"], "properties": {"text_1": one, "text_2": many}},
                      {"required": ["queries", "documents"],
                       "properties": {"text_1": {"type": "null"}, "text_2": {"type": "null"}, "queries": one,
                                      "documents": many}}],
            "properties": {"text_1": _nullable(texts), "text_2": _nullable(texts), "queries": _nullable(texts),
                           "documents": _nullable(texts),
                           "model": model_field(serving, names(rerankers), "a reranker"),
                           "use_activation": _nullable({"type": "boolean", "description": "unset or true: sigmoid "
                                                        "of a cross-encoder's logit; false: the raw logit"}),
                           "activation": _nullable({"type": "boolean", "description": "vLLM's older spelling "
                                                    "of use_activation"}),
                           "truncate_prompt_tokens": _nullable({"const": -1})}},
        "Score": {
            "type": "object", "required": ["id", "object", "created", "model", "data", "usage"],
            "properties": {"id": _STRING, "object": {"const": "list"}, "created": _INT, "model": _STRING,
                           "data": {"type": "array", "items": {
                               "type": "object", "required": ["index", "object", "score"],
                               "properties": {"index": _INT, "object": {"const": "score"},
                                              "score": _NUMBER_OR_NULL}}},
                           "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"],
                                     "properties": {"prompt_tokens": _INT, "total_tokens": _INT}}}},
    }


def other_servers_schemas(settings: Settings, serving: Serving) -> dict[str, Schema]:
    batch = min(settings.max_client_batch_size, settings.max_queue_items)
    return {**_cohere_schemas(serving, batch), **_score_schemas(serving, batch)}


def _answers(ok: str, error: str, description: str) -> Schema:
    """200 and the route's own error shape; errors raised before routing (401, 404, 413 over --payload-limit,
    503 loading or draining) keep llama's envelope."""
    return {"200": {"description": "success", "content": {JSON: {"schema": _ref(ok)}}},
            "default": {"description": description,
                        "content": {JSON: {"schema": {"anyOf": [_ref(error), _ref("Error")]}}}}}


def _only(status: int, why: str, error: str) -> Schema:
    return {str(status): {"description": why, "content": {JSON: {"schema": _ref(error)}}}}


def _cohere_answers(ok: str, description: str, refusal: Refusal | None) -> Schema:
    answers = _answers(ok, "CohereError", description)
    if refusal is None:
        return answers
    return {**_only(*refusal, "CohereError"), "default": answers["default"]}


def other_servers_operations(settings: Settings, serving: Serving) -> dict[str, dict[str, Schema]]:
    no_embeddings, no_rerank, _, _ = refusals(settings, serving)
    embedders = _embedders(serving)
    infos = known(embedders)
    if no_embeddings is None and infos and len(infos) == len(embedders) and all(
            info.pooling is Pooling.NONE or info.multi_vector for info in infos):
        no_embeddings = (400, "this model answers one vector per token; Cohere's embed one per text")
    embed_error = "an error, in Cohere's {message} shape (those raised before routing: llama's envelope)"
    return {
        **{f"/v{v}/embed": {"post": {
            "summary": f"embeddings in Cohere's v{v} shape",
            "requestBody": {"required": True, "content": {JSON: {"schema": _ref("CohereEmbedRequest")}}},
            "responses": _cohere_answers(f"CohereEmbedV{v}", embed_error, no_embeddings)}}
           for v in (1, 2)},
        **dict.fromkeys(("/score", "/v1/score"), {"post": {
            "summary": "vLLM's score API: relevance of text pairs on a reranker",
            "requestBody": {"required": True, "content": {JSON: {"schema": _ref("ScoreRequest")}}},
            "responses": ({"200": {"description": "success", "content": {JSON: {"schema": _ref("Score")}}}}
                          if no_rerank is None else _only(*no_rerank, "Error"))}}),
    }
