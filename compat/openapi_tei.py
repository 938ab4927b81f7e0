"""The OpenAPI declarations of TEI's native routes (compat/resources/tei.py), merged into compat/openapi.py's
operations and schemas. Request properties are exactly the fields compat/wire/tei.py reads (and `model`), their
constraints what it and the models check (compat/openapi_serving.py has what is known of the models)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compat.catalog import EMBEDDING, RERANK
from compat.openapi_serving import Refusal, Serving, known, model_field, names, refusals, token
from engine.types import ModelInfo, Pooling

from compat.openapi_fields import LATE_CHUNKING, TRUNCATION_DIRECTION, task_field

if TYPE_CHECKING:
    from compat.settings import Settings

JSON = "application/json"
Schema = dict[str, Any]

_STRING = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_NUMBER_OR_NULL = {"type": ["number", "null"]}
_OPTIONAL_BOOL = {"type": ["boolean", "null"]}
_DIRECTION = TRUNCATION_DIRECTION


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _prompt_name(infos: list[ModelInfo]) -> Schema:
    """The prompts every model the route may pick has (none known: any string)."""
    if not infos:
        return {"type": ["string", "null"]}
    shared = set.intersection(*({name for name, _ in info.prompts} for info in infos))
    return {"enum": [None, *sorted(shared)]} if shared else {"type": "null"}


def tei_schemas(settings: Settings, serving: Serving) -> dict[str, Schema]:
    """The request schemas say what compat/wire/tei.py and the models check: non-empty inputs (Empty, 400
    otherwise), at most --max-client-batch-size / --max-queue-items of them, token ids in the vocabulary,
    `dimensions` up to the width, the models' prompt names."""
    embedders = serving.of_kind(EMBEDDING) if serving.router else list(serving.models)
    every = list(serving.models)
    infos, all_infos = known(embedders), known(every)
    batch = min(settings.max_client_batch_size, settings.max_queue_items)
    tokens = token(infos)
    mixed = {"type": "array", "minItems": 1, "items": {"anyOf": [_STRING, tokens]}}
    inputs = {"description": "a text, a list of texts, token ids, or a list of token-id lists; at most "
                             f"{batch} inputs (--max-client-batch-size, --max-queue-items, else 413)",
              "anyOf": [{"type": "string", "minLength": 1}, {**mixed, "contains": tokens},
                        {"type": "array", "minItems": 1, "maxItems": batch, "items": {"anyOf": [_STRING, mixed]}}]}
    prompt_name = _prompt_name(infos)
    common = {"inputs": inputs, "truncate": _OPTIONAL_BOOL, "truncation_direction": _DIRECTION,
              "prompt_name": prompt_name, "model": model_field(serving, names(embedders), "an embedding model")}
    widths = [info.n_embd for info in infos]
    dimensions = {"anyOf": [{"type": "integer", "minimum": 1, **({"maximum": min(widths)} if widths else {})},
                            {"type": "null"}]}
    sentence = {"type": "string", "minLength": 1}
    similarity_inputs = {"type": "object", "required": ["source_sentence", "sentences"],
                         "properties": {"source_sentence": sentence,
                                        "sentences": {"type": "array", "minItems": 1, "maxItems": batch - 1,
                                                      "items": sentence}}}
    parameters = {"anyOf": [{"type": "object", "properties": {
        "truncate": _OPTIONAL_BOOL, "truncation_direction": _DIRECTION, "prompt_name": prompt_name,
        "task": task_field(infos)}},
        {"type": "null"}]}
    vector = {"type": "array", "items": _NUMBER_OR_NULL}
    any_token = token(all_infos)
    ids = {"anyOf": [{"type": "array", "minItems": 1, "items": any_token},
                     {"type": "array", "minItems": 1, "items": {"type": "array", "items": any_token},
                      "contains": {"minItems": 1}}]}
    return {
        "TeiEmbedRequest": {"type": "object", "required": ["inputs"], "properties": {
            **common, "normalize": _OPTIONAL_BOOL, "dimensions": dimensions, "late_chunking": LATE_CHUNKING,
            "task": task_field(infos)}},
        "TeiEmbedAllRequest": {"type": "object", "required": ["inputs"], "properties": {
            **common, "late_chunking": {"enum": [False, None], "description": "true is refused (422): /embed_all "
                                                                               "answers the unpooled rows"},
            "task": task_field(infos)}},
        "TeiEmbedSparseRequest": {"type": "object", "required": ["inputs"], "properties": {
            **common, "model": model_field(serving, names(embedders), "a sparse (SPLADE) embedding model"),
            "max_active_dims": {"type": ["integer", "null"], "minimum": 1,
                                "description": "ours: keep each vector's largest entries (null: the "
                                               "checkpoint's max_active_dims, else all)"}}},
        "TeiSparseEmbeddings": {"type": "array", "items": {"type": "array", "items": {
            "type": "object", "required": ["index", "value"], "properties": {"index": _INT, "value": {"type": "number"}}}}},
        "TeiSimilarityRequest": {"type": "object", "required": ["inputs"], "properties": {
            "inputs": similarity_inputs, "parameters": parameters, "model": common["model"]}},
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
        "TeiTokenizeRequest": {"type": "object", "required": ["inputs"],
                               "not": {"required": ["content"]},  # with `content`, the body is llama's
                               "properties": {
            "inputs": {"anyOf": [_STRING, {"type": "array", "minItems": 1, "items": _STRING}]},
            "add_special_tokens": _OPTIONAL_BOOL, "prompt_name": _prompt_name(all_infos),
            "model": model_field(serving, names(every), "a model (any kind)")}},
        "TeiTokens": {"type": "array", "items": {"type": "array", "items": {
            "type": "object", "required": ["id", "text", "special", "start", "stop"],
            "properties": {"id": _INT, "text": _STRING, "special": _BOOL, "start": {"type": ["integer", "null"]},
                           "stop": {"type": ["integer", "null"]}}}}},
        "TeiDecodeRequest": {"type": "object", "required": ["ids"], "properties": {
            "ids": ids, "skip_special_tokens": _OPTIONAL_BOOL,
            "model": model_field(serving, names(every), "a model (any kind)")}},
        "TeiDecoded": {"type": "array", "items": _STRING},
        "TeiError": {"type": "object", "required": ["error", "error_type"],
                     "properties": {"error": _STRING, "error_type": {
                         "enum": ["Validation", "Empty", "Tokenizer", "Overloaded", "Unhealthy", "Backend"]}}},
    }


