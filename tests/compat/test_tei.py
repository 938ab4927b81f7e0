"""TEI's native routes (compat/wire/tei.py, compat/resources/tei.py) on the fake engine: bodies, shapes, and
TEI's error body and statuses (text-embeddings-inference router/src/lib.rs ErrorType, server.rs StatusCode)."""
from __future__ import annotations

import numpy as np
import pytest

from engine.errors import QueueFull
from engine.types import Pooling
from tests.compat.fakes import CLS, SEP, FakeEngine, pooled_vector, token_rows, word_id


@pytest.fixture
def engine():
    return FakeEngine()


@pytest.fixture
def client(make_client, engine):
    return make_client("--embedding", engine=engine)


def _ids(text: str) -> list[int]:
    return [CLS, *(word_id(w) for w in text.split()), SEP]


def _unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


def test_embed_answers_bare_normalized_vectors(client):
    res = client.simulate_post("/embed", json={"inputs": ["a b", "c"]})
    assert res.status_code == 200
    got = np.asarray(res.json)
    np.testing.assert_allclose(got, [_unit(pooled_vector(_ids("a b"))), _unit(pooled_vector(_ids("c")))], rtol=1e-6)
    one = client.simulate_post("/embed", json={"inputs": "a b"}).json
    np.testing.assert_allclose(one, got[:1], rtol=1e-6)


def test_embed_normalize_false_and_dimensions(client):
    raw = client.simulate_post("/embed", json={"inputs": "a b", "normalize": False}).json
    np.testing.assert_allclose(raw[0], pooled_vector(_ids("a b")), rtol=1e-6)
    cut = client.simulate_post("/embed", json={"inputs": "a b", "dimensions": 2}).json
    np.testing.assert_allclose(cut[0], _unit(pooled_vector(_ids("a b"))[:2]), rtol=1e-6)


def test_embed_takes_token_ids(client):
    res = client.simulate_post("/embed", json={"inputs": [[CLS, 5, SEP]], "normalize": False})
    np.testing.assert_allclose(res.json[0], pooled_vector([CLS, 5, SEP]), rtol=1e-6)


def test_truncation_direction(client, engine):
    long = " ".join(f"w{i}" for i in range(30))
    res = client.simulate_post("/embed", json={"inputs": long})
    assert res.status_code == 413
    assert res.json["error_type"] == "Validation"
    assert "must have less than 16 tokens. Given: 32" in res.json["error"]
    for direction, left in (("Right", False), ("right", False), ("Left", True), ("left", True), (None, False)):
        body = {"inputs": long, "truncate": True, "truncation_direction": direction}
        assert client.simulate_post("/embed", json=body).status_code == 200
        assert engine.embed_calls[-1]["truncate_left"] is left
        assert engine.embed_calls[-1]["truncate"] is True
    bad = client.simulate_post("/embed", json={"inputs": "a", "truncation_direction": "Middle"})
    assert (bad.status_code, bad.json["error_type"]) == (422, "Validation")


@pytest.mark.parametrize("body, status, error_type", [
    ({"inputs": []}, 400, "Empty"),
    ({"inputs": ""}, 400, "Empty"),
    ({}, 400, "Empty"),
    ({"inputs": "a", "normalize": "yes"}, 422, "Validation"),
    ({"inputs": "a", "dimensions": 99}, 422, "Validation"),
    ({"inputs": "a", "prompt_name": 3}, 422, "Validation"),
    ({"inputs": [[999999]]}, 422, "Tokenizer"),
    ({"inputs": {"a": 1}}, 422, "Validation"),
])
def test_embed_errors_in_tei_body(client, body, status, error_type):
    res = client.simulate_post("/embed", json=body)
    assert res.status_code == status
    assert res.json == {"error": res.json["error"], "error_type": error_type}
    assert res.json["error"]


def test_bad_json_and_overload_in_tei_body(client, engine):
    res = client.simulate_post("/embed", body=b"{nope", headers={"Content-Type": "application/json"})
    assert (res.status_code, res.json["error_type"]) == (422, "Validation")
    engine.raise_on_embed = QueueFull("queue is full")
    res = client.simulate_post("/embed", json={"inputs": "a"})
    assert (res.status_code, res.json) == (429, {"error": "queue is full", "error_type": "Overloaded"})


