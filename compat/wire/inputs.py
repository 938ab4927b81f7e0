"""llama-server's input forms (contract §3.2) -> prompts. Pure: no falcon, no engine.

A prompt is a list of parts: a str is text to tokenize, an int is a raw token id. The engine applies llama's
mixed-prompt rule (only a leading str part gets special tokens) and validates token ids.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Union

import orjson

from compat.errors import bad_request

Prompt = list[Union[str, int]]

EMPTY_PROMPT = '"prompt" must not be empty'
BAD_ELEMENTS = ('"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt string, '
                'or a list of mixed strings & tokens.')
MULTIMODAL = "Multimodal data provided, but model does not support multimodal requests."


MAX_JSON_DEPTH = 32  # our deepest request is 4 levels ({"input": [{"prompt_string": ...}]}); clients' extras fit
TOO_DEEP = f"The request body nests JSON arrays and objects more than {MAX_JSON_DEPTH} levels deep"


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object; the parser's own message on failure (llama: 500, here 400, §13).

    The body's size is bounded before this (--payload-limit); its nesting is bounded here."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(str(exc)) from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    if json_depth(body) > MAX_JSON_DEPTH:
        raise bad_request(TOO_DEEP)
    return body


def json_depth(value: Any) -> int:
    """Levels of arrays/objects (a scalar is 0), walked level by level without recursion; it stops once past
    the bound, so a deep body costs no more than a shallow one."""
    depth = 0
    level = [value] if isinstance(value, (list, dict)) else []
    while level and depth <= MAX_JSON_DEPTH:
        depth += 1
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, (list, dict))]
    return depth


def is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true/false are not token ids


def parse_mixed_prompt(value: Any) -> Prompt:
    """A string, or a list of strings and token ids, as ONE prompt (llama's tokenize_mixed)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(part, str) or is_token(part) for part in value):
        return list(value)
    raise bad_request(BAD_ELEMENTS)


def _object_prompt(value: dict[str, Any]) -> Prompt:
    if value.get("multimodal_data"):
        raise bad_request(MULTIMODAL)
    text = value.get("prompt_string")
    if not isinstance(text, str):
        raise bad_request(BAD_ELEMENTS)
    return [text]


def _subprompt(value: Any) -> Prompt:
    return _object_prompt(value) if isinstance(value, dict) else parse_mixed_prompt(value)


def parse_input_prompts(value: Any) -> list[Prompt]:
    """`input`/`content` -> prompts: a top-level list holding any token id is ONE mixed prompt, any other
    list gives one prompt per element."""
    if isinstance(value, list):
        if not value:
            raise bad_request(EMPTY_PROMPT)
        if any(is_token(part) for part in value):
            return [parse_mixed_prompt(value)]
        return [_subprompt(element) for element in value]
    if isinstance(value, (str, dict)):
        return [_subprompt(value)]
    raise bad_request(BAD_ELEMENTS)


def lazy_json_object(read: Callable[[], bytes]) -> Callable[[], dict[str, Any]]:
    """parse_json_object(read()) on the first call, the same object after: a route may need the body's `model`
    to find its engine before it reads the rest, or (llama's order) check something before parsing at all."""
    return functools.cache(lambda: parse_json_object(read()))


def parse_model_field(body: dict[str, Any]) -> str | None:
    """The `model` that routes a request on a several-model server: absent, null or "" pick the route's default."""
    model = body.get("model")
    if model is None or model == "":
        return None
    if not isinstance(model, str):
        raise bad_request('"model" must be a string naming a served model')
    return model
