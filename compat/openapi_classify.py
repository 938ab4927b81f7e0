"""The OpenAPI declarations of the sequence classification routes (compat/resources/classify.py): TEI's /predict
and vLLM's /classify, merged into compat/openapi.py's operations and schemas. Request properties are exactly the
fields compat/wire/classify.py reads (and `model`)."""
from __future__ import annotations

from typing import Any

from compat.openapi_tei import tei_answers

JSON = "application/json"
Schema = dict[str, Any]

_STRING = {"type": "string"}
_INT = {"type": "integer"}
_OPTIONAL_BOOL = {"type": ["boolean", "null"]}
_MODEL = {"anyOf": [_STRING, {"type": "null"}]}
_DIRECTION = {"anyOf": [{"enum": ["Right", "right", "Left", "left"]}, {"type": "null"}]}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def classify_schemas(batch: int) -> dict[str, Schema]:
    """batch: --max-client-batch-size."""
    sequence = {"type": "array", "minItems": 1, "maxItems": 2, "items": _STRING}
    prediction = {"type": "object", "required": ["score", "label"],
                  "properties": {"score": {"type": "number"}, "label": _STRING}}
    return {
        "TeiPredictRequest": {"type": "object", "required": ["inputs"], "properties": {
            "inputs": {"description": "a text, a text pair [text, text_pair], or a batch of those as lists "
                                      f"([[text], [text, text_pair], ...]; at most {batch}, else 413)",
                       "anyOf": [_STRING, sequence, {"type": "array", "minItems": 1, "items": sequence}]},
            "truncate": _OPTIONAL_BOOL, "truncation_direction": _DIRECTION,
            "raw_scores": {"type": ["boolean", "null"], "description": "the logits instead of the probabilities"},
            "parameters": {"anyOf": [{"type": "object", "properties": {
                "function_to_apply": {"enum": ["sigmoid", "softmax", "none"]}, "top_k": {"type": "integer"},
                "truncate": _OPTIONAL_BOOL, "truncation_direction": _DIRECTION}}, {"type": "null"}],
                "description": "huggingface_hub's Inference API task parameters: with them the answer is a list "
                               "per input"},
            "model": _MODEL}},
        "TeiPredictions": {"anyOf": [{"type": "array", "items": prediction},
                                     {"type": "array", "items": {"type": "array", "items": prediction}}]},
        "ClassifyRequest": {"type": "object", "required": ["input"], "properties": {
            "input": {"anyOf": [_STRING, {"type": "array", "minItems": 1, "items": _STRING}],
                      "description": f"texts to classify; at most {batch} (--max-client-batch-size, else 413)"},
            "use_activation": {"type": ["boolean", "null"],
                               "description": "unset or true: the head's softmax (sigmoid for a multi-label head); "
                                              "false: the logits"},
            "activation": {"type": ["boolean", "null"], "description": "vLLM's older spelling of use_activation"},
            "messages": {"description": "chat-formatted classification: not supported (400)"},
            "truncate_prompt_tokens": {"anyOf": [{"const": -1}, {"type": "null"}]}, "model": _MODEL}},
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


_CLASSIFY = {"post": {
    "summary": "vLLM's classify API: a sequence classifier's label probabilities per text",
    "requestBody": {"required": True, "content": {JSON: {"schema": _ref("ClassifyRequest")}}},
    "responses": {"200": {"description": "success", "content": {JSON: {"schema": _ref("Classification")}}}}}}

CLASSIFY_OPERATIONS: dict[str, dict[str, Schema]] = {
    "/predict": {"post": {"summary": "TEI: a sequence classifier's (or reranker's) label scores, best first",
                          "requestBody": {"required": True, "content": {JSON: {"schema": _ref("TeiPredictRequest")}}},
                          "responses": tei_answers(_ref("TeiPredictions"))}},
    "/classify": _CLASSIFY,
    "/v1/classify": _CLASSIFY,
}