def test_max_client_batch_size(make_client):
    client = make_client("--embedding", "--max-client-batch-size", "2")
    res = client.simulate_post("/embed", json={"inputs": ["a", "b", "c"]})
    assert (res.status_code, res.json["error_type"]) == (413, "Validation")
    res = client.simulate_post("/similarity", json={"inputs": {"source_sentence": "a", "sentences": ["b", "c"]}})
    assert res.status_code == 413


def test_embed_all_per_token_rows(make_client):
    client = make_client("--embedding", "--pooling", "none", engine=FakeEngine(pooling=Pooling.NONE))
    res = client.simulate_post("/embed_all", json={"inputs": ["a b", "c"]})
    assert res.status_code == 200
    assert len(res.json) == 2
    np.testing.assert_allclose(res.json[0], token_rows(_ids("a b")), rtol=1e-6)


def test_similarity_on_a_per_token_model_is_teis_backend_error(make_client):
    # it was a 500 (the cosine of ragged per-token rows), found by the OpenAPI fuzz check on --pooling none
    client = make_client("--embedding", "--pooling", "none", engine=FakeEngine(pooling=Pooling.NONE))
    similarity = {"inputs": {"source_sentence": "a", "sentences": ["b c"]}}
    for path in ("/similarity", "/"):
        res = client.simulate_post(path, json=similarity)
        assert res.status_code == 424 and res.json["error_type"] == "Backend", res.text
        assert "one vector per token" in res.json["error"]
    document = client.simulate_get("/openapi.json").json
    assert set(document["paths"]["/similarity"]["post"]["responses"]) == {"424", "default"}
    assert "TeiSimilarityRequest" not in str(document["paths"]["/"]["post"]["requestBody"])


def test_embed_all_on_a_pooled_model_says_why(client):
    res = client.simulate_post("/embed_all", json={"inputs": "a"})
    assert res.status_code == 424
    assert res.json["error_type"] == "Backend"
    assert "--pooling none" in res.json["error"]


def test_similarity_is_the_cosine_with_the_source(client):
    body = {"inputs": {"source_sentence": "a b", "sentences": ["a b", "c d", "e"]}}
    res = client.simulate_post("/similarity", json=body)
    assert res.status_code == 200
    source = _unit(pooled_vector(_ids("a b")))
    want = [float(_unit(pooled_vector(_ids(t))) @ source) for t in ("a b", "c d", "e")]
    np.testing.assert_allclose(res.json, want, rtol=1e-6)
    assert res.json[0] == pytest.approx(1.0)
    # POST / with `inputs` as {source_sentence, sentences} is the same (huggingface_hub's sentence_similarity)
    root = client.simulate_post("/", json={**body, "parameters": {}})
    np.testing.assert_allclose(root.json, res.json, rtol=1e-9)


@pytest.mark.parametrize("inputs", [{"source_sentence": "a"}, {"source_sentence": 1, "sentences": ["a"]},
                                    {"source_sentence": "a", "sentences": "b"}])
def test_similarity_bad_inputs(client, inputs):
    res = client.simulate_post("/similarity", json={"inputs": inputs})
    assert (res.status_code, res.json["error_type"]) == (422, "Validation")


def test_root_route_embeds(client):
    root = client.simulate_post("/", json={"inputs": "a b", "normalize": False})
    assert root.json == client.simulate_post("/embed", json={"inputs": "a b", "normalize": False}).json


def test_root_route_on_a_reranker_points_to_rerank(make_client):
    client = make_client("--reranking", engine=FakeEngine(kind="cross-encoder"))
    res = client.simulate_post("/", json={"inputs": "a"})
    assert (res.status_code, res.json["error_type"]) == (424, "Backend")
    assert "/rerank" in res.json["error"]


def test_tokenize_tei_body_gets_tei_tokens(client):
    res = client.simulate_post("/tokenize", json={"inputs": "a bé"})
    assert res.status_code == 200
    assert res.json == [[{"id": CLS, "text": "[CLS]", "special": True, "start": None, "stop": None},
                         {"id": word_id("a"), "text": "a", "special": False, "start": 0, "stop": 1},
                         {"id": word_id("bé"), "text": "bé", "special": False, "start": 2, "stop": 5},
                         {"id": SEP, "text": "[SEP]", "special": True, "start": None, "stop": None}]]
    plain = client.simulate_post("/tokenize", json={"inputs": ["a", "c"], "add_special_tokens": False}).json
    assert [[t["id"] for t in one] for one in plain] == [[word_id("a")], [word_id("c")]]
    # llama's body keeps llama's answer, `content` winning over `inputs`
    llama = client.simulate_post("/tokenize", json={"content": "a", "inputs": "b"})
    assert llama.json == {"tokens": [word_id("a")]}
    bad = client.simulate_post("/tokenize", json={"inputs": 5})
    assert (bad.status_code, bad.json["error_type"]) == (422, "Validation")


