"""vLLM's /score and /v1/score over the fake cross-encoder: the 1:1, 1:N and N:N pairings in both field forms,
vLLM's default sigmoid and use_activation false (the raw score /rerank gives), the refusals, the document."""
from __future__ import annotations

import math

import pytest

from tests.compat.fakes import FakeEngine, pair_score, pair_tokens

QUERY = "machine learning is"
DOCS = ["a machine is a system", "learning is a process", "paris"]


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@pytest.fixture
def client(make_client):
    return make_client("--reranking", engine=FakeEngine(kind="cross-encoder"))


def scores(res) -> list[float]:
    assert res.status_code == 200, res.text
    assert [item["index"] for item in res.json["data"]] == list(range(len(res.json["data"])))
    assert all(item["object"] == "score" for item in res.json["data"])
    return [item["score"] for item in res.json["data"]]


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_one_to_n_is_the_sigmoid_of_the_rerank_logit(client, path):
    res = client.simulate_post(path, json={"text_1": QUERY, "text_2": DOCS, "model": "bge"})
    assert scores(res) == pytest.approx([sigmoid(pair_score(QUERY, d)) for d in DOCS], abs=1e-12)
    body = res.json
    assert list(body) == ["id", "object", "created", "model", "data", "usage"]
    assert body["object"] == "list" and body["model"] == "bge" and body["id"].startswith("score-")
    n = sum(pair_tokens(QUERY, d) for d in DOCS)
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}


def test_use_activation_false_is_what_rerank_returns(client):
    raw = scores(client.simulate_post("/score", json={"queries": QUERY, "documents": DOCS, "use_activation": False}))
    rerank = client.simulate_post("/rerank", json={"query": QUERY, "documents": DOCS}).json["results"]
    assert raw == [next(r["relevance_score"] for r in rerank if r["index"] == i) for i in range(len(DOCS))]
    assert scores(client.simulate_post("/score", json={"text_1": QUERY, "text_2": DOCS, "use_activation": True})) \
        == pytest.approx([sigmoid(s) for s in raw], abs=1e-12)


def test_one_to_one_and_n_to_n(client):
    assert scores(client.simulate_post("/score", json={"text_1": QUERY, "text_2": DOCS[1]})) == \
        pytest.approx([sigmoid(pair_score(QUERY, DOCS[1]))])
    firsts = [QUERY, "paris is big", QUERY]
    got = scores(client.simulate_post("/v1/score", json={"text_1": firsts, "text_2": DOCS}))
    assert got == pytest.approx([sigmoid(pair_score(q, d)) for q, d in zip(firsts, DOCS)], abs=1e-12)


@pytest.mark.parametrize("body,words", [
    ({}, '"text_1" and "text_2"'),
    ({"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "1:1, 1:N or N:N"),
    ({"text_1": "a"}, '"text_2"'), ({"text_1": "a", "text_2": []}, '"text_2"'),
    ({"queries": [1], "documents": ["a"]}, '"queries"'),
    ({"text_1": "a", "text_2": "b", "use_activation": "yes"}, '"use_activation"'),
    ({"text_1": "a", "text_2": "b", "truncate_prompt_tokens": 8}, '"truncate_prompt_tokens"'),
])
def test_bad_requests_are_openai_style_errors(client, body, words):
    res = client.simulate_post("/score", json=body)
    assert res.status_code == 400
    assert res.json["error"]["type"] == "invalid_request_error" and words in res.json["error"]["message"]


def test_batch_limit_and_embedding_model(make_client):
    client = make_client("--reranking", "--max-client-batch-size", "2", engine=FakeEngine(kind="cross-encoder"))
    assert client.simulate_post("/score", json={"text_1": "a", "text_2": DOCS}).status_code == 413
    embedder = make_client("--embedding", engine=FakeEngine())
    assert embedder.simulate_post("/score", json={"text_1": "a", "text_2": "b"}).status_code == 501


def test_a_generative_reranker_has_no_raw_logit(make_client):
    client = make_client("--reranking", engine=FakeEngine(kind="generative-reranker"))
    assert client.simulate_post("/score", json={"text_1": "a", "text_2": "a b"}).status_code == 200
    res = client.simulate_post("/score", json={"text_1": "a", "text_2": "a b", "use_activation": False})
    assert res.status_code == 400 and "probabilities" in res.json["error"]["message"]


def test_truncate_prompt_tokens_minus_one_truncates(make_client):
    engine = FakeEngine(kind="cross-encoder")
    client = make_client("--reranking", engine=engine)
    scores(client.simulate_post("/score", json={"text_1": "a", "text_2": "b", "truncate_prompt_tokens": -1}))
    assert engine.rerank_calls[-1]["truncate"] is True and engine.rerank_calls[-1]["sigmoid"] is True


def test_openapi_describes_the_score_routes(client):
    from compat.wire.score import parse_score_request
    from tests.compat.test_openapi import _fields_read, _properties, _validate

    document = client.simulate_get("/openapi.json").json
    read = _fields_read(parse_score_request, {"text_1": "a", "text_2": "b"}, {"queries": "a", "documents": "b"})
    assert read == _properties(document, "ScoreRequest")
    for body in ({"text_1": QUERY, "text_2": DOCS}, {"text_1": []}):
        res = client.simulate_post("/v1/score", json=body)
        _validate(document, "/v1/score", "post", res.status_code, res.json)
