"""compat.wire.inputs: llama's input forms, without HTTP."""
from __future__ import annotations

import pytest

from compat.errors import ApiError
from compat.wire.inputs import BAD_ELEMENTS, EMPTY_PROMPT, MULTIMODAL, parse_input_prompts, parse_json_object


@pytest.mark.parametrize("value,prompts", [
    ("s", [["s"]]),
    ("", [[""]]),
    ([12, 34, 56], [[12, 34, 56]]),
    ([12, 34, "s", 56, 78], [[12, 34, "s", 56, 78]]),
    (["a", 1, "b"], [["a", 1, "b"]]),
    (["s1", "s2"], [["s1"], ["s2"]]),
    (["s1", [12, 34]], [["s1"], [12, 34]]),
    ([[12, 34], [56]], [[12, 34], [56]]),
    ([[12, "s", 34], [1, 2]], [[12, "s", 34], [1, 2]]),
    ([[]], [[]]),  # the engine answers "Input content cannot be empty"
    ({"prompt_string": "p"}, [["p"]]),
    ([{"prompt_string": "p", "multimodal_data": []}, "q"], [["p"], ["q"]]),
])
def test_prompt_splits(value, prompts):
    assert parse_input_prompts(value) == prompts


@pytest.mark.parametrize("value,message", [
    ([], EMPTY_PROMPT), (None, BAD_ELEMENTS), (3, BAD_ELEMENTS), (2.5, BAD_ELEMENTS), (False, BAD_ELEMENTS),
    ([1, 2.5], BAD_ELEMENTS), ([1, True], BAD_ELEMENTS), ([None, "a"], BAD_ELEMENTS), ([[1, [2]]], BAD_ELEMENTS),
    ([{"prompt_string": ["x"]}], BAD_ELEMENTS), ({"prompt_string": "x", "multimodal_data": ["AA=="]}, MULTIMODAL),
])
def test_rejected_inputs_are_400(value, message):
    with pytest.raises(ApiError) as caught:
        parse_input_prompts(value)
    assert (caught.value.status, caught.value.type, caught.value.message) == (400, "invalid_request_error", message)


def test_json_object_body():
    assert parse_json_object(b'{"b":1,"a":[1,2]}') == {"b": 1, "a": [1, 2]}
    for raw in (b"", b"[1]", b'"s"', b"{", b"\xff"):
        with pytest.raises(ApiError) as caught:
            parse_json_object(raw)
        assert caught.value.status == 400