# an error of the route is TEI's body; those raised before it (401, 413 over --payload-limit, 503 loading or
# draining) keep llama's envelope
_DEFAULT = {"description": "an error: TEI's body, or llama's envelope for those raised before the route (401, 413 "
                           "over --payload-limit, 503 loading or draining)",
            "content": {JSON: {"schema": {"anyOf": [_ref("TeiError"), _ref("Error")]}}}}


def _body(schema: Schema) -> Schema:
    return {"required": True, "content": {JSON: {"schema": schema}}}


def tei_answers(schema: Schema, *, llama_errors: bool = False) -> Schema:
    """200 with `schema`, and TEI's error statuses; llama_errors: the route also answers llama's envelope
    (POST /tokenize: TEI's body only when the request has `inputs`)."""
    error_schema = {"anyOf": [_ref("Error"), _ref("TeiError")]} if llama_errors else _ref("TeiError")
    error = {"content": {JSON: {"schema": error_schema}}}
    return {"200": {"description": "success", "content": {JSON: {"schema": schema}}}, "default": _DEFAULT,
            **{status: {"description": what, **error} for status, what in (
                ("400", "Empty: an empty input"), ("413", "Validation: an input over the limit, too many inputs"),
                ("422", "Validation / Tokenizer: a field of the wrong type or value, bad token ids"),
                ("424", "Backend: the model cannot answer this (e.g. /embed_all on a pooled model)"),
                ("429", "Overloaded: the queue is full"))}}


def not_served(refusal: Refusal) -> Schema:
    """The one answer of a TEI route this configuration never serves, in TEI's body: llama's 501 is TEI's
    Backend error (424), a 4xx its Validation (422), as compat/wire/tei.py's tei_error maps them."""
    status, why = refusal
    return {"424" if status >= 500 else "422": {"description": why,
                                                  "content": {JSON: {"schema": _ref("TeiError")}}},
            "default": _DEFAULT}


