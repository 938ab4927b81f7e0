"""GET /openapi.json: an OpenAPI 3.1 document of every route the app serves, built from the app's own route
table and the request/response schemas declared here.

Each route path has its operations declared in `_operations`; a route added to the app without a declaration
makes `openapi_document` raise when the app is made, so the app cannot start with an undocumented route. The
request schemas' properties are exactly the fields the parsers in compat/wire read (tests/compat/test_openapi.py
records the keys each parser looks up and compares), and their constraints are what the parsers and the engine
check: a request the document allows is one the route serves, so generated requests mostly succeed
(tests/server/test_fuzz.py bounds the share refused) and the responses are what the renderers produce (the fuzz
run checks every answer against this document).

The document describes the server as it is when it is asked for: the limits from the settings
(--max-client-batch-size, --max-queue-items, --payload-limit), what each served model accepts once it is loaded
(its vocabulary for token ids, its width for `dimensions`, its prompts, whether it takes instructions or
images; on a several-model server what every model a route may pick accepts), the names a request's `model` may
say, and which routes this configuration does not serve: such an operation documents its one answer (501, or
400 where the model can never serve it, as /maxsim on a single-vector model) instead of 200.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import falcon

from compat import app_routes
from compat.catalog import EMBEDDING, RERANK
from compat.middleware import PUBLIC_PATHS, normalize_prefix
from compat.openapi_serving import ServedModel, Serving, refusals
from compat.openapi_serving import every_known as _all
from compat.openapi_serving import known as _known
from compat.openapi_serving import model_field as _model_field
from compat.openapi_serving import names as _names
from compat.openapi_serving import token as _token
from compat.openapi_ollama import ollama_operations, ollama_schemas
from compat.openapi_others import other_servers_operations, other_servers_schemas
from compat.openapi_tei import tei_answers, tei_operations, tei_schemas
from compat.openapi_classify import classify_operations, classify_schemas
from compat.openapi_fields import LATE_CHUNKING, TRUNCATION_DIRECTION, task_field
from compat.wire.inputs import MAX_JSON_DEPTH
from engine.types import Pooling

if TYPE_CHECKING:
    from compat.routing import Models
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
_NULL = {"type": "null"}
_NUMBER_OR_NULL = {"type": ["number", "null"]}  # NaN and infinities print as null
_FALSY = {"enum": [None, False, 0, "", [], {}], "description": "none: a text-only prompt"}  # `if not media`
_ANY_FLAG = {"description": "a boolean; any other value (null included) means the default, as llama's json_value "
                            "reads it"}


def _image_source() -> Schema:
    return {"type": "string", "minLength": 1,
            "description": "a data:image/...;base64 URL, bare base64, a file:// URL inside --media-path or an "
                           "http(s):// URL with --allow-remote-media"}


def _image_ref() -> Schema:
    """An image as a URL string or {url}."""
    return {"anyOf": [_image_source(), {"type": "object", "required": ["url"], "properties": {"url": _image_source()}}]}


def _content_part(images: bool) -> Schema:
    """An OpenAI content part; an object with `prompt_string` is llama's multimodal prompt instead."""
    text = {"type": "object", "required": ["type", "text"],
            "properties": {"type": {"const": "text"}, "text": _STRING, "prompt_string": False}}
    if not images:
        return text
    image = {"type": "object", "required": ["type", "image_url"],
             "properties": {"type": {"const": "image_url"}, "prompt_string": False,
                            "image_url": _image_ref()}}
    return {"anyOf": [text, image]}


def _prompt_object(images: bool) -> Schema:
    """llama's {prompt_string, multimodal_data}: one <__media__> marker per image."""
    media = {"anyOf": [{"type": "array", "minItems": 1, "items": _image_source()}, _FALSY]} if images else _FALSY
    return {"type": "object", "required": ["prompt_string"],
            "properties": {"prompt_string": _STRING, "multimodal_data": media}}


