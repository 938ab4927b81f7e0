"""The OpenAPI declarations of TEI's native routes (compat/resources/tei.py), merged into compat/openapi.py's
operations and schemas. Request properties are exactly the fields compat/wire/tei.py reads (and `model`)."""
from __future__ import annotations

from typing import Any

from compat.openapi_fields import LATE_CHUNKING, TRUNCATION_DIRECTION

JSON = "application/json"
Schema = dict[str, Any]

_STRING = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_NUMBER_OR_NULL = {"type": ["number", "null"]}
_OPTIONAL_BOOL = {"type": ["boolean", "null"]}
_DIRECTION = TRUNCATION_DIRECTION
_MODEL = {"anyOf": [_STRING, {"type": "null"}]}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def tei_schemas(max_client_batch_size: int) -> dict[str, Schema]:
    inputs = {"description": "a text, a list of texts, token ids, or a list of token-id lists; at most "
                             f"{max_client_batch_size} inputs (--max-client-batch-size, else 413)",
              "anyOf": [_STRING, {"type": "array", "minItems": 1,
                                  "items": {"anyOf": [_STRING, _INT, {"type": "array", "items": _INT}]}}]}
    common = {"inputs": inputs, "truncate": _OPTIONAL_BOOL, "truncation_direction": _DIRECTION,
              "prompt_name": {"type": ["string", "null"]}, "model": _MODEL,
              "late_chunking": LATE_CHUNKING}  # /embed_all refuses it (422): its answer is the unpooled rows
    similarity_inputs = {"type": "object", "required": ["source_sentence", "sentences"],
                         "properties": {"source_sentence": _STRING,
                                        "sentences": {"type": "array", "items": _STRING}}}
    parameters = {"anyOf": [{"type": "object", "properties": {
        "truncate": _OPTIONAL_BOOL, "truncation_direction": _DIRECTION,
        "prompt_name": {"type": ["string", "null"]}}}, {"type": "null"}]}
    vector = {"type": "array", "items": _NUMBER_OR_NULL}
    return {
        "TeiEmbedRequest": {"type": "object", "required": ["inputs"], "properties": {
            **common, "normalize": _OPTIONAL_BOOL, "dimensions": {"type": ["integer", "null"]}}},
        "TeiEmbedAllRequest": {"type": "object", "required": ["inputs"], "properties": common},
        "TeiEmbedSparseRequest": {"type": "object", "required": ["inputs"], "properties": {
            **common, "max_active_dims": {"type": ["integer", "null"], "minimum": 1,
                                          "description": "ours: keep each vector's largest entries (null: the "
                                                         "checkpoint's max_active_dims, else all)"}}},
        "TeiSparseEmbeddings": {"type": "array", "items": {"type": "array", "items": {
            "type": "object", "required": ["index", "value"], "properties": {"index": _INT, "value": {"type": "number"}}}}},
        "TeiSimilarityRequest": {"type": "object", "required": ["inputs"], "properties": {
            "inputs": similarity_inputs, "parameters": parameters, "model": _MODEL}},
        "TeiEmbeddings": {"type": "array", "items": vector},
        "TeiTokenEmbeddings": {"type": "array", "items": {"type": "array", "items": vector}},
        "TeiSimilarity": {"type": "array", "items": {"type": "number"}},
        "TeiInfo": {"type": "object",
                    "required": ["model_id", "model_dtype", "model_type", "max_concurrent_requests",
                                 "max_input_length", "max_batch_tokens", "max_client_batch_size", "auto_truncate",
                                 "tokenization_workers", "version"],
                    "properties": {"model_id": _STRING, "model_sha": {"type": ["string", "null"]},
                                   "model_dtype": _STRING, "model_type": {"type": "object"},
                                   "max_concurrent_requests": _INT, "max_input_length": _INT,
                                   "max_batch_tokens": _INT, "max_batch_requests": {"type": ["integer", "null"]},
                                   "max_client_batch_size": _INT, "auto_truncate": _BOOL,
                                   "tokenization_workers": _INT, "version": _STRING,
                                   "sha": {"type": ["string", "null"]}, "docker_label": {"type": ["string", "null"]}}},
        "TeiTokenizeRequest": {"type": "object", "required": ["inputs"], "properties": {
            "inputs": {"anyOf": [_STRING, {"type": "array", "items": _STRING}]},
            "add_special_tokens": _OPTIONAL_BOOL, "prompt_name": {"type": ["string", "null"]}, "model": _MODEL}},
        "TeiTokens": {"type": "array", "items": {"type": "array", "items": {
            "type": "object", "required": ["id", "text", "special", "start", "stop"],
            "properties": {"id": _INT, "text": _STRING, "special": _BOOL, "start": {"type": ["integer", "null"]},
                           "stop": {"type": ["integer", "null"]}}}}},
        "TeiDecodeRequest": {"type": "object", "required": ["ids"], "properties": {
            "ids": {"anyOf": [{"type": "array", "items": _INT},
                              {"type": "array", "items": {"type": "array", "items": _INT}}]},
            "skip_special_tokens": _OPTIONAL_BOOL, "model": _MODEL}},
        "TeiDecoded": {"type": "array", "items": _STRING},
        "TeiError": {"type": "object", "required": ["error", "error_type"],
                     "properties": {"error": _STRING, "error_type": {
                         "enum": ["Validation", "Empty", "Tokenizer", "Overloaded", "Unhealthy", "Backend"]}}},
    }


