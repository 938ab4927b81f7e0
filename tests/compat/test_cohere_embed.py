"""Cohere's /v1/embed and /v2/embed over the fake engine: the two answer shapes, every embedding type against
the float vectors of /v1/embeddings, input_type -> the checkpoint's prompts, the refusals in Cohere's shape; and
our /v1/embeddings' opt-in compact encoding formats."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from compat.wire.cohere_embed import prompt_for_input_type
from engine import dequantize, quantize
from tests.compat.fakes import FakeEngine

TEXTS = ["the cat sits", "a dog runs far away", "x"]
TYPES = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
PROMPTS = (("query", "query: "), ("passage", "passage: "), ("clustering", "cluster: "))


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(prompts=PROMPTS)


@pytest.fixture
def client(make_client, engine):
    return make_client("--embedding", engine=engine)


def oai_floats(client, texts, **extra) -> np.ndarray:
    res = client.simulate_post("/v1/embeddings", json={"input": texts, **extra})
    assert res.status_code == 200, res.text
    return np.asarray([item["embedding"] for item in res.json["data"]], dtype=np.float32)


def test_v1_legacy_answer_is_a_float_list(client):
    res = client.simulate_post("/v1/embed", json={"texts": TEXTS, "model": "embed-english-v3.0"})
    assert res.status_code == 200, res.text
    body = res.json
    assert list(body) == ["id", "texts", "embeddings", "meta", "response_type"]
    assert body["response_type"] == "embeddings_floats" and body["texts"] == TEXTS and body["id"]
    assert np.array_equal(np.asarray(body["embeddings"], dtype=np.float32), oai_floats(client, TEXTS))
    n_tokens = client.simulate_post("/v1/embeddings", json={"input": TEXTS}).json["usage"]["prompt_tokens"]
    assert body["meta"] == {"api_version": {"version": "1"}, "billed_units": {"input_tokens": n_tokens}}


@pytest.mark.parametrize("version", [1, 2])
def test_every_embedding_type_is_the_float_vector_or_its_codes(client, version):
    res = client.simulate_post(f"/v{version}/embed", json={"texts": TEXTS, "embedding_types": TYPES})
    assert res.status_code == 200, res.text
    body = res.json
    assert body.get("response_type") == ("embeddings_by_type" if version == 1 else None)
    assert body["meta"]["api_version"] == {"version": str(version)}
    by_type = body["embeddings"]
    assert list(by_type) == TYPES
    floats = oai_floats(client, TEXTS)
    assert np.array_equal(np.asarray(by_type["float"], dtype=np.float32), floats)
    decoded = np.stack([np.frombuffer(base64.b64decode(s), dtype="<f4") for s in by_type["base64"]])
    assert np.array_equal(decoded, floats)
    for kind in ("int8", "uint8", "binary", "ubinary"):
        assert np.array_equal(np.asarray(by_type[kind]), quantize(floats, kind))
    for kind in ("int8", "uint8"):
        back = dequantize(np.asarray(by_type[kind]), kind)
        assert np.all(np.sum(back * floats, axis=1) / np.linalg.norm(back, axis=1) > 0.999)


def test_v2_without_types_answers_float_by_type(client):
    body = client.simulate_post("/v2/embed", json={"texts": TEXTS, "input_type": "search_document"}).json
    assert list(body) == ["id", "texts", "embeddings", "meta"]
    assert list(body["embeddings"]) == ["float"]


def test_same_codes_alone_and_in_a_batch(client):
    batch = client.simulate_post("/v2/embed", json={"texts": TEXTS, "embedding_types": TYPES}).json["embeddings"]
    for i, text in enumerate(TEXTS):
        alone = client.simulate_post("/v2/embed", json={"texts": [text], "embedding_types": TYPES}).json["embeddings"]
        assert all(alone[kind][0] == batch[kind][i] for kind in TYPES)


@pytest.mark.parametrize("input_type,prompt_name", [("search_query", "query"), ("search_document", "passage"),
                                                     ("clustering", "clustering"), ("classification", None)])
def test_input_type_picks_the_checkpoint_prompt(client, input_type, prompt_name):
    got = client.simulate_post("/v2/embed", json={"texts": TEXTS, "input_type": input_type}).json
    want = oai_floats(client, TEXTS, **({"prompt_name": prompt_name} if prompt_name else {}))
    assert np.array_equal(np.asarray(got["embeddings"]["float"], dtype=np.float32), want)


def test_prompt_names_in_order_of_preference():
    assert prompt_for_input_type("search_query", ["query", "search_query"]) == "search_query"
    assert prompt_for_input_type("search_document", ["document", "passage"]) == "document"
    assert prompt_for_input_type("search_document", ["query"]) is None
    assert prompt_for_input_type(None, ["query"]) is None


def test_output_dimension_is_the_matryoshka_cut(client):
    got = client.simulate_post("/v1/embed", json={"texts": TEXTS, "output_dimension": 2}).json["embeddings"]
    assert np.array_equal(np.asarray(got, dtype=np.float32), oai_floats(client, TEXTS, dimensions=2))


def test_truncate(client, engine):
    long = " ".join(["w"] * 40)
    assert client.simulate_post("/v1/embed", json={"texts": [long]}).status_code == 200  # END by default
    assert engine.embed_calls[-1]["truncate"] is True
    res = client.simulate_post("/v1/embed", json={"texts": [long], "truncate": "NONE"})
    assert res.status_code == 400 and list(res.json) == ["message"] and "too large" in res.json["message"]
    assert engine.embed_calls[-1]["truncate_left"] is False
    assert client.simulate_post("/v2/embed", json={"texts": [long], "truncate": "START"}).status_code == 200
    assert engine.embed_calls[-1]["truncate"] is True and engine.embed_calls[-1]["truncate_left"] is True


@pytest.mark.parametrize("body,words", [
    ({}, '"texts"'), ({"texts": []}, '"texts"'), ({"texts": "a"}, '"texts"'), ({"texts": ["a", 1]}, '"texts"'),
    ({"texts": ["a"], "input_type": "search"}, '"input_type"'), ({"texts": ["a"], "input_type": [[]]}, '"input_type"'),
    ({"texts": ["a"], "embedding_types": [["float"]]}, '"embedding_types"'),
    ({"texts": ["a"], "truncate": ["END"]}, '"truncate"'), ({"texts": ["a"], "output_dimension": "2"}, "from 1"),
    ({"texts": ["a"], "embedding_types": ["int4"]}, '"embedding_types"'),
    ({"texts": ["a"], "embedding_types": []}, '"embedding_types"'),
    ({"texts": ["a"], "output_dimension": 5}, "from 1 to 4"),
    ({"texts": ["a"], "output_dimension": True}, "from 1 to 4"),
    ({"texts": ["a"], "truncate": "MIDDLE"}, '"truncate"'),
    ({"images": ["data:image/png;base64,AA=="]}, '"images" is not supported'),
    ({"inputs": [{"content": []}]}, '"inputs" is not supported'),
])
@pytest.mark.parametrize("version", [1, 2])
def test_bad_requests_in_cohere_shape(client, body, words, version):
    res = client.simulate_post(f"/v{version}/embed", json=body)
    assert res.status_code == 400
    assert list(res.json) == ["message"] and words in res.json["message"]


def test_bad_json_and_batch_limit_in_cohere_shape(make_client, engine):
    client = make_client("--embedding", "--max-client-batch-size", "2", engine=engine)
    res = client.simulate_post("/v1/embed", body=b"{nope")
    assert res.status_code == 400 and list(res.json) == ["message"]
    res = client.simulate_post("/v2/embed", json={"texts": TEXTS})
    assert res.status_code == 413 and "3 texts" in res.json["message"]


def test_a_reranker_or_per_token_model_is_refused(make_client):
    reranker = make_client("--reranking", engine=FakeEngine(kind="cross-encoder"))
    res = reranker.simulate_post("/v2/embed", json={"texts": ["a"]})
    assert res.status_code >= 400 and list(res.json) == ["message"]
    from engine.types import Pooling
    per_token = make_client("--embedding", "--pooling", "none", engine=FakeEngine(pooling=Pooling.NONE))
    res = per_token.simulate_post("/v1/embed", json={"texts": ["a"]})
    assert res.status_code == 400 and "one vector per token" in res.json["message"]


def test_cohere_routes_count_in_metrics(make_client, engine):
    client = make_client("--embedding", "--metrics", engine=engine)
    client.simulate_post("/v2/embed", json={"texts": TEXTS})
    metrics = client.simulate_get("/metrics").text
    tokens = sum(len(t.split()) + 2 for t in TEXTS)
    assert f"llamacpp:prompt_tokens_total {tokens}" in metrics


def test_api_key_guards_the_cohere_routes(make_client, engine):
    client = make_client("--embedding", "--api-key", "sk-1", engine=engine)
    assert client.simulate_post("/v1/embed", json={"texts": ["a"]}).status_code == 401
    res = client.simulate_post("/v1/embed", json={"texts": ["a"]}, headers={"Authorization": "Bearer sk-1"})
    assert res.status_code == 200


# ---------------------------------------------------------------- /v1/embeddings' compact formats (extension)


@pytest.mark.parametrize("kind", ["int8", "uint8", "binary", "ubinary"])
def test_oai_encoding_format_extension(client, kind):
    res = client.simulate_post("/v1/embeddings", json={"input": TEXTS, "encoding_format": kind})
    assert res.status_code == 200, res.text
    data = res.json["data"]
    assert all(item["encoding_format"] == kind for item in data)
    assert np.array_equal(np.asarray([item["embedding"] for item in data]), quantize(oai_floats(client, TEXTS), kind))


# ---------------------------------------------------------------- /openapi.json


def test_openapi_request_schema_names_the_fields_the_parser_reads(client):
    from compat.wire.cohere_embed import parse_cohere_embed_request
    from tests.compat.test_openapi import _fields_read, _properties

    document = client.simulate_get("/openapi.json").json
    read = _fields_read(lambda b: parse_cohere_embed_request(b, version=1, width=4, prompt_names=[]), {"texts": ["a"]})
    assert read == _properties(document, "CohereEmbedRequest")


@pytest.mark.parametrize("body", [{"texts": TEXTS}, {"texts": TEXTS, "embedding_types": TYPES}, {"texts": []}])
@pytest.mark.parametrize("version", [1, 2])
def test_answers_validate_against_the_document(client, version, body):
    from tests.compat.test_openapi import _validate

    document = client.simulate_get("/openapi.json").json
    res = client.simulate_post(f"/v{version}/embed", json=body)
    _validate(document, f"/v{version}/embed", "post", res.status_code, res.json)
    res = client.simulate_post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "ubinary"})
    _validate(document, "/v1/embeddings", "post", res.status_code, res.json)
