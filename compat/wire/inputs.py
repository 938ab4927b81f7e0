"""llama-server's input forms (docs/llama-server-contract.md §3.2) and OpenAI content parts -> prompts. Pure: no falcon, no engine.

A prompt is a list of parts: a str is text to tokenize, an int is a raw token id, a MediaRef is an image
(fetched and checked by the resource, decoded by the engine). The engine applies llama's mixed-prompt rule
(only a leading str part gets special tokens) and validates token ids.

Images come in two spellings: llama's `{"prompt_string": "... <__media__> ...", "multimodal_data": [base64]}`
(one marker per image, in order) and OpenAI's content parts `{"type": "image_url", "image_url": {"url": ...}}`
/ `{"type": "text", "text": ...}`; a list of content parts inside the input list is one input made of them.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

import orjson

from compat.errors import bad_request


@dataclass(frozen=True)
class MediaRef:
    """An image as the request names it: a data: URL, a file:// or http(s):// URL, or bare base64."""

    source: str


Prompt = list[Union[str, int, MediaRef]]

# llama's default media marker (mtmd_default_marker); /props reports it as media_marker
MEDIA_MARKER = "<__media__>"
CONTENT_PART_TYPES = ("text", "image_url")

EMPTY_PROMPT = '"prompt" must not be empty'
BAD_ELEMENTS = ('"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt string, '
                'or a list of mixed strings & tokens.')
MULTIMODAL = "Multimodal data provided, but model does not support multimodal requests."


MAX_JSON_DEPTH = 32  # our deepest request is 5 levels ({"input": [[{"image_url": {...}}]]}); clients' extras fit
TOO_DEEP = f"The request body nests JSON arrays and objects more than {MAX_JSON_DEPTH} levels deep"


def _orjson_depth_limit(cap: int = 1 << 16) -> int:
    """The deepest nesting orjson parses (1024 in orjson 3.x), found by bisection once at import."""
    def parses(depth: int) -> bool:
        try:
            orjson.loads(b"[" * depth + b"]" * depth)
        except orjson.JSONDecodeError:
            return False
        return True

    low, high = 1, cap  # parses(low) holds; parses(high) must not
    if parses(high):
        raise RuntimeError(f"orjson parses {cap} levels of nesting: compat/wire/inputs.py counts on its depth limit "
                           f"to bound requests at {MAX_JSON_DEPTH}")
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if parses(middle) else (low, middle)
    return low


# The body is parsed inside this many one-element arrays, so orjson's own depth limit stops exactly the bodies
# that nest more than MAX_JSON_DEPTH levels, at the cost of copying the body once (no walk, no scan).
_WRAP = _orjson_depth_limit() - MAX_JSON_DEPTH
_OPEN, _CLOSE = b"[" * _WRAP, b"]" * _WRAP
# Bodies up to this size have their brackets counted first (~1 µs per KiB), so one with too few to nest past
# MAX_JSON_DEPTH skips the wrapped parse; counting a larger one would cost more than the wrapping it could save.
_COUNTED_BYTES = 64 << 10


def _unwrapped(wrapped: Any) -> tuple[bool, Any]:
    """(True, the body) when `wrapped` is the chain of _WRAP one-element arrays around it; a body that is not
    JSON alone can still parse once wrapped (`1, 2` or `] [`), and then the chain is broken."""
    value = wrapped
    for _ in range(_WRAP):
        if type(value) is not list or len(value) != 1:
            return False, None
        value = value[0]
    return True, value