def _body(schema: Schema) -> Schema:
    return {"required": True, "content": {JSON: {"schema": schema}}}


def tei_answers(schema: Schema, *, llama_errors: bool = False) -> Schema:
    """200 with `schema`, and TEI's error statuses; llama_errors: the route also answers llama's envelope
    (POST /tokenize: TEI's body only when the request has `inputs`)."""
    error_schema = {"anyOf": [_ref("Error"), _ref("TeiError")]} if llama_errors else _ref("TeiError")
    error = {"content": {JSON: {"schema": error_schema}}}
    return {"200": {"description": "success", "content": {JSON: {"schema": schema}}},
            **{status: {"description": what, **error} for status, what in (
                ("400", "Empty: an empty input"), ("413", "Validation: an input over the limit, too many inputs"),
                ("422", "Validation / Tokenizer: a field of the wrong type or value, bad token ids"),
                ("424", "Backend: the model cannot answer this (e.g. /embed_all on a pooled model)"),
                ("429", "Overloaded: the queue is full"))}}


TEI_OPERATIONS: dict[str, dict[str, Schema]] = {
    "/embed": {"post": {"summary": "TEI: embeddings as a bare [[float]]", "requestBody": _body(_ref("TeiEmbedRequest")),
                        "responses": tei_answers(_ref("TeiEmbeddings"))}},
    "/embed_all": {"post": {"summary": "TEI: each input's per-token rows (a model served with --pooling none)",
                            "requestBody": _body(_ref("TeiEmbedAllRequest")),
                            "responses": tei_answers(_ref("TeiTokenEmbeddings"))}},
    "/embed_sparse": {"post": {"summary": "TEI: a sparse (SPLADE) encoder's nonzero entries per input, "
                                          "[{index, value}] by ascending index",
                               "requestBody": _body(_ref("TeiEmbedSparseRequest")),
                               "responses": tei_answers(_ref("TeiSparseEmbeddings"))}},
    "/similarity": {"post": {"summary": "TEI: the cosine of each sentence with the source sentence",
                             "requestBody": _body(_ref("TeiSimilarityRequest")),
                             "responses": tei_answers(_ref("TeiSimilarity"))}},
    "/": {"post": {"summary": "TEI's root route (huggingface_hub's InferenceClient): /embed (/embed_sparse for a "
                              "sparse model), or /similarity when `inputs` is {source_sentence, sentences}; "
                              "/predict on a sequence classifier",
                   "requestBody": _body({"anyOf": [_ref("TeiEmbedRequest"), _ref("TeiSimilarityRequest"),
                                                   _ref("TeiEmbedSparseRequest"), _ref("TeiPredictRequest")]}),
                   "responses": tei_answers({"anyOf": [_ref("TeiEmbeddings"), _ref("TeiSimilarity"),
                                                       _ref("TeiSparseEmbeddings"), _ref("TeiPredictions")]})}},
    "/decode": {"post": {"summary": "TEI: token ids back to text, one string per list",
                         "requestBody": _body(_ref("TeiDecodeRequest")), "responses": tei_answers(_ref("TeiDecoded"))}},
    "/info": {"get": {"summary": "TEI's Info: the model and the server's limits",
                      "responses": {"200": {"description": "success",
                                            "content": {JSON: {"schema": _ref("TeiInfo")}}}}}},
}