def _embeddings_request(settings: Settings, serving: Serving, models: list[ServedModel]) -> Schema:
    infos = _known(models)
    images = not infos or _all(infos, lambda info: info.takes_images)
    batch = min(settings.max_client_batch_size, settings.max_queue_items)
    token = _token(infos)
    content_part, prompt_object = _content_part(images), _prompt_object(images)
    mixed = {"type": "array", "minItems": 1, "items": {"anyOf": [_STRING, token]}}
    prompts = {
        "description": "one text, one list of token ids (or of texts and ids mixed: one prompt), or a list of "
                       f"texts / token lists / {{prompt_string}} objects / content parts, one prompt each; at most "
                       f"{batch} prompts (--max-client-batch-size, --max-queue-items, else 413)"
                       + ("" if images else "; this model takes no images"),
        "anyOf": [_STRING, prompt_object, content_part,
                  {**mixed, "contains": token},
                  {"type": "array", "minItems": 1, "maxItems": batch,
                   "items": {"anyOf": [_STRING, prompt_object, content_part, mixed,
                                       {"type": "array", "minItems": 1, "items": content_part}]}}],
    }
    multi_vector = any(info.multi_vector for info in infos)
    dimensions: Schema = (_NULL if multi_vector else
                          _nullable({"type": "integer", "minimum": 1,
                                     **({"maximum": min(info.n_embd for info in infos)} if infos else {})}))
    if infos:  # the prompts every model the route may pick has
        shared = set.intersection(*({name for name, _ in info.prompts} for info in infos))
        prompt_name = _nullable({"enum": sorted(shared)}) if shared else _NULL
    else:
        prompt_name = _nullable(_STRING)
    instruction = (_nullable({"type": "string", "minLength": 1})
                   if _all(infos, lambda info: info.instruction_template is not None) else _NULL)
    return {
        "type": "object",
        "description": "llama-server's and OpenAI's embedding request; `input` or `content` is required "
                       "(`content` answers in llama's shape on every route). Other fields are ignored.",
        # `input` wins: `content` is read only without it
        "anyOf": [{"required": ["input"]},
                  {"required": ["content"], "properties": {"content": prompts, "input": False}}],
        # an instruction fills the family's template: it cannot come with a named prompt
        "allOf": [{"anyOf": [{"properties": {"instruction": _NULL}}, {"properties": {"prompt_name": _NULL}}]}],
        "properties": {
            "input": prompts,
            "content": {"description": "llama's field, read when `input` is absent: the same forms as `input`"},
            "encoding_format": {"enum": ["float", "base64", "int8", "uint8", "binary", "ubinary"],
                                "default": "float",
                                "description": "int8 / uint8 / binary / ubinary: our extension, integer codes "
                                               "(docs/routes.md, \"Compact vectors\")"},
            "embd_normalize": {"type": "integer", "description": "-1 none, 0 max absolute, 1 taxicab, "
                                                                 "2 Euclidean (default: --embd-normalize), >2 p-norm"},
            "truncate": _nullable(_BOOL), "model": _model_field(serving, _names(models), "an embedding model"),
            "prompt_name": {**prompt_name, "description": "one of the model's prompts (/props `prompts`)"},
            "instruction": {**instruction, "description": "fills the model's instruction template (/props "
                                                          "`instruction_template`); null when it has none"},
            "dimensions": {**dimensions, "description": "keep the first N components (Matryoshka), 1 to the "
                                                        "model's width; a multi-vector model refuses it"},
            "late_chunking": LATE_CHUNKING, "truncation_direction": TRUNCATION_DIRECTION, "task": task_field(infos),
        }}