def test_tokenize_applies_prompt_name(make_client):
    engine = FakeEngine(prompts=(("query", "q: "),))
    client = make_client("--embedding", engine=engine)
    res = client.simulate_post("/tokenize", json={"inputs": "a", "prompt_name": "query"})
    assert [t["text"] for t in res.json[0]] == ["[CLS]", "q:", "a", "[SEP]"]
    assert res.json[0][2]["start"] == 3


def test_decode(client):
    client.simulate_post("/tokenize", json={"inputs": "hello world"})  # the fake learns the words
    ids = _ids("hello world")
    assert client.simulate_post("/decode", json={"ids": ids}).json == ["hello world"]
    both = client.simulate_post("/decode", json={"ids": [ids, ids[1:2]], "skip_special_tokens": False}).json
    assert both == ["[CLS] hello world [SEP]", "hello"]
    for body, status in (({"ids": "x"}, 422), ({"ids": []}, 400), ({"ids": [1, True]}, 422)):
        res = client.simulate_post("/decode", json=body)
        assert res.status_code == status, body
        assert set(res.json) == {"error", "error_type"}


def test_info(client, engine):
    res = client.simulate_get("/info")
    assert res.status_code == 200
    info = res.json
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["model_dtype"] == "float32"
    assert info["max_input_length"] == engine.info.max_input_tokens
    assert info["max_batch_tokens"] == engine.info.batch_tokens
    assert info["max_client_batch_size"] == 2048
    assert info["auto_truncate"] is False
    for key in ("model_id", "model_sha", "max_concurrent_requests", "max_batch_requests", "tokenization_workers",
                "version", "sha", "docker_label"):
        assert key in info


def test_info_of_a_reranker(make_client):
    client = make_client("--reranking", "--truncate", engine=FakeEngine(kind="cross-encoder"))
    info = client.simulate_get("/info").json
    assert list(info["model_type"]) == ["reranker"]
    assert info["auto_truncate"] is True


def test_routes_need_the_api_key(make_client):
    client = make_client("--embedding", "--api-key", "k")
    assert client.simulate_post("/embed", json={"inputs": "a"}).status_code == 401
    ok = client.simulate_post("/embed", json={"inputs": "a"}, headers={"Authorization": "Bearer k"})
    assert ok.status_code == 200


def test_routes_are_in_the_openapi_document(client):
    paths = client.simulate_get("/openapi.json").json["paths"]
    for path in ("/", "/embed", "/embed_all", "/similarity", "/decode", "/info", "/tokenize"):
        assert path in paths


def test_request_schemas_name_exactly_the_fields_the_parsers_read(client):
    from compat.wire import tei
    from tests.compat.test_openapi import _fields_read

    schemas = client.simulate_get("/openapi.json").json["components"]["schemas"]

    def properties(name: str) -> set[str]:
        return set(schemas[name]["properties"])

    assert _fields_read(lambda b: tei.parse_embed_request(b, width=4), {"inputs": "a"}) \
        == properties("TeiEmbedRequest")
    assert _fields_read(lambda b: tei.parse_embed_request(b, width=4, per_token=True), {"inputs": "a"}) \
        == properties("TeiEmbedAllRequest")
    similarity = {"inputs": {"source_sentence": "a", "sentences": ["b"]}}
    assert _fields_read(tei.parse_similarity_request, similarity) == properties("TeiSimilarityRequest")
    assert _fields_read(tei.parse_tokenize_request, {"inputs": "a"}) == properties("TeiTokenizeRequest")
    assert _fields_read(tei.parse_decode_request, {"ids": [1]}) == properties("TeiDecodeRequest")
    from compat.wire.sparse import parse_sparse_request
    assert _fields_read(parse_sparse_request, {"inputs": "a"}) == properties("TeiEmbedSparseRequest")


def test_embedding_routes_need_embedding_enabled(make_client):
    client = make_client()
    for path in ("/", "/embed", "/similarity"):
        body = {"inputs": {"source_sentence": "a", "sentences": ["b"]}} if path == "/similarity" else {"inputs": "a"}
        res = client.simulate_post(path, json=body)
        assert (res.status_code, res.json["error_type"]) == (424, "Backend"), path
        assert "--embeddings" in res.json["error"]
