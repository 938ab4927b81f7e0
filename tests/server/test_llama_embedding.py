"""llama.cpp's own embedding tests (tools/server/tests/unit/test_embedding.py), against our server.

Same requests and assertions as the contract's §8.2, with the bundled all-MiniLM-L6-v2 in place of
bge-small and the same preset flags (--ctx-size 512 --batch-size 128 --ubatch-size 128 --parallel 2); each
server runs twice: on the safetensors folder and on the same model as llama.cpp's F16 GGUF (as llama's
tests run on a GGUF).
"""
from __future__ import annotations

import base64
import struct

import numpy as np
import pytest
from openai import OpenAI

from tests.conftest import gguf_fixture
from tests.server.harness import ServerProcess

EPSILON = 1e-3
PRESET = ("--ctx-size", "512", "--batch-size", "128", "--ubatch-size", "128", "--parallel", "2",
          "--seed", "42", "--temp", "0.8", "--no-slots", "--no-jinja", "--offline", "--embedding")


# the model each server runs: the bundled folder (no -m), or llama.cpp's conversion of it
MODELS = {"safetensors": (), "gguf": ("-m", str(gguf_fixture("minilm-f16.gguf")))}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_format(request) -> str:
    return request.param


def _server(model_format: str, *extra: str) -> ServerProcess:
    return ServerProcess(*PRESET, *MODELS[model_format], *extra)


@pytest.fixture(scope="module")
def last_server(model_format):
    with _server(model_format, "--pooling", "last") as server:
        server.model_format = model_format
        yield server


@pytest.fixture(scope="module")
def default_server(model_format):
    with _server(model_format) as server:
        yield server


@pytest.fixture(scope="module")
def none_server(model_format):
    with _server(model_format, "--pooling", "none") as server:
        yield server


def _sum_sq(vec) -> float:
    return float(np.sum(np.square(np.asarray(vec, dtype=np.float64))))


