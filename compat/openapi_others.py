"""The /openapi.json declarations of the other servers' routes: Cohere's /v1/embed and /v2/embed
(compat/wire/cohere_embed.py) and vLLM's /score and /v1/score (compat/wire/score.py). compat/openapi.py merges
them into its schemas and operations."""
from __future__ import annotations

from typing import Any

from compat.openapi_fields import LATE_CHUNKING

JSON = "application/json"
Schema = dict[str, Any]

_STRING = {"type": "string"}
_INT = {"type": "integer"}
_NUMBER_OR_NULL = {"type": ["number", "null"]}
_MODEL = {"anyOf": [{"type": "string", "description": "a served model's id or alias; on a one-model server only "
                                                      "echoed in the answer"}, {"type": "null"}]}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _cohere_schemas(batch: int) -> dict[str, Schema]:
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
                "texts": {"type": "array", "minItems": 1, "items": _STRING,
                          "description": f"at most {batch} (--max-client-batch-size, else 413)"},
                "model": _MODEL,
                "input_type": _nullable({"enum": ["search_query", "search_document", "classification",
                                                  "clustering"],
                                         "description": "picks the checkpoint's matching named prompt "
                                                        "(docs/routes.md)"}),
                "embedding_types": _nullable({"type": "array", "minItems": 1, "items": {
                    "enum": ["float", "int8", "uint8", "binary", "ubinary", "base64"]}}),
                "output_dimension": _nullable({"type": "integer", "minimum": 1}),
                "truncate": _nullable({"enum": ["NONE", "END", "START"], "default": "END",
                                       "description": "END cuts a long text at its end, START at its start, NONE refuses it"}),
                "images": {"description": "refused (400)"}, "inputs": {"description": "refused (400)"},
                "late_chunking": LATE_CHUNKING,
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


def _score_schemas(batch: int) -> dict[str, Schema]:
    texts = {"anyOf": [_STRING, {"type": "array", "minItems": 1, "items": _STRING}]}
    return {
        "ScoreRequest": {
            "type": "object",
            "description": "vLLM's score request: text_1 + text_2 or queries + documents, paired 1:1, 1:N or N:N "
                           f"(else 400); at most {batch} pairs (--max-client-batch-size, else 413)",
            "properties": {"text_1": _nullable(texts), "text_2": _nullable(texts), "queries": _nullable(texts),
                           "documents": _nullable(texts), "model": _MODEL,
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


def other_servers_schemas(batch: int) -> dict[str, Schema]:
    """batch: --max-client-batch-size."""
    return {**_cohere_schemas(batch), **_score_schemas(batch)}


def _answers(ok: str, error: str, description: str) -> Schema:
    """200 and the route's own error shape; errors raised before routing (401, 404, 413 over --payload-limit,
    503 loading or draining) keep llama's envelope."""
    return {"200": {"description": "success", "content": {JSON: {"schema": _ref(ok)}}},
            "default": {"description": description,
                        "content": {JSON: {"schema": {"anyOf": [_ref(error), _ref("Error")]}}}}}


OTHER_SERVERS_OPERATIONS: dict[str, dict[str, Schema]] = {
    **{f"/v{v}/embed": {"post": {"summary": f"embeddings in Cohere's v{v} shape",
                                 "requestBody": {"required": True,
                                                 "content": {JSON: {"schema": _ref("CohereEmbedRequest")}}},
                                 "responses": _answers(f"CohereEmbedV{v}", "CohereError",
                                                       "an error, in Cohere's {message} shape (those raised "
                                                       "before routing: llama's envelope)")}}
       for v in (1, 2)},
    **dict.fromkeys(("/score", "/v1/score"), {"post": {
        "summary": "vLLM's score API: relevance of text pairs on a reranker",
        "requestBody": {"required": True, "content": {JSON: {"schema": _ref("ScoreRequest")}}},
        "responses": {"200": {"description": "success", "content": {JSON: {"schema": _ref("Score")}}}}}}),
}
