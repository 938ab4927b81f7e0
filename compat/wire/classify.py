"""Sequence classification bodies: TEI's POST /predict (router/src/http/types.rs PredictRequest, server.rs
predict) and vLLM's POST /classify (vllm/entrypoints/pooling/classify/protocol.py). Pure: no falcon.

TEI /predict:
- `inputs`: a string; a list of one string (a text) or two (a text pair); or a batch, a list of such lists
  (`[["a"], ["b", "c"]]`) — a list of three or more strings is refused, as TEI refuses it. `truncate` (null:
  the server's --truncate), `truncation_direction` (Right / Left), `raw_scores` (default false: softmax, or
  sigmoid for a multi-label head or a one-label reranker; true: the logits).
- Answer: per input `[{"score", "label"}]` over every label, highest score first; a batch answers a list of
  those, in input order.
- huggingface_hub's InferenceClient.text_classification posts `{"inputs": text, "parameters": {...}}` to POST /
  (the Inference API's task shape): with `parameters` the answer is the Inference API's, a list per input even
  for one (`[[{"label", "score"}]]`), `parameters.function_to_apply` (sigmoid / softmax / none) applied to the
  logits and `parameters.top_k` keeping the best k.

vLLM /classify: `input` a string or a list of strings (token-id inputs and `messages` are refused by name),
`use_activation` (unset or true: the head's activation; false: raw logits; the older `activation` spelling too),
`truncate_prompt_tokens` -1 (cut to the model's length; a positive count is refused, as /score refuses it), `model`.
Answer {"id", "object": "list", "created", "model", "data": [{"index", "label", "probs", "num_classes"}], "usage"},
`label` the best-scoring label's name. Errors: our OpenAI-style envelope.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from compat.errors import bad_request
from compat.wire.inputs import whole
from compat.wire.score import parse_pooling_fields
from compat.wire.tei import BAD_DIRECTION, EMPTY_INPUTS, TeiError
from engine.types import ClassifyResult

Input = str | tuple[str, str]

BAD_PREDICT_INPUTS = ('"inputs" must be a string, a pair of strings [string, string] or a batch of mixed strings '
                      'and pairs [[string], [string, string], ...]')
BAD_FUNCTION = '"function_to_apply" must be one of "sigmoid", "softmax", "none"'
BAD_TOP_K = '"top_k" must be a positive integer'
BAD_CLASSIFY_INPUT = '"input" must be a string or a non-empty list of strings'
CLASSIFY_TOKENS = ('token-id inputs are not supported on /classify: send the texts (the server tokenizes them with '
                   "the model's tokenizer)")
CLASSIFY_MESSAGES = '"messages" (chat-formatted classification) is not supported: send the texts as "input"'


@dataclass(frozen=True)
class PredictRequest:
    inputs: list[Input]
    batch: bool  # a batch answers a list per input; a single input answers its list
    truncate: bool | None
    truncate_left: bool
    raw_scores: bool
    inference_api: bool = False  # the body has `parameters` (InferenceClient): the Inference API's answer
    function: str | None = None  # parameters.function_to_apply
    top_k: int | None = None


def _sequence(item: object) -> Input:
    if not isinstance(item, list) or not all(isinstance(s, str) for s in item) or len(item) not in (1, 2):
        raise TeiError("Validation", BAD_PREDICT_INPUTS, status=422)
    return item[0] if len(item) == 1 else (item[0], item[1])


def _predict_inputs(value: object) -> tuple[list[Input], bool]:
    """TEI's PredictInput: (inputs, is a batch)."""
    if isinstance(value, str):
        return [value], False
    if not isinstance(value, list) or not value:
        raise TeiError("Validation", BAD_PREDICT_INPUTS, status=422)
    if isinstance(value[0], str):
        return [_sequence(value)], False
    return [_sequence(item) for item in value], True


