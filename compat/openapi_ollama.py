"""The OpenAPI declarations of Ollama's routes (compat/resources/ollama.py), merged into /openapi.json by
compat/openapi.py. Their errors are Ollama's `{"error": "<message>"}`; the middleware's (401, 413, 503 while
loading) stay in llama-server's envelope, the document's `default` answer."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compat.catalog import EMBEDDING
from compat.openapi_serving import Refusal, Serving, known, names, refusals

from compat.openapi_fields import LATE_CHUNKING, TRUNCATION_DIRECTION, task_field

if TYPE_CHECKING:
    from compat.settings import Settings

Schema = dict[str, Any]
JSON = "application/json"
_STRING = {"type": "string"}
_INT = {"type": "integer"}
_VECTOR = {"type": "array", "items": {"type": "number"}}
# a Go duration as parse_keep_alive reads it: signs, then 0 or numbers with units
_GO_DURATION = r"^[+-]*(0|([0-9]*\.?[0-9]+(ns|us|µs|ms|s|m|h))+)$"
_KEEP_ALIVE = {"anyOf": [{"type": "string", "pattern": _GO_DURATION}, {"type": "number"}, {"type": "null"}],
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


def _model(serving: Serving) -> Schema:
    """A string; several models: a served embedding model's id or alias, with or without `:latest` (else 404),
    "" the default one."""
    if not serving.router:
        return {"type": "string", "description": "any name: this server serves one model"}
    served = sorted(set(names(serving.of_kind(EMBEDDING))))
    return {"enum": ["", *served, *(name + ":latest" for name in served)]}


def ollama_schemas(settings: Settings, serving: Serving) -> dict[str, Schema]:
    batch = min(settings.max_client_batch_size, settings.max_queue_items)
    model = _model(serving)
    task = task_field(known(serving.of_kind(EMBEDDING) if serving.router else list(serving.models)))
    return {
        "OllamaError": {"type": "object", "required": ["error"], "properties": {"error": _STRING}},
        "OllamaEmbedRequest": {"type": "object", "properties": {
            "model": model, "input": {"anyOf": [_STRING, {"type": "array", "maxItems": batch, "items": _STRING},
                                                {"type": "null"}],
                                      "description": f"at most {batch} (--max-client-batch-size, --max-queue-items, "
                                                     "else 413)"},
            "truncate": {"type": ["boolean", "null"], "default": True,
                         "description": "false: an input over the model's limit is a 400"},
            "dimensions": {"type": ["integer", "null"],
                           "description": "keep the first N components, then L2-normalize"},
            "keep_alive": _KEEP_ALIVE, "options": _OPTIONS,
            "late_chunking": LATE_CHUNKING, "truncation_direction": TRUNCATION_DIRECTION,
            "task": task}},
        "OllamaEmbed": {"type": "object", "required": ["model", "embeddings"], "properties": {
            "model": _STRING, "embeddings": {"type": "array", "items": _VECTOR}, "total_duration": _INT,
            "load_duration": _INT, "prompt_eval_count": _INT}},
        "OllamaEmbeddingsRequest": {"type": "object", "properties": {
            "model": model, "prompt": _STRING, "keep_alive": _KEEP_ALIVE, "options": _OPTIONS, "task": task}},
        "OllamaEmbeddings": {"type": "object", "required": ["embedding"], "properties": {"embedding": _VECTOR}},
        "OllamaShowRequest": {"type": "object", "description": "`model`, or Ollama's deprecated `name`; other fields "
                                                               "(verbose, system, options) are ignored",
                              "anyOf": [{"required": ["model"], "properties": {"model": {"minLength": 1}}},
                                        {"required": ["name"], "properties": {"model": {"maxLength": 0},
                                                                              "name": {"minLength": 1}}}],
                              "properties": {"model": {**model, "type": "string"},
                                             "name": {**model, "type": "string"}}},
        "OllamaShow": {"type": "object", "required": ["details", "model_info"], "properties": {
            "modelfile": _STRING, "parameters": _STRING, "template": _STRING, "details": _DETAILS,
            "model_info": {"type": "object"}, "capabilities": {"type": "array"}, "modified_at": _STRING}},
        "OllamaModels": {"type": "object", "required": ["models"],
                         "properties": {"models": {"type": "array", "items": _LISTED}}},
        "OllamaVersion": {"type": "object", "required": ["version"], "properties": {"version": _STRING}},
    }


def _answers(name: str, refusal: Refusal | None) -> Schema:
    """200 and Ollama's error statuses; an operation this configuration never serves: its one answer."""
    error = {"content": {JSON: {"schema": {"anyOf": [_ref("OllamaError"), _ref("Error")]}}}}
    if refusal is not None:
        return {str(refusal[0]): {"description": refusal[1], **error}}
    return {"200": {"description": "success", "content": {JSON: {"schema": _ref(name)}}},
            **{status: {"description": why, **error} for status, why in (
                ("400", "bad request"), ("404", "model not served"), ("413", "too many inputs"),
                ("503", "loading or overloaded"), ("504", "deadline passed"))}}


def ollama_operations(settings: Settings, serving: Serving) -> dict[str, dict[str, Schema]]:
    no_embeddings = refusals(settings, serving)[0]

    def post(summary: str, request: str, answer: str) -> Schema:
        return {"post": {"summary": summary, "requestBody": {"required": True,
                                                             "content": {JSON: {"schema": _ref(request)}}},
                         "responses": _answers(answer, no_embeddings)}}

    return {
        "/api/embed": post("Ollama's embeddings (L2-normalized)", "OllamaEmbedRequest", "OllamaEmbed"),
        "/api/embeddings": post("Ollama's legacy embedding of one prompt (normalized as Ollama does per model)",
                                "OllamaEmbeddingsRequest", "OllamaEmbeddings"),
        "/api/show": post("Ollama's model details (loads the model if need be)", "OllamaShowRequest", "OllamaShow"),
        "/api/tags": {"get": {"summary": "Ollama's list of the served embedding models",
                              "responses": _answers("OllamaModels", None)}},
        "/api/ps": {"get": {"summary": "Ollama's list of the loaded embedding models",
                            "responses": _answers("OllamaModels", None)}},
        "/api/version": {"get": {"summary": "the Ollama API version these routes follow",
                                 "responses": _answers("OllamaVersion", None)}},
    }