def _parsed_alone(text: bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise bad_request(str(exc)) from None


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object; the parser's own message on failure (llama: 500, here 400, §13).

    The body's size is bounded before this (--payload-limit); its nesting is bounded here, by orjson: the body
    is parsed wrapped in _WRAP arrays, which leaves it MAX_JSON_DEPTH levels below orjson's limit, unless it is
    small and holds too few brackets to nest that deep (then it is parsed alone). Anything
    unusual (a parse error, a broken chain) is parsed again alone, so the answer is what parsing the body alone
    says: its own error, "not an object", or too deep."""
    text = raw.encode() if isinstance(raw, str) else raw
    if len(text) <= _COUNTED_BYTES and text.count(b"[") + text.count(b"{") <= MAX_JSON_DEPTH:
        # Each level of nesting opens with its own bracket, so this body cannot be too deep: parsed alone (a
        # short request's body; the wrapped parse below costs ~1 ms, its thousand arrays built and walked).
        whole, body = True, _parsed_alone(text)
    else:
        try:
            whole, body = _unwrapped(orjson.loads(_OPEN + text + _CLOSE))
        except orjson.JSONDecodeError:
            whole, body = False, None
    if not whole:
        body = _parsed_alone(text)
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    if not whole:  # valid alone, refused wrapped: deeper than MAX_JSON_DEPTH
        raise bad_request(TOO_DEEP)
    return body


def whole(value: Any) -> Any:
    """A JSON number without a fraction (2.0, 2e3) as the integer it is, as JSON Schema's "integer" (and so the
    OpenAPI document) reads it, and as llama's nlohmann reads 2.0 where it wants an int; anything else as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def is_token(value: Any) -> bool:
    """An integer (a whole float too: see `whole`); JSON true/false are not token ids."""
    value = whole(value)
    return isinstance(value, int) and not isinstance(value, bool)


def parse_mixed_prompt(value: Any) -> Prompt:
    """A string, or a list of strings and token ids, as ONE prompt (llama's tokenize_mixed)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        parts = [whole(part) for part in value]
        if all(isinstance(part, str) or (isinstance(part, int) and not isinstance(part, bool)) for part in parts):
            return parts
    raise bad_request(BAD_ELEMENTS)


def _multimodal_prompt(value: dict[str, Any], takes_images: bool) -> Prompt:
    """llama's object: its text, with one image per media marker, in order."""
    text = value.get("prompt_string")
    if not isinstance(text, str):
        raise bad_request(BAD_ELEMENTS)
    media = value.get("multimodal_data")
    if not media:
        return [text]
    if not takes_images:
        raise bad_request(MULTIMODAL)
    if not isinstance(media, list) or not all(isinstance(item, str) for item in media):
        raise bad_request('"multimodal_data" must be a list of base64-encoded images')
    pieces = text.split(MEDIA_MARKER)
    if len(pieces) - 1 != len(media):
        raise bad_request(f'"prompt_string" has {len(pieces) - 1} media markers ({MEDIA_MARKER}) for '
                          f'{len(media)} "multimodal_data" images; there must be one marker per image')
    parts: Prompt = [pieces[0]] if pieces[0] else []
    for source, piece in zip(media, pieces[1:]):
        parts.append(MediaRef(source))
        if piece:
            parts.append(piece)
    return parts


def _content_part(value: dict[str, Any], takes_images: bool) -> str | MediaRef:
    """One OpenAI content part: {"type": "text", "text"} or {"type": "image_url", "image_url": {"url"}}."""
    kind = value.get("type")
    if kind == "text":
        if not isinstance(value.get("text"), str):
            raise bad_request('a "text" content part needs a string "text"')
        return value["text"]
    if kind == "image_url":
        if not takes_images:
            raise bad_request(MULTIMODAL)
        image = value.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str) or not url:
            raise bad_request('an "image_url" content part needs "image_url": {"url": "<data:, file://, http(s):// '
                              'URL or base64>"}')
        return MediaRef(url)
    raise bad_request(f"content part type {kind!r} is not supported (supported: {', '.join(CONTENT_PART_TYPES)})")


def _is_content_part(value: Any) -> bool:
    return isinstance(value, dict) and "type" in value and "prompt_string" not in value


def _object_prompt(value: dict[str, Any], takes_images: bool) -> Prompt:
    if _is_content_part(value):
        return [_content_part(value, takes_images)]
    return _multimodal_prompt(value, takes_images)