def _last_token_reference(text: str) -> np.ndarray:
    """transformers' last hidden state of the last token ([SEP]), L2-normalized: what --pooling last means."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from engine import default_model

    tokenizer, model = AutoTokenizer.from_pretrained(default_model()), AutoModel.from_pretrained(default_model())
    with torch.inference_mode():
        hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0, -1].numpy()
    return hidden / np.linalg.norm(hidden)


def test_embedding_single(last_server):
    res = last_server.post("/v1/embeddings", {"input": "I believe the meaning of life is"})
    assert res.status_code == 200
    data = res.json()["data"]
    assert len(data) == 1 and len(data[0]["embedding"]) == 384
    assert abs(_sum_sq(data[0]["embedding"]) - 1) < EPSILON
    # beyond llama's checks: the vector really is the last token's (not the model's default mean pooling);
    # the GGUF holds the weights rounded to float16
    np.testing.assert_allclose(data[0]["embedding"], _last_token_reference("I believe the meaning of life is"),
                               atol=1e-5 if last_server.model_format == "safetensors" else 1e-3)


def test_embedding_multiple(last_server):
    texts = ["I believe the meaning of life is", "Write a joke about AI from a very long prompt which will not be truncated",
             "This is a test", "This is another test"]
    res = last_server.post("/v1/embeddings", {"input": texts})
    assert res.status_code == 200
    assert [d["index"] for d in res.json()["data"]] == [0, 1, 2, 3]
    assert all(len(d["embedding"]) == 384 for d in res.json()["data"])


@pytest.mark.parametrize("content,is_multi", [
    ("", False), ("string", False), ([12, 34, 56], False), ([12, 34, "string", 56, 78], False),
    (["string1", "string2"], True), (["string1", [12, 34, 56]], True), ([[12, 34, 56], [12, 34, 56]], True),
    ([[12, 34, 56], [12, "string", 34, 56]], True),
])
def test_embedding_mixed_input(default_server, content, is_multi):
    res = default_server.post("/v1/embeddings", {"input": content})
    assert res.status_code == 200, res.text
    data = res.json()["data"]
    assert len(data) == (len(content) if is_multi else 1)
    assert all(len(d["embedding"]) > 1 for d in data)


def test_embedding_pooling_none(none_server):
    res = none_server.post("/embeddings", {"input": "hello hello hello"})
    assert res.status_code == 200
    rows = res.json()[0]["embedding"]
    assert len(rows) == 5  # [CLS] hello hello hello [SEP]
    assert all(abs(_sum_sq(row) - 1) > EPSILON for row in rows)


def test_embedding_pooling_none_oai(none_server):
    res = none_server.post("/v1/embeddings", {"input": "hello hello hello"})
    assert res.status_code == 400
    assert res.json()["error"]["message"] == \
        "Pooling type 'none' is not OAI compatible. Please use a different pooling type"


def test_embedding_openai_library_single(last_server):
    client = OpenAI(api_key="dummy", base_url=f"{last_server.base}/v1")
    res = client.embeddings.create(model="text-embedding-3-small", input="I believe the meaning of life is")
    assert len(res.data) == 1 and len(res.data[0].embedding) == 384
    assert res.model == "text-embedding-3-small"


def test_embedding_openai_library_multiple(last_server):
    client = OpenAI(api_key="dummy", base_url=f"{last_server.base}/v1")
    texts = ["I believe the meaning of life is", "Write a joke about AI", "This is a test", "This is another test"]
    res = client.embeddings.create(model="text-embedding-3-small", input=texts)
    assert len(res.data) == 4
    # The SDK's default is base64: its decoded vectors must equal the float route's. The two requests may be
    # batched differently (on a busy machine the lanes split them), which moves float32 sums by ~2e-7; a wrong
    # decoding (byte order, dtype, offset) moves them by far more.
    floats = last_server.post("/v1/embeddings", {"input": texts}).json()["data"]
    for got, want in zip(res.data, floats, strict=True):
        np.testing.assert_allclose(got.embedding, want["embedding"], atol=1e-6)


def test_embedding_error_prompt_too_long(last_server):
    res = last_server.post("/v1/embeddings", {"input": "This is a test " * 512})
    assert res.status_code != 200
    message = res.json()["error"]["message"]
    assert "too large" in message
    assert message == ("input (2050 tokens) is too large to process. increase the physical batch size "
                       "(current batch size: 128)")


def test_same_prompt_give_same_result(last_server):
    res = last_server.post("/v1/embeddings", {"input": ["I believe the meaning of life is"] * 5})
    data = res.json()["data"]
    assert len(data) == 5
    for item in data[1:]:
        np.testing.assert_allclose(item["embedding"], data[0]["embedding"], atol=EPSILON)


@pytest.mark.parametrize("content,n_tokens", [("I believe the meaning of life is", 9), ("This is a test", 6)])
def test_embedding_usage_single(default_server, content, n_tokens):
    usage = default_server.post("/v1/embeddings", {"input": content}).json()["usage"]
    assert usage == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}


def test_embedding_usage_multiple(default_server):
    usage = default_server.post("/v1/embeddings", {"input": ["I believe the meaning of life is"] * 2}).json()["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] == 18


def test_embedding_openai_library_base64(default_server):
    text = "I believe the meaning of life is"
    floats = default_server.post("/v1/embeddings", {"input": text}).json()["data"][0]["embedding"]
    res = default_server.post("/v1/embeddings", {"input": text, "encoding_format": "base64"})
    assert res.status_code == 200
    item = res.json()["data"][0]
    assert isinstance(item["embedding"], str) and item["encoding_format"] == "base64"
    raw = base64.b64decode(item["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert len(decoded) == len(floats)
    np.testing.assert_array_equal(np.float32(decoded), np.float32(floats))  # exact: both are the same float32 values
