"""The rerank routes through falcon's TestClient over the fake engine: modes, shapes, options, errors."""
from __future__ import annotations

import json
import uuid

import pytest
from falcon.testing import TestClient

from compat.app import create_app
from compat.settings import parse_settings
from engine.errors import ForwardFailed, QueueFull, ReplyTimeout
from tests.compat.fakes import FakeEngine, pair_score, pair_tokens

ROUTES = ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"]
ALL_ROUTES = [*ROUTES, "/v2/rerank"]
DEFAULT_NAME = "sentence-transformers/all-MiniLM-L6-v2"
QUERY = "machine learning is"
DOCS = ["a machine is a system", "learning is a process", "machine learning is a field of study", "paris"]
RERANK_DISABLED = "This server does not support reranking. Start it with `--reranking`"
TOO_LARGE = "input (17 tokens) is too large to process. increase the physical batch size (current batch size: 16)"


def handler_error(status: int, message: str, kind: str = "invalid_request_error") -> str:
    return json.dumps({"error": {"code": status, "message": message, "type": kind}}, separators=(",", ":"),
                      ensure_ascii=False)


def expected_order(query: str, docs: list[str]) -> list[int]:
    scores = [pair_score(query, d) for d in docs]
    return sorted(range(len(docs)), key=lambda i: (-scores[i], i))


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(kind="cross-encoder")


@pytest.fixture
def client(make_client, engine) -> TestClient:
    return make_client("--reranking", engine=engine)


def post(client: TestClient, path: str, body: dict):
    return client.simulate_post(path, json=body)


# ---------------------------------------------------------------- modes: flags, env, config files


def settings_client(tmp_path, argv=(), environ=None, ini: str | None = None) -> TestClient:
    files = []
    if ini is not None:
        (tmp_path / "config.ini").write_text(ini)
        files.append(tmp_path / "config.ini")
    settings = parse_settings(list(argv), environ or {}, system_config_files=files)
    return TestClient(create_app(settings, FakeEngine(kind="cross-encoder")))


@pytest.mark.parametrize("argv,environ,ini", [
    (["--reranking"], None, None),
    (["--rerank"], None, None),
    (["--embedding", "--pooling", "rank"], None, None),
    ([], {"LLAMA_ARG_RERANKING": "1"}, None),
    ([], {"LLAMA_ARG_EMBEDDINGS": "true", "LLAMA_ARG_POOLING": "rank"}, None),
    ([], None, "rerank = 1\n"),
    ([], None, "embedding = on\npooling = rank\n"),
])
def test_rank_mode_from_every_source_serves_every_route(tmp_path, argv, environ, ini):
    client = settings_client(tmp_path, argv, environ, ini)
    for path in ALL_ROUTES:
        res = post(client, path, {"query": QUERY, "documents": DOCS})
        assert res.status_code == 200, (path, res.text)
        assert [r["index"] for r in res.json["results"]] == expected_order(QUERY, DOCS)


@pytest.mark.parametrize("argv", [[], ["--embedding"], ["--pooling", "rank"], ["--reranking", "--pooling", "mean"],
                                  ["--embedding", "--pooling", "cls"]])
def test_without_rank_mode_every_route_is_llamas_501(make_client, argv):
    client = make_client(*argv, engine=FakeEngine(kind="cross-encoder"))
    for path in ALL_ROUTES:
        res = post(client, path, {"query": "q", "documents": ["a"]})
        assert (res.status_code, res.text) == (501, handler_error(501, RERANK_DISABLED, "not_supported_error"))


@pytest.mark.parametrize("path,body", [("/v1/embeddings", {"input": "hello"}), ("/embedding", {"content": "hello"}),
                                       ("/embeddings", {"input": ["a", "b"]})])
def test_rank_mode_refuses_embeddings_clearly(client, path, body):
    res = post(client, path, body)
    assert (res.status_code, res.text) == (400, handler_error(
        400, "this server runs a reranker (rank pooling): it serves /rerank, not embeddings"))


