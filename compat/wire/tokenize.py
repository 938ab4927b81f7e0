"""/tokenize and /detokenize bodies (docs/llama-server-contract.md §5). Pure: no falcon."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compat.errors import bad_request
from compat.wire.inputs import Prompt, is_token, parse_mixed_prompt, whole


@dataclass(frozen=True)
class TokenizeRequest:
    parts: Prompt  # empty when `content` is missing: llama answers {"tokens":[]}
    add_special: bool
    parse_special: bool
    with_pieces: bool


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    # llama reads these with json_value(): null or a non-boolean silently falls back to the default
    value = body.get(key)
    return value if isinstance(value, bool) else default


def parse_tokenize_request(body: dict[str, Any]) -> TokenizeRequest:
    return TokenizeRequest(parts=parse_mixed_prompt(body["content"]) if "content" in body else [],
                           add_special=_flag(body, "add_special", False),
                           parse_special=_flag(body, "parse_special", True),
                           with_pieces=_flag(body, "with_pieces", False))


def render_tokenize_response(ids: Sequence[int], pieces: Sequence[str | list[int]] | None) -> dict[str, Any]:
    """`pieces` is None unless with_pieces was asked; a piece that is not valid UTF-8 is a list of byte ints."""
    if pieces is None:
        return {"tokens": list(ids)}
    return {"tokens": [{"id": token, "piece": piece} for token, piece in zip(ids, pieces)]}


def parse_detokenize_request(body: dict[str, Any]) -> list[int]:
    tokens = body.get("tokens", [])
    if not isinstance(tokens, list) or not all(is_token(t) for t in tokens):
        raise bad_request('"tokens" must be a list of token ids')
    return [whole(t) for t in tokens]


def render_detokenize_response(text: str) -> dict[str, Any]:
    return {"content": text}
