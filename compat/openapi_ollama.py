"""The OpenAPI declarations of Ollama's routes (compat/resources/ollama.py), merged into /openapi.json by
compat/openapi.py. Their errors are Ollama's `{"error": "<message>"}`; the middleware's (401, 413, 503 while
loading) stay in llama-server's envelope, the document's `default` answer."""
from __future__ import annotations

from typing import Any

from compat.openapi_fields import LATE_CHUNKING, TRUNCATION_DIRECTION

Schema = dict[str, Any]
JSON = "application/json"
_STRING = {"type": "string"}
_INT = {"type": "integer"}
_VECTOR = {"type": "array", "items": {"type": "number"}}
_KEEP_ALIVE = {"anyOf": [_STRING, {"type": "number"}],
               "description": "seconds or a Go duration (5m); 0 unloads the model after the request on a "
                              "several-model server; accepted otherwise (idle unload is --sleep-idle-seconds)"}
_OPTIONS = {"anyOf": [{"type": "object"}, {"type": "null"}], "description": "accepted, not used"}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


_DETAILS = {"type": "object", "properties": {
    "parent_model": _STRING, "format": _STRING, "family": _STRING, "families": {"type": ["array", "null"]},
    "parameter_size": _STRING, "quantization_level": _STRING, "context_length": _INT, "embedding_length": _INT}}
_LISTED = {"type": "object", "required": ["name", "model", "size", "digest", "details"],
           "properties": {"name": _STRING, "model": _STRING, "modified_at": _STRING, "size": _INT,
                          "digest": _STRING, "details": _DETAILS, "capabilities": {"type": "array"},
                          "expires_at": _STRING, "size_vram": _INT, "context_length": _INT}}

SCHEMAS: dict[str, Schema] = {
    "OllamaError": {"type": "object", "required": ["error"], "properties": {"error": _STRING}},
    "OllamaEmbedRequest": {"type": "object", "properties": {
        "model": _STRING, "input": {"anyOf": [_STRING, {"type": "array", "items": _STRING}, {"type": "null"}]},
        "truncate": {"type": ["boolean", "null"], "default": True,
                     "description": "false: an input over the model's limit is a 400"},
        "dimensions": {"type": ["integer", "null"],
                       "description": "keep the first N components, then L2-normalize"},
        "keep_alive": _KEEP_ALIVE, "options": _OPTIONS,
        "late_chunking": LATE_CHUNKING, "truncation_direction": TRUNCATION_DIRECTION}},
    "OllamaEmbed": {"type": "object", "required": ["model", "embeddings"], "properties": {
        "model": _STRING, "embeddings": {"type": "array", "items": _VECTOR}, "total_duration": _INT,
        "load_duration": _INT, "prompt_eval_count": _INT}},
    "OllamaEmbeddingsRequest": {"type": "object", "properties": {
        "model": _STRING, "prompt": _STRING, "keep_alive": _KEEP_ALIVE, "options": _OPTIONS}},
    "OllamaEmbeddings": {"type": "object", "required": ["embedding"], "properties": {"embedding": _VECTOR}},
    "OllamaShowRequest": {"type": "object", "description": "`model`, or Ollama's deprecated `name`; other fields "
                                                           "(verbose, system, options) are ignored",
                          "properties": {"model": _STRING, "name": _STRING}},
    "OllamaShow": {"type": "object", "required": ["details", "model_info"], "properties": {
        "modelfile": _STRING, "parameters": _STRING, "template": _STRING, "details": _DETAILS,
        "model_info": {"type": "object"}, "capabilities": {"type": "array"}, "modified_at": _STRING}},
    "OllamaModels": {"type": "object", "required": ["models"],
                     "properties": {"models": {"type": "array", "items": _LISTED}}},
    "OllamaVersion": {"type": "object", "required": ["version"], "properties": {"version": _STRING}},
}


def _answers(name: str) -> Schema:
    error = {"content": {JSON: {"schema": {"anyOf": [_ref("OllamaError"), _ref("Error")]}}}}
    return {"200": {"description": "success", "content": {JSON: {"schema": _ref(name)}}},
            **{status: {"description": why, **error} for status, why in (
                ("400", "bad request"), ("404", "model not served"), ("413", "too many inputs"),
                ("500", "server error"), ("501", "not served (--embedding off)"),
                ("503", "loading or overloaded"), ("504", "deadline passed"))}}


def _post(summary: str, request: str, answer: str) -> Schema:
    return {"post": {"summary": summary, "requestBody": {"required": True,
                                                         "content": {JSON: {"schema": _ref(request)}}},
                     "responses": _answers(answer)}}


OPERATIONS: dict[str, dict[str, Schema]] = {
    "/api/embed": _post("Ollama's embeddings (L2-normalized)", "OllamaEmbedRequest", "OllamaEmbed"),
    "/api/embeddings": _post("Ollama's legacy embedding of one prompt (normalized as Ollama does per model)",
                             "OllamaEmbeddingsRequest", "OllamaEmbeddings"),
    "/api/show": _post("Ollama's model details (loads the model if need be)", "OllamaShowRequest", "OllamaShow"),
    "/api/tags": {"get": {"summary": "Ollama's list of the served embedding models",
                          "responses": _answers("OllamaModels")}},
    "/api/ps": {"get": {"summary": "Ollama's list of the loaded embedding models",
                        "responses": _answers("OllamaModels")}},
    "/api/version": {"get": {"summary": "the Ollama API version these routes follow",
                             "responses": _answers("OllamaVersion")}},
}