def _item(images: bool) -> Schema:
    """A query or a document: a text, or (rerankers that take images) text and images."""
    content_part = _content_part(images)
    image_field = _nullable(_image_ref()) if images else _NULL
    plain_object: Schema = {"type": "object", "properties": {"text": _STRING, "image": image_field,
                                                             "image_url": image_field, "type": False,
                                                             "prompt_string": False}}
    if not images:
        plain_object["required"] = ["text"]
    else:  # a text, an image or both
        plain_object["anyOf"] = [{"required": ["text"]}, {"required": ["image"], "properties": {"image": {
            "not": _NULL}}}, {"required": ["image_url"], "properties": {"image_url": {"not": _NULL}}}]
    return {"description": "a text; for rerankers that take images also {text, image | image_url} (a URL or "
                           "{url}), an OpenAI content part or a list of them, or llama's {prompt_string, "
                           "multimodal_data}",
            "anyOf": [_STRING, plain_object, content_part, {"type": "array", "minItems": 1, "items": content_part},
                      _prompt_object(images)]}


def _rerank_request(settings: Settings, serving: Serving, models: list[ServedModel], *, maxsim: bool) -> Schema:
    infos = _known(models)
    images = not infos or _all(infos, lambda info: info.takes_images)
    batch = min(settings.max_client_batch_size, settings.max_queue_items - (1 if maxsim else 0))
    documents = {"type": "array", "minItems": 1, "maxItems": batch, "items": _item(images),
                 "description": f"at most {batch} (--max-client-batch-size, --max-queue-items, else 413)"}
    if maxsim:  # MaxSim builds its own prompts
        instruction = {**_NULL, "description": "not used by MaxSim"}
    elif _all(infos, lambda info: info.kind == "generative-reranker"):
        instruction = {**_nullable(_STRING), "description": "generative rerankers: overrides --rerank-instruction"}
    else:
        instruction = {**_NULL, "description": "only generative rerankers take one"}
    what = "a multi-vector embedding model" if maxsim else "a reranker"
    return {
        "type": "object", "required": ["query"],
        "description": "llama-server / Jina / Cohere / TEI rerank request; `documents` or `texts` (TEI: the "
                       "`texts` key selects TEI's answer shape) is required. Ignored: priority, relevant_spans, "
                       "raw_scores, max_tokens_per_doc, truncation_direction.",
        # `documents` wins; a null one falls back to `texts`
        "anyOf": [{"required": ["documents"], "properties": {"documents": documents}},
                  {"required": ["texts"], "properties": {"texts": documents, "documents": _NULL}}],
        "properties": {
            "query": _item(images), "documents": _nullable(documents),
            "texts": {"description": "TEI's field, read when `documents` is absent or null: the same forms; the key "
                                     "alone selects TEI's answer shape"},
            "top_n": _nullable({"type": "integer", "minimum": 0}),
            "return_documents": _nullable(_BOOL), "return_text": _nullable(_BOOL),
            "truncate": _nullable(_BOOL), "instruction": instruction,
            "model": _model_field(serving, _names(models), what),
            "max_chunks_per_doc": _nullable({"type": "integer", "minimum": 1}),
            "rank_fields": _nullable({"enum": [[], ["text"]]}),
        }}