def test_models_capabilities_name_what_the_model_does(make_client):
    rank = make_client("--reranking", engine=FakeEngine(kind="cross-encoder")).simulate_get("/v1/models").json
    assert rank["models"][0]["capabilities"] == ["rerank"]
    embed = make_client("--embedding").simulate_get("/models").json
    assert embed["models"][0]["capabilities"] == ["embedding"]


# ---------------------------------------------------------------- shapes


def test_llama_shape_exact_bytes(client):
    res = post(client, "/rerank", {"query": "a b", "documents": ["b", "a b c", "z"], "model": "jina"})
    assert res.status_code == 200
    assert res.headers["content-type"] == "application/json; charset=utf-8"
    assert res.text == ('{"model":"jina","object":"list","usage":{"prompt_tokens":20,"total_tokens":20},'
                        '"results":[{"index":1,"relevance_score":1.97},{"index":0,"relevance_score":0.99},'
                        '{"index":2,"relevance_score":-0.01}]}')


def test_the_four_llama_routes_answer_identically(client):
    bodies = [post(client, path, {"query": QUERY, "documents": DOCS, "top_n": 3}).text for path in ROUTES]
    assert len(set(bodies)) == 1
    results = json.loads(bodies[0])["results"]
    assert [r["index"] for r in results] == expected_order(QUERY, DOCS)[:3]
    assert [r["relevance_score"] for r in results] == [pair_score(QUERY, DOCS[r["index"]]) for r in results]


@pytest.mark.parametrize("path", ROUTES)
def test_texts_key_selects_tei_bare_array(client, path):
    res = post(client, path, {"query": QUERY, "texts": DOCS})
    assert res.status_code == 200
    assert isinstance(res.json, list)
    assert [list(item) for item in res.json] == [["index", "score"]] * 4
    assert [item["index"] for item in res.json] == expected_order(QUERY, DOCS)
    assert [item["score"] for item in res.json] == [pair_score(QUERY, DOCS[i]) for i in expected_order(QUERY, DOCS)]


def test_tei_return_text_appends_the_text(client):
    res = post(client, "/rerank", {"query": QUERY, "texts": DOCS, "return_text": True, "top_n": 2})
    order = expected_order(QUERY, DOCS)[:2]
    assert res.json == [{"index": i, "score": pair_score(QUERY, DOCS[i]), "text": DOCS[i]} for i in order]


def test_texts_key_wins_the_shape_even_with_documents(client):
    res = post(client, "/rerank", {"query": QUERY, "documents": DOCS, "texts": ["ignored"]})
    assert isinstance(res.json, list) and len(res.json) == 4


def test_cohere_v2_shape(client):
    res = post(client, "/v2/rerank", {"model": "rerank-v3.5", "query": QUERY, "documents": DOCS, "top_n": 2})
    assert res.status_code == 200
    body = res.json
    assert list(body) == ["id", "results", "meta", "model", "usage"]
    assert str(uuid.UUID(body["id"])) == body["id"]
    assert body["id"] != post(client, "/v2/rerank", {"query": QUERY, "documents": DOCS}).json["id"]
    assert [r["index"] for r in body["results"]] == expected_order(QUERY, DOCS)[:2]
    assert body["meta"] == {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}}
    assert body["model"] == "rerank-v3.5"
    n = sum(pair_tokens(QUERY, d) for d in DOCS)
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_return_documents_echoes_each_document(client, path):
    docs = ["learning is fun", {"text": "machine learning is", "title": "ML"}]
    res = post(client, path, {"query": QUERY, "documents": docs, "return_documents": True})
    assert res.json["results"] == [
        {"index": 1, "relevance_score": pair_score(QUERY, "machine learning is"),
         "document": {"text": "machine learning is", "title": "ML"}},
        {"index": 0, "relevance_score": pair_score(QUERY, "learning is fun"), "document": {"text": "learning is fun"}}]
    without = post(client, path, {"query": QUERY, "documents": docs, "return_documents": False})
    assert all("document" not in r for r in without.json["results"])


# ---------------------------------------------------------------- top_n, ordering, usage, model