def _option(body: dict[str, Any], parameters: dict[str, Any], key: str) -> Any:
    return parameters[key] if parameters.get(key) is not None else body.get(key)


def parse_predict_request(body: dict[str, Any]) -> PredictRequest:
    inputs, batch = _predict_inputs(body.get("inputs"))
    if any(not text for item in inputs for text in ((item,) if isinstance(item, str) else item)):
        raise TeiError("Empty", EMPTY_INPUTS)
    parameters = body.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise TeiError("Validation", '"parameters" must be an object', status=422)
    params = parameters or {}
    truncate = _option(body, params, "truncate")
    if truncate is not None and not isinstance(truncate, bool):
        raise TeiError("Validation", '"truncate" must be a boolean', status=422)
    direction = _option(body, params, "truncation_direction")
    if direction is not None and direction not in ("Right", "right", "Left", "left"):
        raise TeiError("Validation", BAD_DIRECTION, status=422)
    raw = body.get("raw_scores", False)
    if raw is None:
        raw = False
    if not isinstance(raw, bool):
        raise TeiError("Validation", '"raw_scores" must be a boolean', status=422)
    function = params.get("function_to_apply")
    if function is not None and function not in ("sigmoid", "softmax", "none"):
        raise TeiError("Validation", BAD_FUNCTION, status=422)
    top_k = whole(params.get("top_k"))
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise TeiError("Validation", BAD_TOP_K, status=422)
    return PredictRequest(inputs=inputs, batch=batch, truncate=truncate,
                          truncate_left=direction in ("Left", "left"),
                          raw_scores=raw or function is not None, inference_api=parameters is not None,
                          function=function, top_k=top_k)


def _applied(logits: list[float], function: str) -> list[float]:
    x = np.asarray(logits, dtype=np.float64)
    if function == "sigmoid":
        x = 0.5 * (1.0 + np.tanh(0.5 * x))
    elif function == "softmax":
        e = np.exp(x - x.max())
        x = e / e.sum()
    return [float(v) for v in x]


def render_predict_response(request: PredictRequest, result: ClassifyResult) -> list:
    """TEI's PredictResponse; the Inference API's list per input when the request came as one."""
    answers = []
    for scores in result.scores:
        if request.function is not None:
            scores = _applied(scores, request.function)
        ranked = sorted(zip(scores, result.labels), key=lambda pair: -pair[0])  # stable: ties keep label order
        if request.top_k is not None:
            ranked = ranked[:request.top_k]
        answers.append([{"score": score, "label": label} for score, label in ranked])
    return answers if request.batch or request.inference_api else answers[0]


@dataclass(frozen=True)
class ClassifyRequest:
    texts: list[str]
    use_activation: bool
    truncate: bool | None
    model: str | None


def parse_classify_request(body: dict[str, Any]) -> ClassifyRequest:
    if body.get("messages") is not None:
        raise bad_request(CLASSIFY_MESSAGES)
    value = body.get("input")
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) or
                                                 isinstance(v, list) for v in value):
        raise bad_request(CLASSIFY_TOKENS)
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise bad_request(BAD_CLASSIFY_INPUT)
    if not all(texts):
        raise bad_request("Input content cannot be empty")
    use_activation, truncate, model = parse_pooling_fields(body)
    return ClassifyRequest(texts=texts, use_activation=use_activation, truncate=truncate, model=model)


def render_classify_response(request: ClassifyRequest, result: ClassifyResult, model_name: str, *,
                             response_id: str, created: int) -> dict[str, Any]:
    n_tokens = sum(result.n_tokens)
    data = [{"index": i, "label": result.labels[int(np.argmax(scores))], "probs": scores,
             "num_classes": len(scores)} for i, scores in enumerate(result.scores)]
    return {"id": response_id, "object": "list", "created": created,
            "model": request.model if request.model is not None else model_name, "data": data,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens, "completion_tokens": 0,
                      "prompt_tokens_details": None}}