def _content_parts(value: Any, takes_images: bool) -> Prompt | None:
    """A non-empty list of content parts: one input made of them; None for any other value."""
    if isinstance(value, list) and value and all(_is_content_part(part) for part in value):
        return [_content_part(part, takes_images) for part in value]
    return None


def _subprompt(value: Any, takes_images: bool) -> Prompt:
    if isinstance(value, dict):
        return _object_prompt(value, takes_images)
    parts = _content_parts(value, takes_images)
    return parse_mixed_prompt(value) if parts is None else parts


def parse_media_item(value: Any) -> Prompt | None:
    """A content part, a list of content parts or llama's multimodal object as ONE prompt of text and images
    (whatever the model takes: the caller checks); None when `value` is none of those forms."""
    if isinstance(value, dict) and (_is_content_part(value) or "prompt_string" in value):
        return _object_prompt(value, True)
    return _content_parts(value, True)


def has_media(prompt: Prompt) -> bool:
    return any(isinstance(part, MediaRef) for part in prompt)


def parse_input_prompts(value: Any, takes_images: bool = False) -> list[Prompt]:
    """`input`/`content` -> prompts: a top-level list holding any token id is ONE mixed prompt, any other
    list gives one prompt per element. An image for a model that takes none is llama's MULTIMODAL error."""
    if isinstance(value, list):
        if not value:
            raise bad_request(EMPTY_PROMPT)
        if any(is_token(part) for part in value):
            return [parse_mixed_prompt(value)]
        return [_subprompt(element, takes_images) for element in value]
    if isinstance(value, (str, dict)):
        return [_subprompt(value, takes_images)]
    raise bad_request(BAD_ELEMENTS)


BAD_LATE_CHUNKING = '"late_chunking" must be a boolean'
BAD_TRUNCATION_DIRECTION = '"truncation_direction" must be "right" or "left" (or "Right", "Left")'
TRUNCATION_DIRECTIONS = ("right", "left", "Right", "Left")  # TEI's spellings and the lower-case ones


def parse_late_chunking(body: dict[str, Any]) -> bool:
    """Jina's `late_chunking` (absent or null: off), read the same on every embedding route."""
    value = body.get("late_chunking")
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(BAD_LATE_CHUNKING)
    return value


BAD_TASK = '"task" must be a string naming one of the model\'s task adapters'


def parse_task(body: dict[str, Any]) -> str | None:
    """`task` (ours, on every embedding route): the task adapter of a model that has them (jina-embeddings-v3's
    retrieval.query, retrieval.passage, separation, classification, text-matching); the engine refuses a task
    the model lacks, naming its tasks (engine/text/prompts.py choose_task). Absent or null: `prompt_name` when it
    names a task, else the model's default task."""
    value = body.get("task")
    if value is not None and not isinstance(value, str):
        raise bad_request(BAD_TASK)
    return value


def parse_truncation_direction(body: dict[str, Any]) -> str:
    """TEI's `truncation_direction` on the routes whose own servers have none: "right" (default) or "left"."""
    value = body.get("truncation_direction")
    if value is None:
        return "right"
    if value not in TRUNCATION_DIRECTIONS:
        raise bad_request(BAD_TRUNCATION_DIRECTION)
    return value.lower()


def chunk_texts(prompts: list[Prompt]) -> list[str]:
    """A late-chunked request's inputs as its chunks: each one a text (token ids and images are not pieces of a
    document's text)."""
    for i, prompt in enumerate(prompts):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise bad_request(f"late_chunking takes texts only: input {i} is not a text (token ids and images "
                              f"cannot be chunks of one document's text)")
    return [prompt[0] for prompt in prompts]


def count_prompts(value: Any) -> int:
    """How many prompts parse_input_prompts(value) gives, read off the raw value without parsing any (so a
    request over the count limits is refused before its inputs are read): a list's length, one for a list
    holding a token id (one mixed prompt) and for anything else (one prompt, or an error later)."""
    if isinstance(value, list) and not any(is_token(part) for part in value):
        return len(value)
    return 1


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
