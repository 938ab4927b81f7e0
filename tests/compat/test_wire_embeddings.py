"""compat.wire.embeddings: request parsing and both response shapes, without HTTP."""
from __future__ import annotations

import base64
import struct

import numpy as np
import orjson
import pytest

from compat.errors import ApiError
from compat.wire.embeddings import parse_embeddings_request, render_embeddings_response
from engine.types import EmbedResult


def parse(body, oai_route=True, default_normalize=2, width=384):
    return parse_embeddings_request(body, oai_route=oai_route, default_normalize=default_normalize, width=width)


def test_parse_defaults():
    request = parse({"input": ["a", "b"]}, default_normalize=-1)
    assert request.prompts == [["a"], ["b"]]
    assert (request.oai, request.encoding_format, request.embd_normalize) == (True, "float", -1)
    assert (request.truncate, request.model) == (None, None)


def test_content_forces_llama_shape_and_input_wins():
    assert parse({"content": "a"}).oai is False
    assert parse({"input": "a", "content": "b"}).prompts == [["a"]]
    assert parse({"input": "a"}, oai_route=False).oai is False


def test_checks_run_in_llama_order():
    # input shape is checked before encoding_format, which is checked before embd_normalize
    with pytest.raises(ApiError, match="must not be empty"):
        parse({"input": [], "encoding_format": "x", "embd_normalize": "x"})
    with pytest.raises(ApiError, match="float or base64"):
        parse({"input": "a", "encoding_format": "x", "embd_normalize": "x"})


def test_render_llama_shape_pooled_and_per_token():
    # the engine's finished vectors (L2-normalized [3, 4]; per-token rows as they are)
    result = EmbedResult(vectors=[np.array([0.6, 0.8], np.float32), np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)],
                         n_tokens=[1, 2])
    body = render_embeddings_response(parse({"content": "a"}), result, "m")
    assert orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY) == (
        b'[{"index":0,"embedding":[[0.6000000238418579,0.800000011920929]]},'
        b'{"index":1,"embedding":[[1.0,2.0],[3.0,4.0]]}]')


def test_render_oai_base64_is_little_endian_float32_with_padding():
    result = EmbedResult(vectors=[np.array([0.6, 0.8], np.float32)], n_tokens=[5])
    body = render_embeddings_response(parse({"input": "a", "encoding_format": "base64", "model": "q"}), result, "m")
    item = body["data"][0]
    assert item["embedding"] == base64.b64encode(struct.pack("<2f", 0.6, 0.8)).decode()
    assert item["embedding"].endswith("=")  # 8 bytes -> 12 chars, one of them padding
    assert body["model"] == "q"
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
