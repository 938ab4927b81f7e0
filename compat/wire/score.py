"""vLLM's /score and /v1/score bodies (vllm/entrypoints/pooling/scoring/protocol.py). Pure: no falcon.

Request: `text_1` + `text_2`, or `queries` + `documents`; each a string or a non-empty list of strings, paired
1:1, 1:N (the one first text against every second text) or N:N (element by element), else 400. `use_activation`
(unset or true: sigmoid of a one-label cross-encoder's logit, vLLM's default; false: the raw logit /rerank
returns); `truncate_prompt_tokens` -1 cuts every pair to the model's length (unset: the server's --truncate),
a positive count is refused by name. Answer {"id","object":"list","created","model","data":[{"index",
"object":"score","score"}],"usage"} in pair order. Errors: our OpenAI-style {"error": {...}} envelope.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compat.errors import bad_request

BAD_TEXTS = '"{key}" must be a string or a non-empty list of strings'
NO_TEXTS = 'send "text_1" and "text_2", or "queries" and "documents"'
BAD_LENGTHS = "Input lengths must be either 1:1, 1:N or N:N"
BAD_ACTIVATION = '"use_activation" must be a boolean'
BAD_TRUNCATE = ('"truncate_prompt_tokens" must be -1 (cut each pair to the model\'s length); a positive count is '
                'not supported: long pairs are cut to the model\'s length or refused')


@dataclass(frozen=True)
class ScoreRequest:
    pairs: list[tuple[str, str]]  # in answer order
    use_activation: bool  # sigmoid of a cross-encoder's logit (vLLM's default)
    truncate: bool | None  # None: the server's --truncate
    model: str | None


def _texts(body: dict[str, Any], key: str) -> list[str]:
    value = body.get(key)
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value or not all(isinstance(t, str) for t in value):
        raise bad_request(BAD_TEXTS.format(key=key))
    return value


def parse_score_request(body: dict[str, Any]) -> ScoreRequest:
    if body.get("text_1") is not None or body.get("text_2") is not None:
        first, second = _texts(body, "text_1"), _texts(body, "text_2")
    elif body.get("queries") is not None or body.get("documents") is not None:
        first, second = _texts(body, "queries"), _texts(body, "documents")
    else:
        raise bad_request(NO_TEXTS)
    if len(first) > 1 and len(first) != len(second):
        raise bad_request(BAD_LENGTHS)
    pairs = list(zip(first * len(second) if len(first) == 1 else first, second, strict=True))

    use_activation, truncate, model = parse_pooling_fields(body)
    return ScoreRequest(pairs=pairs, use_activation=use_activation, truncate=truncate, model=model)


def parse_pooling_fields(body: dict[str, Any]) -> tuple[bool, bool | None, str | None]:
    """The fields vLLM's pooling requests share (/score, /classify): whether to apply the model's activation
    (`use_activation`, or its older spelling `activation`; unset: yes), the truncation (`truncate_prompt_tokens`
    -1: cut to the model's length; unset: None, the server's --truncate) and the `model` it names."""
    use_activation = body.get("use_activation", body.get("activation"))
    if use_activation is not None and not isinstance(use_activation, bool):
        raise bad_request(BAD_ACTIVATION)
    truncate_tokens = body.get("truncate_prompt_tokens")
    if truncate_tokens is not None and (isinstance(truncate_tokens, bool) or truncate_tokens != -1):
        raise bad_request(BAD_TRUNCATE)
    model = body.get("model")
    return use_activation is not False, None if truncate_tokens is None else True, \
        model if isinstance(model, str) else None


def render_score_response(request: ScoreRequest, scores: list[float], n_tokens: int, model_name: str, *,
                          response_id: str, created: int) -> dict[str, Any]:
    return {"id": response_id, "object": "list", "created": created,
            "model": request.model if request.model is not None else model_name,
            "data": [{"index": i, "object": "score", "score": score} for i, score in enumerate(scores)],
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}
