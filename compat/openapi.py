"""GET /openapi.json: an OpenAPI 3.1 document of every route the app serves, built from the app's own route
table and the request/response schemas declared here, once, when the app is made.

Each route path has its operations declared in `_OPERATIONS`; a route added to the app without a declaration
makes `openapi_document` raise, so the app cannot start with an undocumented route. The request schemas'
properties are exactly the fields the parsers in compat/wire read (tests/compat/test_openapi.py records the
keys each parser looks up and compares), and the responses are what the renderers produce (the fuzz run checks
every answer against this document). Limits from the settings (--max-client-batch-size, --payload-limit) are
stated where they apply.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import falcon
import falcon.inspect

from compat.middleware import PUBLIC_PATHS, normalize_prefix
from compat.openapi_fields import LATE_CHUNKING, TRUNCATION_DIRECTION
from compat.openapi_ollama import OPERATIONS as OLLAMA_OPERATIONS
from compat.openapi_ollama import SCHEMAS as OLLAMA_SCHEMAS
from compat.openapi_tei import TEI_OPERATIONS, tei_answers, tei_schemas
from compat.openapi_others import OTHER_SERVERS_OPERATIONS, other_servers_schemas
from compat.openapi_classify import CLASSIFY_OPERATIONS, classify_schemas
from compat.wire.inputs import MAX_JSON_DEPTH

if TYPE_CHECKING:
    from compat.settings import Settings

JSON = "application/json"
Schema = dict[str, Any]



def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


_STRING = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_NUMBER_OR_NULL = {"type": ["number", "null"]}  # NaN and infinities print as null
_MODEL = _nullable({"type": "string", "description": "a served model's id or alias; on a one-model server only "
                                                     "echoed in the answer"})
_TOKEN_OR_TEXT = {"anyOf": [_STRING, _INT]}


def _schemas(settings: Settings) -> dict[str, Schema]:
    batch = settings.max_client_batch_size
    prompt_object = {"type": "object", "required": ["prompt_string"],
                     "properties": {"prompt_string": _STRING, "multimodal_data": {}}}
    prompts = {
        "description": "one text, one list of token ids (or of texts and ids mixed, one prompt), or a list of "
                       f"texts / token lists / {{prompt_string}} objects, one prompt each; at most {batch} prompts "
                       "(--max-client-batch-size, else 413)",
        "anyOf": [_STRING, prompt_object,
                  {"type": "array", "minItems": 1,
                   "items": {"anyOf": [_STRING, _INT, {"type": "array", "items": _TOKEN_OR_TEXT}, prompt_object]}}],
    }
    usage = {"type": "object", "required": ["prompt_tokens", "total_tokens"],
             "properties": {"prompt_tokens": _INT, "total_tokens": _INT}}
    content_part = {"type": "object", "required": ["type"],
                    "properties": {"type": {"enum": ["text", "image_url"]}, "text": _STRING, "image_url": {}}}
    item = {"description": "a text; for rerankers that take images also {text, image | image_url} (a URL or "
                           "{url}), an OpenAI content part or a list of them, or llama's {prompt_string, "
                           "multimodal_data}",
            "anyOf": [_STRING, {"type": "object", "properties": {"text": _STRING, "image": {}, "image_url": {}}},
                      content_part, {"type": "array", "minItems": 1, "items": content_part}, prompt_object]}
    documents = {"type": "array", "minItems": 1, "items": item,
                 "description": f"at most {batch} (--max-client-batch-size, else 413)"}
    rerank_result = {"type": "object", "required": ["index", "relevance_score"],
                     "properties": {"index": _INT, "relevance_score": _NUMBER_OR_NULL,
                                    "document": {"type": ["object", "array"],
                                                 "description": "{text} for a string, else the item as sent"}}}
    listed_model = {"type": "object", "required": ["id", "object"],
                    "properties": {"id": _STRING, "object": {"const": "model"}, "aliases": {"type": "array"},
                                   "tags": {"type": "array"}, "created": _INT, "owned_by": _STRING,
                                   "meta": {"type": "object"}, "status": {"type": "object"}, "kind": _STRING,
                                   "memory_bytes": _INT, "stats": {"type": "object"}}}
    return {
        "Error": {
            "type": "object", "required": ["error"],
            "properties": {"error": {"type": "object", "required": ["code", "message", "type"],
                                     "properties": {"code": _INT, "message": _STRING, "type": _STRING,
                                                    "n_prompt_tokens": _INT, "n_ctx": _INT}}}},
        "EmbeddingsRequest": {
            "type": "object",
            "description": "llama-server's and OpenAI's embedding request; `input` or `content` is required "
                           "(`content` answers in llama's shape on every route). Other fields are ignored.",
            "properties": {
                "input": prompts, "content": prompts,
                "encoding_format": {"enum": ["float", "base64", "int8", "uint8", "binary", "ubinary"],
                                    "default": "float",
                                    "description": "int8 / uint8 / binary / ubinary: our extension, integer codes "
                                                   "(docs/routes.md, \"Compact vectors\")"},
                "embd_normalize": {"type": "integer", "description": "-1 none, 0 max absolute, 1 taxicab, "
                                                                     "2 Euclidean (default: --embd-normalize), >2 p-norm"},
                "truncate": _nullable(_BOOL), "model": _MODEL,
                "prompt_name": _nullable(_STRING), "instruction": _nullable({"type": "string", "minLength": 1}),
                "dimensions": _nullable({"type": "integer", "minimum": 1}),
                "late_chunking": LATE_CHUNKING, "truncation_direction": TRUNCATION_DIRECTION,
            }},
        "OaiEmbeddings": {
            "type": "object", "required": ["model", "object", "usage", "data"],
            "properties": {
                "model": _STRING, "object": {"const": "list"}, "usage": usage,
                "data": {"type": "array", "items": {
                    "type": "object", "required": ["embedding", "index", "object"],
                    "properties": {"embedding": {
                        "anyOf": [{"type": "array", "items": _NUMBER_OR_NULL},
                                  {"type": "array", "items": {"type": "array", "items": _NUMBER_OR_NULL}},
                                  {"type": "string", "contentEncoding": "base64"},
                                  {"type": "array", "items": _INT},
                                  {"type": "array", "items": {"type": "array", "items": _INT}}],
                        "description": "one vector; a multi-vector model's [n_tokens, d] rows (base64: row-major "
                                       "float32)"},
                                   "index": _INT, "object": {"const": "embedding"},
                                   "encoding_format": {"enum": ["base64", "int8", "uint8", "binary",
                                                                "ubinary"]}}}}}},
        "LlamaEmbeddings": {
            "type": "array", "items": {
                "type": "object", "required": ["index", "embedding"],
                "properties": {"index": _INT, "embedding": {
                    "type": "array", "items": {"type": "array", "items": _NUMBER_OR_NULL},
                    "description": "one pooled vector, or one row per token with --pooling none and for "
                                   "multi-vector models"}}}},
        "RerankRequest": {
            "type": "object", "required": ["query"],
            "description": "llama-server / Jina / Cohere / TEI rerank request; `documents` or `texts` (TEI: the "
                           "`texts` key selects TEI's answer shape) is required. Ignored: priority, relevant_spans, "
                           "raw_scores, max_tokens_per_doc, truncation_direction.",
            "properties": {
                "query": item, "documents": _nullable(documents), "texts": _nullable(documents),
                "top_n": _nullable({"type": "integer", "minimum": 0}),
                "return_documents": _nullable(_BOOL), "return_text": _nullable(_BOOL),
                "truncate": _nullable(_BOOL), "instruction": _nullable(_STRING), "model": _MODEL,
                "max_chunks_per_doc": _nullable({"type": "integer", "minimum": 1}),
                "rank_fields": _nullable({"enum": [[], ["text"]]}),
            }},
        "Rerank": {
            "type": "object", "required": ["model", "object", "usage", "results"],
            "properties": {"model": _STRING, "object": {"const": "list"}, "usage": usage,
                           "results": {"type": "array", "items": rerank_result}}},
        "TeiRerank": {
            "type": "array", "items": {"type": "object", "required": ["index", "score"],
                                       "properties": {"index": _INT, "score": _NUMBER_OR_NULL, "text": _STRING}}},
        "CohereV2Rerank": {
            "type": "object", "required": ["id", "results", "meta", "model", "usage"],
            "properties": {"id": _STRING, "results": {"type": "array", "items": rerank_result},
                           "meta": {"type": "object"}, "model": _STRING, "usage": usage}},
        **other_servers_schemas(batch),
        **classify_schemas(batch),
        "TokenizeRequest": {
            "type": "object",
            "properties": {"content": {"anyOf": [_STRING, {"type": "array", "items": _TOKEN_OR_TEXT}]},
                           "add_special": _BOOL, "parse_special": _BOOL, "with_pieces": _BOOL, "model": _MODEL}},
        "Tokens": {
            "type": "object", "required": ["tokens"],
            "properties": {"tokens": {"type": "array", "items": {"anyOf": [_INT, {
                "type": "object", "required": ["id", "piece"],
                "properties": {"id": _INT, "piece": {"anyOf": [_STRING, {"type": "array", "items": _INT}]}}}]}}}},
        "DetokenizeRequest": {
            "type": "object", "properties": {"tokens": {"type": "array", "items": _INT}, "model": _MODEL}},
        "Content": {"type": "object", "required": ["content"], "properties": {"content": _STRING}},
        "Health": {"type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}}},
        "Props": {"type": "object", "description": "llama-server's /props (a several-model server without "
                                                   "?model: its router answer)",
                  "properties": {"model_alias": _STRING, "model_path": _STRING, "build_info": _STRING,
                                 "total_slots": _INT, "default_generation_settings": {"type": "object"}}},
        "Success": {"type": "object", "required": ["success"], "properties": {"success": {"const": True}}},
        "Models": {"type": "object", "required": ["object", "data"],
                   "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": listed_model},
                                  "models": {"type": "array"}}},
        "ModelRequest": {"type": "object", "required": ["model"], "properties": {"model": {
            "type": "string", "minLength": 1, "description": "a configured model's id or alias"}}},
        "Slots": {"type": "array", "items": {
            "type": "object", "required": ["id", "n_ctx", "is_processing"],
            "properties": {"id": _INT, "n_ctx": _INT, "speculative": _BOOL, "is_processing": _BOOL}}},
        **OLLAMA_SCHEMAS,
    }


def _body(name: str) -> Schema:
    return {"required": True, "content": {JSON: {"schema": _ref(name)}}}


def _ok(schema: Schema, description: str = "success", media: str = JSON) -> Schema:
    return {"200": {"description": description, "content": {media: {"schema": schema}}}}


def _one_of(*names: str) -> Schema:
    return {"oneOf": [_ref(name) for name in names]}


_MODEL_QUERY = {"name": "model", "in": "query", "required": False, "schema": _STRING,
                "description": "several models: the model to answer for (it is loaded if need be)"}
_RELOAD_QUERY = {"name": "reload", "in": "query", "required": False, "schema": _STRING,
                 "description": "any non-empty value: re-read the preset and --config files first"}

_EMBED = {"post": {"summary": "embeddings in llama-server's shape", "requestBody": _body("EmbeddingsRequest"),
                   "responses": _ok(_ref("LlamaEmbeddings"))}}
_RERANK = {"post": {"summary": "rerank documents (llama-server / Jina / Cohere v1; TEI's bare array when the body "
                               "has `texts`)", "requestBody": _body("RerankRequest"),
                    "responses": _ok(_one_of("Rerank", "TeiRerank"))}}
_MAXSIM = {"post": {"summary": "a multi-vector model's MaxSim scores of the query against each document, in the "
                               "rerank routes' shapes (400 for any other model)", "requestBody": _body("RerankRequest"),
                    "responses": _ok(_one_of("Rerank", "TeiRerank"))}}
_HEALTH = {"get": {"summary": "readiness: 200 when serving, 503 while loading or draining",
                   "responses": _ok(_ref("Health"))}}
_MODELS = {"get": {"summary": "the served models", "parameters": [_RELOAD_QUERY],
                   "responses": _ok(_ref("Models"))},
           "post": {"summary": "with ?reload=1 (several models): re-read the configuration, then list the models",
                    "parameters": [_RELOAD_QUERY], "responses": _ok(_ref("Models"))}}
_NOT_SERVED = {"post": {"summary": "a llama-server generation route: answered 501, this server does not generate",
                        "responses": {"501": {"description": "not supported",
                                              "content": {JSON: {"schema": _ref("Error")}}}}}}

# route path -> operations by method (lower case), as the app registers them
_OPERATIONS: dict[str, dict[str, Schema]] = {
    "/health": _HEALTH,
    "/v1/health": _HEALTH,
    "/v1/embeddings": {"post": {"summary": "embeddings in OpenAI's shape (llama's with `content`)",
                                "requestBody": _body("EmbeddingsRequest"),
                                "responses": _ok(_one_of("OaiEmbeddings", "LlamaEmbeddings"))}},
    "/embedding": _EMBED,
    "/embeddings": _EMBED,
    **{path: _RERANK for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")},
    "/maxsim": _MAXSIM,
    "/v1/maxsim": _MAXSIM,
    "/v2/rerank": {"post": {"summary": "rerank documents (Cohere v2)", "requestBody": _body("RerankRequest"),
                            "responses": _ok(_ref("CohereV2Rerank"))}},
    **OTHER_SERVERS_OPERATIONS,  # Cohere embed, vLLM score
    **CLASSIFY_OPERATIONS,  # TEI's /predict, vLLM's /classify
    "/tokenize": {"post": {"summary": "text to token ids (TEI's token objects when the body has `inputs`)",
                           "requestBody": {"required": True, "content": {JSON: {"schema": {"anyOf": [
                               _ref("TokenizeRequest"), _ref("TeiTokenizeRequest")]}}}},
                           "responses": tei_answers(_one_of("Tokens", "TeiTokens"), llama_errors=True)}},
    "/detokenize": {"post": {"summary": "token ids to text", "requestBody": _body("DetokenizeRequest"),
                             "responses": _ok(_ref("Content"))}},
    "/props": {"get": {"summary": "server and model properties", "parameters": [_MODEL_QUERY],
                       "responses": _ok(_ref("Props"))},
               "post": {"summary": "change properties: accepted with --props (nothing is changeable), else 501",
                        "requestBody": {"required": False, "content": {JSON: {"schema": {}}}},
                        "responses": _ok(_ref("Success"))}},
    "/models": _MODELS,
    "/v1/models": _MODELS,
    "/models/load": {"post": {"summary": "load a configured model (several models)", "requestBody": _body("ModelRequest"),
                              "responses": _ok(_ref("Success"))}},
    "/models/unload": {"post": {"summary": "unload a model once its requests finish (several models)",
                                "requestBody": _body("ModelRequest"), "responses": _ok(_ref("Success"))}},
    "/slots": {"get": {"summary": "slots (needs --slots)", "parameters": [_MODEL_QUERY],
                       "responses": _ok(_ref("Slots"))}},
    "/metrics": {"get": {"summary": "Prometheus metrics (needs --metrics)",
                         "responses": _ok(_STRING, media="text/plain")}},
    "/openapi.json": {"get": {"summary": "this document", "responses": _ok({"type": "object"})}},
    **OLLAMA_OPERATIONS,  # Ollama's /api/... routes
    **TEI_OPERATIONS,
    **{path: _NOT_SERVED for path in ("/completion", "/completions", "/v1/completions", "/chat/completions",
                                      "/v1/chat/completions", "/infill", "/v1/responses", "/v1/messages",
                                      "/apply-template")},
}


class UndeclaredRoute(Exception):
    """A route of the app has no declaration in compat/openapi.py."""


def _operation(path: str, method: str, declared: Schema, secured: bool) -> Schema:
    operation = dict(declared)
    responses = dict(operation["responses"])
    if method == "head":  # the GET's statuses without bodies
        responses = {status: {"description": answer["description"]} for status, answer in responses.items()}
        operation.pop("requestBody", None)
    responses.setdefault("default", {
        "description": "an error, in llama-server's envelope (400 bad request, 401 no or wrong API key, 404, 413 too "
                       "large, 500, 501 not served, 503 loading/overloaded/draining with Retry-After, 504 deadline "
                       "passed)",
        **({} if method == "head" else {"content": {JSON: {"schema": _ref("Error")}}})})
    operation["responses"] = responses
    if not secured or path in PUBLIC_PATHS:
        operation["security"] = []
    return operation


def openapi_document(app: falcon.App, settings: Settings, version: str) -> Schema:
    """The document for `app` as configured; raises UndeclaredRoute for a route without a declaration."""
    secured = bool(settings.api_key)
    paths: dict[str, Schema] = {}
    for route in falcon.inspect.inspect_routes(app):
        declared = _OPERATIONS.get(route.path)
        if declared is None:
            raise UndeclaredRoute(f"{route.path} ({route.class_name}) has no OpenAPI declaration in compat/openapi.py")
        item: dict[str, Schema] = {}
        for responder in route.methods:
            if responder.internal:
                continue
            method = responder.method.lower()
            spec = declared.get("get" if method == "head" else method)
            if spec is None:
                raise UndeclaredRoute(f"{responder.method} {route.path} has no OpenAPI declaration")
            item[method] = _operation(route.path, method, spec, secured)
        paths[route.path] = item
    document: Schema = {
        "openapi": "3.1.0",
        "info": {"title": "mlx-embed-server", "version": version,
                 "description": "llama-server compatible embeddings and reranking on MLX. Request bodies are at "
                                f"most {settings.payload_limit} bytes (--payload-limit, else 413) and nest at most "
                                f"{MAX_JSON_DEPTH} levels."},
        "servers": [{"url": normalize_prefix(settings.api_prefix) or "/"}],
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": {**_schemas(settings), **tei_schemas(settings.max_client_batch_size)}},
    }
    if secured:
        document["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"}}
        document["security"] = [{"bearer": []}, {"apiKey": []}]
    return document


class OpenApiResource:
    def __init__(self) -> None:
        self.document: Schema = {}

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = self.document