def tei_operations(settings: Settings, serving: Serving) -> dict[str, dict[str, Schema]]:
    no_embeddings = refusals(settings, serving)[0]
    embedders = serving.of_kind(EMBEDDING) if serving.router else list(serving.models)
    infos = known(embedders)
    no_embed_all = no_embeddings
    if no_embed_all is None and infos and len(infos) == len(embedders) and not any(
            info.pooling is Pooling.NONE and not info.multi_vector for info in infos):
        no_embed_all = (501, "/embed_all needs a model served with --pooling none")
    no_similarity = no_embeddings
    if no_similarity is None and infos and len(infos) == len(embedders) and all(
            info.pooling is Pooling.NONE or info.multi_vector for info in infos):
        no_similarity = (501, "/similarity needs one vector per sentence: this model gives one per token")
    no_sparse = no_embeddings
    if no_sparse is None and infos and len(infos) == len(embedders) and not any(info.is_sparse for info in infos):
        no_sparse = (501, "/embed_sparse needs a sparse (SPLADE) embedding model")
    # POST / is /similarity when `inputs` is an object: only /embed's body where that cannot be served; it is
    # /embed_sparse on a sparse model and /predict on a classifier (TEI routes by the model's type)
    bodies, answered = [_ref("TeiEmbedRequest")], [_ref("TeiEmbeddings")]
    if no_similarity is None or no_embeddings is not None:
        bodies.append(_ref("TeiSimilarityRequest"))
        answered.append(_ref("TeiSimilarity"))
    if no_sparse is None:
        bodies.append(_ref("TeiEmbedSparseRequest"))
        answered.append(_ref("TeiSparseEmbeddings"))
    every = known(list(serving.models))
    if len(every) < len(serving.models) or any(info.is_classifier for info in every):
        bodies.append(_ref("TeiPredictRequest"))
        answered.append(_ref("TeiPredictions"))
    root_body = bodies[0] if len(bodies) == 1 else {"anyOf": bodies}
    no_root = no_embeddings
    if not serving.router and serving.models[0].kind == RERANK:
        no_root = (501, "this model is a reranker: POST /rerank")

    def answers(schema: Schema, refusal: Refusal | None) -> Schema:
        return tei_answers(schema) if refusal is None else not_served(refusal)

    return {
        "/embed": {"post": {"summary": "TEI: embeddings as a bare [[float]]",
                            "requestBody": _body(_ref("TeiEmbedRequest")),
                            "responses": answers(_ref("TeiEmbeddings"), no_embeddings)}},
        "/embed_all": {"post": {"summary": "TEI: each input's per-token rows (a model served with --pooling none)",
                                "requestBody": _body(_ref("TeiEmbedAllRequest")),
                                "responses": answers(_ref("TeiTokenEmbeddings"), no_embed_all)}},
        "/embed_sparse": {"post": {"summary": "TEI: a sparse (SPLADE) encoder's nonzero entries per input, "
                                              "[{index, value}] by ascending index",
                                   "requestBody": _body(_ref("TeiEmbedSparseRequest")),
                                   "responses": answers(_ref("TeiSparseEmbeddings"), no_sparse)}},
        "/similarity": {"post": {"summary": "TEI: the cosine of each sentence with the source sentence",
                                 "requestBody": _body(_ref("TeiSimilarityRequest")),
                                 "responses": answers(_ref("TeiSimilarity"), no_similarity)}},
        "/": {"post": {"summary": "TEI's root route (huggingface_hub's InferenceClient): /embed (/embed_sparse for a "
                                  "sparse model), or /similarity when `inputs` is {source_sentence, sentences}; "
                                  "/predict on a sequence classifier",
                       "requestBody": _body(root_body),
                       "responses": answers(answered[0] if len(answered) == 1 else {"anyOf": answered}, no_root)}},
        "/decode": {"post": {"summary": "TEI: token ids back to text, one string per list",
                             "requestBody": _body(_ref("TeiDecodeRequest")),
                             "responses": tei_answers(_ref("TeiDecoded"))}},
        "/info": {"get": {"summary": "TEI's Info: the model and the server's limits",
                          "responses": {"200": {"description": "success",
                                                "content": {JSON: {"schema": _ref("TeiInfo")}}},
                                        "default": _DEFAULT}}},
    }