def _schemas(settings: Settings, serving: Serving) -> dict[str, Schema]:
    embedders, rerankers = serving.of_kind(EMBEDDING), serving.of_kind(RERANK)
    # the models MaxSim can score with (with none, the embedders, which refuse it: the operation says so)
    multi_vector = [model for model in embedders if model.info is None or model.info.multi_vector] or embedders
    every = list(serving.models)
    token = _token(_known(every))
    usage = {"type": "object", "required": ["prompt_tokens", "total_tokens"],
             "properties": {"prompt_tokens": _INT, "total_tokens": _INT}}
    rerank_result = {"type": "object", "required": ["index", "relevance_score"],
                     "properties": {"index": _INT, "relevance_score": _NUMBER_OR_NULL,
                                    "document": {"type": ["object", "array"],
                                                 "description": "{text} for a string, else the item as sent"}}}
    listed_model = {"type": "object", "required": ["id", "object"],
                    "properties": {"id": _STRING, "object": {"const": "model"}, "aliases": {"type": "array"},
                                   "tags": {"type": "array"}, "created": _INT, "owned_by": _STRING,
                                   "meta": {"type": "object"}, "status": {"type": "object"}, "kind": _STRING,
                                   "memory_bytes": _INT, "stats": {"type": "object"}}}
    maxsim_request = _rerank_request(settings, serving, multi_vector, maxsim=True)
    if serving.router and embedders and not (embedders[0].info is None or embedders[0].info.multi_vector):
        maxsim_request["required"] = ["query", "model"]  # the default embedding model is not multi-vector
    return {
        "Error": {
            "type": "object", "required": ["error"],
            "properties": {"error": {"type": "object", "required": ["code", "message", "type"],
                                     "properties": {"code": _INT, "message": _STRING, "type": _STRING,
                                                    "n_prompt_tokens": _INT, "n_ctx": _INT}}}},
        "EmbeddingsRequest": _embeddings_request(settings, serving, embedders if serving.router else every),
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
        "RerankRequest": _rerank_request(settings, serving, rerankers if serving.router else every, maxsim=False),
        "MaxSimRequest": maxsim_request,
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
        **other_servers_schemas(settings, serving),
        **classify_schemas(settings, serving),
        "TokenizeRequest": {
            "type": "object",
            # token ids come back as they were sent; only their pieces need them in the vocabulary
            "anyOf": [{"properties": {"with_pieces": {"not": {"const": True}}}},
                      {"properties": {"content": {"anyOf": [_STRING, {"type": "array",
                                                                       "items": {"anyOf": [_STRING, token]}}]}}}],
            "properties": {"content": {"anyOf": [_STRING, {"type": "array", "items": {"anyOf": [_STRING, _INT]}}],
                                       "description": "one prompt: a text, or texts and token ids mixed; absent: "
                                                      "no tokens"},
                           "add_special": _ANY_FLAG, "parse_special": _ANY_FLAG, "with_pieces": _ANY_FLAG,
                           "model": _model_field(serving, _names(every), "a model (any kind)")}},
        "Tokens": {
            "type": "object", "required": ["tokens"],
            "properties": {"tokens": {"type": "array", "items": {"anyOf": [_INT, {
                "type": "object", "required": ["id", "piece"],
                "properties": {"id": _INT, "piece": {"anyOf": [_STRING, {"type": "array", "items": _INT}]}}}]}}}},
        "DetokenizeRequest": {
            "type": "object", "properties": {"tokens": {"type": "array", "items": token},
                                             "model": _model_field(serving, _names(every), "a model (any kind)")}},
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
            "enum": sorted(set(_names(every))) or [""], "description": "a configured model's id or alias"}}},
        "Slots": {"type": "array", "items": {
            "type": "object", "required": ["id", "n_ctx", "is_processing"],
            "properties": {"id": _INT, "n_ctx": _INT, "speculative": _BOOL, "is_processing": _BOOL}}},
        **ollama_schemas(settings, serving),
    }


def _body(name: str) -> Schema:
    return {"required": True, "content": {JSON: {"schema": _ref(name)}}}


def _ok(schema: Schema, description: str = "success", media: str = JSON) -> Schema:
    return {"200": {"description": description, "content": {media: {"schema": schema}}}}


def _one_of(*names: str) -> Schema:
    return {"oneOf": [_ref(name) for name in names]}


def _only(status: int, description: str) -> Schema:
    """The one answer of an operation this configuration never serves."""
    return {str(status): {"description": description, "content": {JSON: {"schema": _ref("Error")}}}}


def _served(responses: Schema, refusal: tuple[int, str] | None) -> Schema:
    return responses if refusal is None else _only(*refusal)


def _query(name: str, description: str, schema: Schema | None = None, required: bool = False) -> Schema:
    return {"name": name, "in": "query", "required": required, "schema": schema or _STRING,
            "description": description}