@pytest.mark.parametrize("top_n,count", [(None, 4), ("absent", 4), (0, 0), (2, 2), (4, 4), (99, 4)])
@pytest.mark.parametrize("path,key", [("/rerank", "documents"), ("/rerank", "texts"), ("/v2/rerank", "documents")])
def test_top_n(client, path, key, top_n, count):
    body = {"query": QUERY, key: DOCS}
    if top_n != "absent":
        body["top_n"] = top_n
    res = post(client, path, body)
    assert res.status_code == 200
    items = res.json if key == "texts" and path != "/v2/rerank" else res.json["results"]
    assert [item["index"] for item in items] == expected_order(QUERY, DOCS)[:count]


def test_usage_counts_every_pair_not_only_the_returned_ones(client):
    res = post(client, "/rerank", {"query": QUERY, "documents": DOCS, "top_n": 1})
    n = sum(pair_tokens(QUERY, d) for d in DOCS)
    assert res.json["usage"] == {"prompt_tokens": n, "total_tokens": n}
    assert len(res.json["results"]) == 1


def test_sorted_by_score_descending_ties_by_ascending_index(client, engine):
    engine.fixed_scores = [1.0, 3.0, 1.0, 3.0, -2.0, 1.0]
    docs = ["a", "b", "c", "d", "e", "f"]
    for path in ("/rerank", "/v2/rerank"):
        res = post(client, path, {"query": "q", "documents": docs})
        assert [(r["index"], r["relevance_score"]) for r in res.json["results"]] == [
            (1, 3.0), (3, 3.0), (0, 1.0), (2, 1.0), (5, 1.0), (4, -2.0)]
    tei = post(client, "/rerank", {"query": "q", "texts": docs, "top_n": 3}).json
    assert [item["index"] for item in tei] == [1, 3, 0]


@pytest.mark.parametrize("argv,model,expected", [
    ((), "my-reranker", "my-reranker"), ((), None, DEFAULT_NAME), ((), 42, DEFAULT_NAME),
    (("--alias", "jina-reranker"), None, "jina-reranker"), (("-m", "/models/ce"), {"x": 1}, "/models/ce"),
])
def test_model_echo(make_client, argv, model, expected):
    client = make_client("--reranking", *argv, engine=FakeEngine(kind="cross-encoder"))
    body = {"query": "q", "documents": ["a"], **({"model": model} if model is not None else {})}
    assert post(client, "/rerank", body).json["model"] == expected
    assert post(client, "/v2/rerank", body).json["model"] == expected


# ---------------------------------------------------------------- what reaches the engine


def test_engine_gets_texts_truncate_instruction_and_timeout(make_client):
    engine = FakeEngine(kind="generative-reranker")
    client = make_client("--reranking", "--timeout", "77", engine=engine)
    docs = ["plain", {"text": "object text", "id": "7"}]
    post(client, "/rerank", {"query": "q", "documents": docs})
    post(client, "/rerank", {"query": "q", "documents": docs, "truncate": True, "instruction": "Find code"})
    post(client, "/v2/rerank", {"query": "q", "documents": docs})
    post(client, "/v2/rerank", {"query": "q", "documents": docs, "truncate": False})
    # the engine gets what is left of the request's -to deadline
    assert all(76 < call.pop("timeout_s") <= 77 for call in engine.rerank_calls)
    assert engine.rerank_calls == [
        {"query": "q", "documents": ["plain", "object text"], "truncate": truncate, "instruction": instruction,
         "max_chunks": None}
        for truncate, instruction in [(None, None), (True, "Find code"), (True, None), (False, None)]]


def test_cohere_only_fields_are_accepted(client, engine):
    res = post(client, "/v1/rerank", {"query": QUERY, "documents": DOCS, "rank_fields": ["text"],
                                      "max_chunks_per_doc": 10, "return_documents": None, "top_n": None})
    assert res.status_code == 200 and len(res.json["results"]) == 4
    res = post(client, "/v2/rerank", {"model": "m", "query": QUERY, "documents": DOCS, "max_tokens_per_doc": 4096,
                                      "priority": 0, "relevant_spans": {"mode": "enabled"}})
    assert res.status_code == 200 and len(res.json["results"]) == 4


