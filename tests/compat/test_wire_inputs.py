"""compat.wire.inputs: llama's input forms, without HTTP."""
from __future__ import annotations

import pytest

from compat.errors import ApiError
from compat.wire.inputs import (
    BAD_ELEMENTS,
    EMPTY_PROMPT,
    MULTIMODAL,
    MediaRef,
    parse_input_prompts,
    parse_json_object,
)


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
    # images: llama's media markers, one per multimodal_data entry, in order
    ({"prompt_string": "<__media__>", "multimodal_data": ["AA=="]}, [[MediaRef("AA==")]]),
    ({"prompt_string": "a <__media__> b <__media__>", "multimodal_data": ["x", "y"]},
     [["a ", MediaRef("x"), " b ", MediaRef("y")]]),
    # OpenAI content parts: each element one input; a list of parts is one input
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}, {"type": "text", "text": "t"}],
     [[MediaRef("data:image/png;base64,AA==")], ["t"]]),
    ({"type": "image_url", "image_url": "file://a.png"}, [[MediaRef("file://a.png")]]),
    ([[{"type": "text", "text": "t"}, {"type": "image_url", "image_url": {"url": "u"}}]], [["t", MediaRef("u")]]),
])
def test_prompt_splits(value, prompts):
    assert parse_input_prompts(value, takes_images=True) == prompts


@pytest.mark.parametrize("value,message", [
    ([], EMPTY_PROMPT), (None, BAD_ELEMENTS), (3, BAD_ELEMENTS), (2.5, BAD_ELEMENTS), (False, BAD_ELEMENTS),
    ([1, 2.5], BAD_ELEMENTS), ([1, True], BAD_ELEMENTS), ([None, "a"], BAD_ELEMENTS), ([[1, [2]]], BAD_ELEMENTS),
    ([{"prompt_string": ["x"]}], BAD_ELEMENTS),
    ({"prompt_string": "x", "multimodal_data": ["AA=="]},
     '"prompt_string" has 0 media markers (<__media__>) for 1 "multimodal_data" images; there must be one marker '
     'per image'),
    ({"prompt_string": "<__media__>", "multimodal_data": [1]}, '"multimodal_data" must be a list of base64-encoded images'),
    ({"type": "input_audio"}, "content part type 'input_audio' is not supported (supported: text, image_url)"),
    ({"type": "image_url", "image_url": {}}, 'an "image_url" content part needs "image_url": {"url": "<data:, '
                                             'file://, http(s):// URL or base64>"}'),
])
def test_rejected_inputs_are_400(value, message):
    with pytest.raises(ApiError) as caught:
        parse_input_prompts(value, takes_images=True)
    assert (caught.value.status, caught.value.type, caught.value.message) == (400, "invalid_request_error", message)


@pytest.mark.parametrize("value", [
    {"prompt_string": "x", "multimodal_data": ["AA=="]},  # llama's check comes before the marker count
    [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}],
])
def test_images_for_a_text_only_model_are_llamas_multimodal_error(value):
    with pytest.raises(ApiError) as caught:
        parse_input_prompts(value)
    assert (caught.value.status, caught.value.message) == (400, MULTIMODAL)


def test_json_object_body():
    assert parse_json_object(b'{"b":1,"a":[1,2]}') == {"b": 1, "a": [1, 2]}
    for raw in (b"", b"[1]", b'"s"', b"{", b"\xff"):
        with pytest.raises(ApiError) as caught:
            parse_json_object(raw)
        assert caught.value.status == 400