def _operations(settings: Settings, serving: Serving) -> dict[str, dict[str, Schema]]:
    """Route path -> operations by method (lower case), as the app registers them, for this configuration."""
    embedders, rerankers = serving.of_kind(EMBEDDING), serving.of_kind(RERANK)
    router = serving.router
    no_embeddings, no_rerank, no_maxsim, no_oai = refusals(settings, serving)
    not_enabled = {flag: (501, f"not served: start the server with --{flag}")
                   for flag in ("metrics", "slots", "props") if not getattr(settings, flag)}
    names = sorted(set(_names(list(serving.models))))
    model_query = _query(
        "model", "several models: the model to answer for, by id or alias (it is loaded if need be); one model: "
                 "ignored", {"enum": ["", *names]} if router else _STRING)
    embed = {"post": {"summary": "embeddings in llama-server's shape", "requestBody": _body("EmbeddingsRequest"),
                      "responses": _served(_ok(_ref("LlamaEmbeddings")), no_embeddings)}}
    rerank = {"post": {"summary": "rerank documents (llama-server / Jina / Cohere v1; TEI's bare array when the "
                                  "body has `texts`)", "requestBody": _body("RerankRequest"),
                       "responses": _served(_ok(_one_of("Rerank", "TeiRerank")), no_rerank)}}
    maxsim = {"post": {"summary": "a multi-vector model's MaxSim scores of the query against each document, in the "
                                  "rerank routes' shapes", "requestBody": _body("MaxSimRequest"),
                       "responses": _served(_ok(_one_of("Rerank", "TeiRerank")), no_maxsim)}}
    health = {"get": {"summary": "readiness: 200 when serving, 503 while loading or draining",
                      "responses": _ok(_ref("Health"))}}
    if router:
        reload = "re-read the preset and --config files first (any non-empty value)"
        models = {"get": {"summary": "the served models", "responses": _ok(_ref("Models")),
                          "parameters": [_query("reload", reload)]},
                  "post": {"summary": "?reload: re-read the configuration, then list the models (llama-server's "
                                      "POST /models downloads a model: without ?reload, 501)",
                           "parameters": [_query("reload", reload, {"type": "string", "minLength": 1}, True)],
                           "responses": {**_ok(_ref("Models")),
                                         **_only(501, "without ?reload: downloading models is not served here")}}}
    else:
        models = {"get": {"summary": "the served model (llama-server's single-model list; ?reload is ignored, as "
                                     "it is there)", "responses": _ok(_ref("Models"))},
                  "post": {"summary": "several models only: a one-model server has no configuration to reload",
                           "responses": _only(501, "not served: this server serves the one model given with -m")}}
    not_served = {"post": {"summary": "a llama-server generation route: answered 501, this server does not generate",
                           "responses": _only(501, "not supported")}}
    state = ("400 when the model is {}: it depends on what is loaded, not on the request alone")
    operations: dict[str, dict[str, Schema]] = {
        "/health": health,
        "/v1/health": health,
        "/v1/embeddings": {"post": {"summary": "embeddings in OpenAI's shape (llama's with `content`)",
                                    "requestBody": _body("EmbeddingsRequest"),
                                    "responses": _served(_ok(_one_of("OaiEmbeddings", "LlamaEmbeddings")),
                                                         no_embeddings or no_oai)}},
        "/embedding": embed,
        "/embeddings": embed,
        **{path: rerank for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")},
        "/maxsim": maxsim,
        "/v1/maxsim": maxsim,
        "/v2/rerank": {"post": {"summary": "rerank documents (Cohere v2)", "requestBody": _body("RerankRequest"),
                                "responses": _served(_ok(_ref("CohereV2Rerank")), no_rerank)}},
        **other_servers_operations(settings, serving),  # Cohere embed, vLLM score
        **classify_operations(settings, serving),  # TEI's /predict, vLLM's /classify
        "/tokenize": {"post": {"summary": "text to token ids (TEI's token objects when the body has `inputs`)",
                               "requestBody": {"required": True, "content": {JSON: {"schema": {"anyOf": [
                                   _ref("TokenizeRequest"), _ref("TeiTokenizeRequest")]}}}},
                               "responses": tei_answers(_one_of("Tokens", "TeiTokens"), llama_errors=True)}},
        "/detokenize": {"post": {"summary": "token ids to text", "requestBody": _body("DetokenizeRequest"),
                                 "responses": _ok(_ref("Content"))}},
        "/props": {"get": {"summary": "server and model properties", "parameters": [model_query],
                           "responses": _ok(_ref("Props"))},
                   "post": {"summary": "change properties: accepted with --props (nothing is changeable), else 501",
                            "requestBody": {"required": False, "content": {JSON: {"schema": {}}}},
                            "responses": _served(_ok(_ref("Success")), not_enabled.get("props"))}},
        "/models": models,
        "/v1/models": models,
        "/models/load": {"post": {"summary": "load a configured model (several models)",
                                  "requestBody": _body("ModelRequest"),
                                  "responses": {**_ok(_ref("Success")),
                                                **_only(400, state.format("already loaded or loading"))}}},
        "/models/unload": {"post": {"summary": "unload a model once its requests finish (several models)",
                                    "requestBody": _body("ModelRequest"),
                                    "responses": {**_ok(_ref("Success")),
                                                  **_only(400, state.format("not loaded"))}}},
        "/slots": {"get": {"summary": "slots (needs --slots)", "parameters": [model_query],
                           "responses": _served(_ok(_ref("Slots")), not_enabled.get("slots"))}},
        "/metrics": {"get": {"summary": "Prometheus metrics (needs --metrics)",
                             "responses": _served(_ok(_STRING, media="text/plain"), not_enabled.get("metrics"))}},
        "/openapi.json": {"get": {"summary": "this document", "responses": _ok({"type": "object"})}},
        **ollama_operations(settings, serving),  # Ollama's /api/... routes
        **tei_operations(settings, serving),
        **{path: not_served for path in ("/completion", "/completions", "/v1/completions", "/chat/completions",
                                         "/v1/chat/completions", "/infill", "/v1/responses", "/v1/messages",
                                         "/apply-template")},
    }
    return operations


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


def openapi_document(app: falcon.App, settings: Settings, version: str, serving: Serving | None = None) -> Schema:
    """The document for `app` as configured, and for what it serves (None: nothing known of the models yet);
    raises UndeclaredRoute for a route without a declaration."""
    if serving is None:
        router = any(route.path == "/models/load" for route in app_routes.inspect_routes(app))
        serving = Serving(router, () if router else (ServedModel(
            (), RERANK if settings.pooling is Pooling.RANK else EMBEDDING, None),))
    secured = bool(settings.api_key)
    operations = _operations(settings, serving)
    paths: dict[str, Schema] = {}
    for route in app_routes.inspect_routes(app):
        declared = operations.get(route.path)
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
                                f"{MAX_JSON_DEPTH} levels. Inputs are also bounded in tokens (the model's and -ub's "
                                "limits, else 400 unless truncated)."},
        "servers": [{"url": normalize_prefix(settings.api_prefix) or "/"}],
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": {**_schemas(settings, serving), **tei_schemas(settings, serving)}},
    }
    if secured:
        document["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"}}
        document["security"] = [{"bearer": []}, {"apiKey": []}]
    return document


class OpenApiResource:
    """The document of the app as it serves now: made when asked (models load, a reload changes the names)."""

    def __init__(self, models: Models, settings: Settings, version: str) -> None:
        self._models = models
        self._settings = settings
        self._version = version
        self.app: falcon.App | None = None

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        assert self.app is not None
        resp.media = openapi_document(self.app, self._settings, self._version,
                                      Serving.of(self._models, self._settings))