def test_timing_headers(client):
    res = post(client, "/rerank", {"query": "q", "documents": ["a"]})
    assert (res.headers["x-tokenization-time"], res.headers["x-queue-time"], res.headers["x-inference-time"]) == (
        "1", "2", "12")


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("body,message", [
    ({"documents": ["a"]}, '"query" must be provided'),
    ({"query": 3, "documents": ["a"]}, '"query" must be a string'),
    ({"query": "q"}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": []}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": None}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": 123}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": [1, 2, 3]}, '"documents" must be a non-empty string array'),
    ({"query": "q", "texts": []}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": [{"content": "a"}]}, 'a "documents" object must have a "text" string'),
    ({"query": "q", "documents": ["a"], "top_n": -1}, '"top_n" must be a non-negative integer'),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, '"return_documents" must be a boolean'),
    ({"query": "q", "documents": ["a"], "truncate": 1}, '"truncate" must be a boolean'),
    ({"query": "q", "documents": ["a"], "rank_fields": ["title"]},
     '"rank_fields" is not supported: send each document as a string or as {"text": ...}'),
])
@pytest.mark.parametrize("path", ["/rerank", "/v2/rerank"])
def test_client_faults_are_400(client, engine, path, body, message):
    res = post(client, path, body)
    assert (res.status_code, res.text) == (400, handler_error(400, message))
    assert engine.rerank_calls == []


def test_invalid_json_and_non_object_bodies_are_400(client):
    res = client.simulate_post("/rerank", body=b"{not json", headers={"Content-Type": "application/json"})
    assert res.status_code == 400 and res.json["error"]["type"] == "invalid_request_error"
    res = client.simulate_post("/v1/rerank", json=["q", "a"])
    assert (res.status_code, res.text) == (400, handler_error(400, "The request body must be a JSON object"))


def test_instruction_on_a_cross_encoder_is_400(client):
    res = post(client, "/rerank", {"query": "q", "documents": ["a"], "instruction": "Find code"})
    assert (res.status_code, res.text) == (400, handler_error(
        400, "'instruction' is only used by generative rerankers; this one is a cross-encoder"))


def test_too_long_pair_is_400_too_large_and_truncate_serves_it(client):
    body = {"query": "q", "documents": ["a", "w " * 13]}  # 3 + 1 + 13 = 17 tokens > 16
    res = post(client, "/rerank", body)
    assert (res.status_code, res.text) == (400, handler_error(400, TOO_LARGE))
    res = post(client, "/rerank", {**body, "truncate": True})
    assert res.status_code == 200
    assert res.json["usage"]["prompt_tokens"] == 5 + 16
    assert post(client, "/v2/rerank", body).status_code == 200  # Cohere v2 truncates by default
    assert post(client, "/v2/rerank", {**body, "truncate": False}).text == handler_error(400, TOO_LARGE)


@pytest.mark.parametrize("exc,status,kind", [
    (QueueFull("Too many inputs queued; retry later"), 503, "unavailable_error"),
    (ReplyTimeout("the request was not served within 1 s"), 504, "timeout_error"),
    (ForwardFailed("boom"), 500, "server_error"),
])
def test_engine_errors_map_through_the_one_table(client, engine, exc, status, kind):
    engine.raise_on_rerank = exc
    res = post(client, "/v2/rerank", {"query": "q", "documents": ["a"]})
    assert (res.status_code, res.text) == (status, handler_error(status, str(exc), kind))


def test_rerank_routes_need_the_api_key(make_client):
    client = make_client("--reranking", "--api-key", "k", engine=FakeEngine(kind="cross-encoder"))
    body = {"query": "q", "documents": ["a"]}
    assert client.simulate_post("/v1/rerank", json=body).status_code == 401
    assert client.simulate_post("/v1/rerank", json=body, headers={"Authorization": "Bearer k"}).status_code == 200


def test_get_on_a_rerank_route_is_404(client):
    assert client.simulate_get("/v1/rerank").status_code == 404
