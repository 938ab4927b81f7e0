"""The OpenAPI declarations of the sequence classification routes (compat/resources/classify.py): TEI's /predict
and vLLM's /classify, merged into compat/openapi.py's operations and schemas. Request properties are exactly the
fields compat/wire/classify.py reads (and `model`), their constraints what it checks."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from compat.openapi_serving import Refusal, ServedModel, Serving, model_field, names
from compat.openapi_tei import not_served, tei_answers
from engine.types import ModelInfo

if TYPE_CHECKING:
    from compat.settings import Settings

JSON = "application/json"
Schema = dict[str, Any]

_STRING = {"type": "string"}
_TEXT = {"type": "string", "minLength": 1}  # an empty text is refused (TEI's Empty; vLLM's 400)
_INT = {"type": "integer"}
_OPTIONAL_BOOL = {"type": ["boolean", "null"]}
_DIRECTION = {"anyOf": [{"enum": ["Right", "right", "Left", "left"]}, {"type": "null"}]}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _can_classify(info: ModelInfo) -> bool:
    """What Engine.classify serves: a sequence classifier, or a one-label cross-encoder."""
    return info.is_classifier or info.kind == "cross-encoder"


def _classifiers(serving: Serving) -> list[ServedModel]:
    """The models a request may pick (not loaded: not known, so not ruled out)."""
    return [model for model in serving.models if model.info is None or _can_classify(model.info)]


def _refusal(serving: Serving) -> Refusal | None:
    if not _classifiers(serving):
        return (400, "label scores need a sequence classifier (a *ForSequenceClassification checkpoint): "
                     "none is served")
    return None


def _default_refused(serving: Serving) -> bool:
    """Several models: the route's default (the first configured) cannot classify, so `model` is required."""
    first = serving.models[0].info if serving.models else None
    return serving.router and first is not None and not _can_classify(first)


def classify_schemas(settings: Settings, serving: Serving) -> dict[str, Schema]:
    """The routes take any served model (a classifier, or a one-label cross-encoder, else the engine refuses it)."""
    batch = min(settings.max_client_batch_size, settings.max_queue_items)
    model = model_field(serving, names(_classifiers(serving) or list(serving.models)),
                        "a sequence classifier (or a one-label reranker)")
    required = ["model"] if _default_refused(serving) else []
    if required:  # null or "" would pick the default, which cannot classify
        model = {**model, "enum": [name for name in model["enum"] if name]}
    sequence = {"type": "array", "minItems": 1, "maxItems": 2, "items": _TEXT}
    prediction = {"type": "object", "required": ["score", "label"],
                  "properties": {"score": {"type": "number"}, "label": _STRING}}
    return {
        "TeiPredictRequest": {"type": "object", "required": ["inputs", *required], "properties": {
            "inputs": {"description": "a text, a text pair [text, text_pair], or a batch of those as lists "
                                      f"([[text], [text, text_pair], ...]; at most {batch}, --max-client-batch-size, "
                                      "--max-queue-items, else 413)",
                       "anyOf": [_TEXT, sequence, {"type": "array", "minItems": 1, "maxItems": batch,
                                                   "items": sequence}]},
            "truncate": _OPTIONAL_BOOL, "truncation_direction": _DIRECTION,
            "raw_scores": {"type": ["boolean", "null"], "description": "the logits instead of the probabilities"},
            "parameters": {"anyOf": [{"type": "object", "properties": {
                "function_to_apply": {"enum": ["sigmoid", "softmax", "none", None]},
                "top_k": {"type": ["integer", "null"], "minimum": 1},
                "truncate": _OPTIONAL_BOOL, "truncation_direction": _DIRECTION}}, {"type": "null"}],
                "description": "huggingface_hub's Inference API task parameters: with them the answer is a list "
                               "per input"},
            "model": model}},
        "TeiPredictions": {"anyOf": [{"type": "array", "items": prediction},
                                     {"type": "array", "items": {"type": "array", "items": prediction}}]},
        "ClassifyRequest": {"type": "object", "required": ["input", *required], "properties": {
            "input": {"anyOf": [_TEXT, {"type": "array", "minItems": 1, "maxItems": batch, "items": _TEXT}],
                      "description": f"texts to classify; at most {batch} (--max-client-batch-size, "
                                     "--max-queue-items, else 413)"},
            "use_activation": {"type": ["boolean", "null"],
                               "description": "unset or true: the head's softmax (sigmoid for a multi-label head); "
                                              "false: the logits"},
            "activation": {"type": ["boolean", "null"], "description": "vLLM's older spelling of use_activation"},
            "messages": {"type": "null", "description": "chat-formatted classification: not supported (400)"},
            "truncate_prompt_tokens": {"anyOf": [{"const": -1}, {"type": "null"}]}, "model": model}},
        "Classification": {
            "type": "object", "required": ["id", "object", "created", "model", "data", "usage"],
            "properties": {"id": _STRING, "object": {"const": "list"}, "created": _INT, "model": _STRING,
                           "data": {"type": "array", "items": {
                               "type": "object", "required": ["index", "label", "probs", "num_classes"],
                               "properties": {"index": _INT, "label": _STRING,
                                              "probs": {"type": "array", "items": {"type": "number"}},
                                              "num_classes": _INT}}},
                           "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"],
                                     "properties": {"prompt_tokens": _INT, "total_tokens": _INT,
                                                    "completion_tokens": _INT,
                                                    "prompt_tokens_details": {"type": "null"}}}}},
    }


def classify_operations(settings: Settings, serving: Serving) -> dict[str, dict[str, Schema]]:
    refusal = _refusal(serving)
    classify = {"post": {
        "summary": "vLLM's classify API: a sequence classifier's label probabilities per text",
        "requestBody": {"required": True, "content": {JSON: {"schema": _ref("ClassifyRequest")}}},
        "responses": {"200": {"description": "success", "content": {JSON: {"schema": _ref("Classification")}}}}
        if refusal is None else {"400": {"description": refusal[1], "content": {JSON: {"schema": _ref("Error")}}}}}}
    return {
        "/predict": {"post": {"summary": "TEI: a sequence classifier's (or reranker's) label scores, best first",
                              "requestBody": {"required": True,
                                              "content": {JSON: {"schema": _ref("TeiPredictRequest")}}},
                              "responses": tei_answers(_ref("TeiPredictions")) if refusal is None
                              else not_served(refusal)}},
        "/classify": classify,
        "/v1/classify": classify,
    }
