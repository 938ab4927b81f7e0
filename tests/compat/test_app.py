"""The wire contract of compat.app, driven through falcon's TestClient over a fake engine."""
from __future__ import annotations

import base64
import json
import time

import numpy as np
import pytest

from engine.errors import (
    EngineError,
    ForwardFailed,
    NotLoaded,
    OutOfMemory,
    QueueFull,
    ReplyTimeout,
    TooManyInputs,
    UnsupportedCheckpoint,
)
from engine.types import Pooling
from tests.compat.fakes import CLS, SEP, FakeEngine, pooled_vector, token_rows, word_id
from tests.conftest import parse_metrics

NOT_FOUND = '{"error":{"message":"File Not Found","type":"not_found_error","code":404}}'
LOADING = '{"error":{"message":"Loading model","type":"unavailable_error","code":503}}'
UNAUTHORIZED = '{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}'
JSON_TYPE = "application/json; charset=utf-8"
DEFAULT_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def handler_error(status: int, message: str, kind: str) -> str:
    return json.dumps({"error": {"code": status, "message": message, "type": kind}}, separators=(",", ":"),
                      ensure_ascii=False)


def llama_normalize(x: np.ndarray, p: int) -> np.ndarray:
    """docs/llama-server-contract.md §3.5, written independently of the engine's version."""
    x = np.asarray(x, dtype=np.float64)
    if p == -1:
        total = 1.0
    elif p == 0:
        total = np.max(np.abs(x)) / 32760.0
    elif p == 2:
        total = np.sqrt(np.sum(x * x))
    else:
        with np.errstate(divide="ignore"):  # negative p over a zero component: inf, as in C
            total = np.sum(np.abs(x) ** p) ** (1.0 / p)
    return x / total if total > 0 else np.zeros_like(x)


@pytest.fixture
def client(make_client):
    return make_client("--embedding")


# ---------------------------------------------------------------- transport: routing, 404, HEAD, JSON


def test_health_both_routes(client):
    for path in ("/health", "/v1/health"):
        res = client.simulate_get(path)
        assert res.status_code == 200
        assert res.text == '{"status":"ok"}'
        assert res.headers["content-type"] == JSON_TYPE


def test_head_is_served_by_get_without_a_body(client):
    res = client.simulate_head("/health")
    assert res.status_code == 200
    assert res.text == ""
    assert res.headers["content-length"] == "15"


@pytest.mark.parametrize("method,path", [
    ("GET", "/nope"), ("POST", "/nope"), ("GET", "/"), ("GET", "/health/"),
    ("GET", "/v1/embeddings"), ("GET", "/embedding"), ("POST", "/health"), ("DELETE", "/props"),
    ("PUT", "/tokenize"), ("GET", "/v1/rerank"), ("HEAD", "/embeddings"),
])
def test_unknown_paths_and_wrong_methods_are_404_file_not_found(client, method, path):
    res = client.simulate_request(method, path)
    assert res.status_code == 404
    if method != "HEAD":
        assert res.text == NOT_FOUND


def test_responses_are_compact_utf8_json(make_client):
    engine = FakeEngine()
    client = make_client("--embedding", engine=engine)
    ids = client.simulate_post("/tokenize", json={"content": "héllo wörld"}).json["tokens"]
    res = client.simulate_post("/detokenize", json={"tokens": ids})
    assert res.content == '{"content":"héllo wörld"}'.encode()  # raw UTF-8, no \u escapes, no spaces
    assert res.headers["content-type"] == JSON_TYPE


# ---------------------------------------------------------------- loading state


def test_every_path_is_503_while_loading(make_client):
    engine = FakeEngine(loaded=False)
    client = make_client("--embedding", "--api-key", "secret", engine=engine)
    for method, path, headers in [("GET", "/health", {}), ("GET", "/v1/health", {}),
                                  ("POST", "/v1/embeddings", {"Authorization": "Bearer wrong"}),
                                  ("GET", "/nope", {}), ("GET", "/props", {"X-Api-Key": "secret"})]:
        res = client.simulate_request(method, path, headers=headers)
        assert (res.status_code, res.text) == (503, LOADING), path
    assert client.simulate_options("/v1/embeddings").status_code == 200  # preflight comes first
    engine.is_loaded = True
    assert client.simulate_get("/health").status_code == 200


# ---------------------------------------------------------------- CORS


def test_cors_default_echoes_origin_with_credentials(client):
    res = client.simulate_get("/health", headers={"Origin": "http://app.example:3000"})
    assert res.headers["access-control-allow-origin"] == "http://app.example:3000"
    assert res.headers["access-control-allow-credentials"] == "true"
    assert client.simulate_get("/health").headers["access-control-allow-origin"] == "*"


def test_cors_headers_are_on_error_answers_too(client):
    res = client.simulate_get("/nope", headers={"Origin": "http://a.example"})
    assert res.status_code == 404
    assert res.headers["access-control-allow-origin"] == "http://a.example"


def test_options_preflight_answers_before_auth_and_routing(make_client):
    client = make_client("--embedding", "--api-key", "secret")
    res = client.simulate_options("/anything/at/all", headers={"Origin": "http://a.example"})
    assert res.status_code == 200
    assert res.text == ""
    assert res.headers["content-type"].startswith("text/html")
    assert res.headers["access-control-allow-origin"] == "http://a.example"
    assert res.headers["access-control-allow-credentials"] == "true"
    assert res.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert res.headers["access-control-allow-headers"] == "*"


def test_cors_without_credentials_sends_star(make_client):
    client = make_client("--no-cors-credentials", "--cors-methods", "GET, POST", "--cors-headers",
                         "Authorization")
    res = client.simulate_options("/health", headers={"Origin": "http://a.example"})
    assert res.headers["access-control-allow-origin"] == "*"
    assert res.headers["access-control-allow-credentials"] == "false"
    assert res.headers["access-control-allow-methods"] == "GET, POST"
    assert res.headers["access-control-allow-headers"] == "Authorization"
    assert "access-control-allow-credentials" not in client.simulate_get("/health").headers


@pytest.mark.parametrize("origin,allowed", [
    ("http://localhost:3000", True), ("http://127.0.0.1", True), ("http://[::1]:8080", True),
    ("https://localhost", True), ("http://evil.example", False), ("http://localhost.evil.example", False),
    ("not a url", False),
])
def test_cors_localhost_mode_reflects_only_local_origins(make_client, origin, allowed):
    res = make_client("--cors-origins", "localhost").simulate_get("/health", headers={"Origin": origin})
    assert res.status_code == 200
    assert res.headers.get("access-control-allow-origin") == (origin if allowed else None)


def test_cors_fixed_origin_is_sent_as_configured(make_client):
    res = make_client("--cors-origins", "https://ui.example").simulate_get(
        "/health", headers={"Origin": "http://other.example"})
    assert res.headers["access-control-allow-origin"] == "https://ui.example"


# ---------------------------------------------------------------- API key


@pytest.fixture
def keyed(make_client):
    return make_client("--embedding", "--api-key", "sk-one,sk-two")


def test_api_key_missing_or_wrong_is_401(keyed):
    for headers in ({}, {"Authorization": "Bearer nope"}, {"X-Api-Key": "sk-one-and-more"},
                    {"Authorization": "Bearer "}, {"Authorization": "sk-on"}):
        res = keyed.simulate_post("/v1/embeddings", json={"input": "x"}, headers=headers)
        assert (res.status_code, res.text) == (401, UNAUTHORIZED), headers


@pytest.mark.parametrize("headers", [
    {"Authorization": "Bearer sk-one"}, {"Authorization": "sk-two"}, {"X-Api-Key": "sk-two"},
    {"X-Api-Key": "Bearer sk-one"},
])
def test_api_key_accepted_forms(keyed, headers):
    res = keyed.simulate_post("/v1/embeddings", json={"input": "x"}, headers=headers)
    assert res.status_code == 200


def test_health_is_public_and_auth_runs_before_routing(keyed):
    assert keyed.simulate_get("/health").status_code == 200
    assert keyed.simulate_get("/v1/health").status_code == 200
    assert keyed.simulate_get("/props").status_code == 401
    assert keyed.simulate_get("/no/such/path").text == UNAUTHORIZED
    assert keyed.simulate_get("/no/such/path", headers={"X-Api-Key": "sk-one"}).text == NOT_FOUND


# ---------------------------------------------------------------- --api-prefix


def test_api_prefix_serves_routes_only_under_the_prefix(make_client):
    client = make_client("--embedding", "--api-prefix", "/api")
    assert client.simulate_get("/api/health").text == '{"status":"ok"}'
    assert client.simulate_post("/api/v1/embeddings", json={"input": "a"}).status_code == 200
    assert client.simulate_get("/health").text == NOT_FOUND
    assert client.simulate_get("/apihealth").text == NOT_FOUND
    assert client.simulate_get("/api/nope").text == NOT_FOUND


def test_api_prefix_with_key_keeps_health_public(make_client):
    client = make_client("--api-prefix", "/api/", "--api-key", "k")
    assert client.simulate_get("/api/health").status_code == 200
    assert client.simulate_get("/api/props").status_code == 401
    assert client.simulate_get("/api/props", headers={"Authorization": "Bearer k"}).status_code == 200
    assert client.simulate_get("/health").text == UNAUTHORIZED  # outside the prefix: unknown, so 401 first


# ---------------------------------------------------------------- embeddings: order of checks (§3.1)


@pytest.mark.parametrize("path", ["/embedding", "/embeddings", "/v1/embeddings"])
def test_embeddings_need_the_embedding_flag(make_client, path):
    res = make_client().simulate_post(path, json={"input": "x"})
    assert res.status_code == 501
    assert res.text == ('{"error":{"code":501,"message":"This server does not support embeddings. Start it with '
                        '`--embeddings`","type":"not_supported_error"}}')


def test_pooling_none_on_v1_is_400_before_the_body_is_read(make_client):
    client = make_client("--embedding", engine=FakeEngine(pooling=Pooling.NONE))
    expected = handler_error(400, "Pooling type 'none' is not OAI compatible. Please use a different pooling type",
                             "invalid_request_error")
    for body in (b'{"input":"x"}', b"not json", b'{"content":"x"}'):
        res = client.simulate_post("/v1/embeddings", body=body)
        assert (res.status_code, res.text) == (400, expected)


@pytest.mark.parametrize("body,message", [
    (b"{oops", "unexpected character"),
    (b"", "Input is a zero-length, empty document"),
    (b'{"input": "x"', "unexpected end of data"),
])
def test_invalid_json_is_400_with_the_parser_message(client, body, message):
    res = client.simulate_post("/v1/embeddings", body=body)
    assert res.status_code == 400
    error = res.json["error"]
    assert list(error) == ["code", "message", "type"]
    assert error["type"] == "invalid_request_error"
    assert message in error["message"]


def test_body_must_be_an_object(client):
    res = client.simulate_post("/embeddings", body=b'["x"]')
    assert res.status_code == 400
    assert res.json["error"]["type"] == "invalid_request_error"


def test_input_or_content_required(client):
    res = client.simulate_post("/v1/embeddings", json={"foo": 1})
    assert res.status_code == 400
    assert res.text == '{"error":{"code":400,"message":"\\"input\\" or \\"content\\" must be provided",' \
                       '"type":"invalid_request_error"}}'


@pytest.mark.parametrize("value", ["int4", "INT8", "", 5, None, ["float"]])
def test_encoding_format_must_be_float_or_base64(client, value):
    res = client.simulate_post("/v1/embeddings", json={"input": "x", "encoding_format": value})
    assert res.status_code == 400
    assert res.text == handler_error(400, "The format to return the embeddings in. Can be either float or base64",
                                     "invalid_request_error")


@pytest.mark.parametrize("value", ["2", None, True, 1.5, [2]])
def test_embd_normalize_must_be_an_integer(client, value):
    res = client.simulate_post("/embeddings", json={"input": "x", "embd_normalize": value})
    assert res.status_code == 400
    assert res.json["error"] == {"code": 400, "message": '"embd_normalize" must be an integer',
                                 "type": "invalid_request_error"}


def test_truncate_is_passed_through_and_validated(make_client):
    engine = FakeEngine()
    client = make_client("--embedding", "--timeout", "77", engine=engine)
    client.simulate_post("/v1/embeddings", json={"input": "x"})
    assert engine.embed_calls[-1]["truncate"] is None
    assert 76 < engine.embed_calls[-1]["timeout_s"] <= 77  # what is left of the request's -to deadline
    client.simulate_post("/v1/embeddings", json={"input": "x", "truncate": True})
    assert engine.embed_calls[-1]["truncate"] is True
    res = client.simulate_post("/v1/embeddings", json={"input": "x", "truncate": "yes"})
    assert res.status_code == 400
    assert res.json["error"]["message"] == '"truncate" must be a boolean'


# ---------------------------------------------------------------- embeddings: input shapes (§3.2)

A, B, HELLO = word_id("a"), word_id("b"), word_id("hello")


@pytest.mark.parametrize("value,token_lists", [
    ("", [[CLS, SEP]]),
    ("hello", [[CLS, HELLO, SEP]]),
    ([12, 34, 56], [[12, 34, 56]]),
    ([12, 34, "hello", 56, 78], [[12, 34, HELLO, 56, 78]]),
    (["a", 1, "b"], [[CLS, A, SEP, 1, B]]),
    (["a", "b"], [[CLS, A, SEP], [CLS, B, SEP]]),
    (["a", [12, 34, 56]], [[CLS, A, SEP], [12, 34, 56]]),
    ([[12, 34, 56], [12, 34, 56]], [[12, 34, 56], [12, 34, 56]]),
    ([[12, 34, 56], [12, "hello", 34, 56]], [[12, 34, 56], [12, HELLO, 34, 56]]),
    ([["hello", 7], "a"], [[CLS, HELLO, SEP, 7], [CLS, A, SEP]]),
    ({"prompt_string": "hello"}, [[CLS, HELLO, SEP]]),
    ([{"prompt_string": "a", "multimodal_data": []}, "b"], [[CLS, A, SEP], [CLS, B, SEP]]),
])
def test_input_shapes_split_into_prompts(make_client, value, token_lists):
    engine = FakeEngine()
    client = make_client("--embedding", engine=engine)
    res = client.simulate_post("/v1/embeddings", json={"input": value})
    assert res.status_code == 200, res.text
    assert engine.embed_calls[-1]["token_lists"] == token_lists
    assert all(call["add_special"] and call["parse_special"] for call in engine.encode_calls)
    assert [item["index"] for item in res.json["data"]] == list(range(len(token_lists)))


ELEMENTS = ('"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt string, '
            'or a list of mixed strings & tokens.')


@pytest.mark.parametrize("value,message", [
    ([], '"prompt" must not be empty'),
    (None, ELEMENTS), (5, ELEMENTS), (1.5, ELEMENTS), (True, ELEMENTS),
    ([1.5], ELEMENTS), ([True], ELEMENTS), ([None], ELEMENTS), (["a", None], ELEMENTS), ([1, 2.5], ELEMENTS),
    ([[1.5]], ELEMENTS), ([1, [2]], ELEMENTS), ([["a", ["b"]]], ELEMENTS), ([[False]], ELEMENTS),
    ({"prompt_string": 5}, ELEMENTS), ({"text": "a"}, ELEMENTS),
    ({"prompt_string": "x", "multimodal_data": ["AAAA"]},
     "Multimodal data provided, but model does not support multimodal requests."),
    (["a", {"prompt_string": "x", "multimodal_data": ["AAAA"]}],
     "Multimodal data provided, but model does not support multimodal requests."),
])
def test_bad_inputs_are_400(client, value, message):
    for path, field in (("/v1/embeddings", "input"), ("/embedding", "content")):
        res = client.simulate_post(path, json={field: value})
        assert (res.status_code, res.text) == (400, handler_error(400, message, "invalid_request_error"))


def test_input_wins_over_content(make_client):
    engine = FakeEngine()
    res = make_client("--embedding", engine=engine).simulate_post(
        "/v1/embeddings", json={"input": "a", "content": "hello"})
    assert engine.embed_calls[-1]["token_lists"] == [[CLS, A, SEP]]
    assert res.json["object"] == "list"


# ---------------------------------------------------------------- embeddings: response shapes (§3.3, §3.4)


@pytest.mark.parametrize("path,field", [("/embedding", "content"), ("/embeddings", "input"),
                                        ("/embeddings", "content"), ("/v1/embeddings", "content")])
def test_llama_shape_nests_pooled_vectors(client, path, field):
    res = client.simulate_post(path, json={field: ["a", "hello"], "encoding_format": "base64"})
    assert res.status_code == 200
    body = res.json
    assert isinstance(body, list) and len(body) == 2
    for i, (item, ids) in enumerate(zip(body, ([CLS, A, SEP], [CLS, HELLO, SEP]), strict=True)):
        assert list(item) == ["index", "embedding"]
        assert item["index"] == i
        assert len(item["embedding"]) == 1  # one level deeper than OAI, base64 ignored
        np.testing.assert_allclose(item["embedding"][0], llama_normalize(pooled_vector(ids), 2), rtol=1e-6)
    assert res.text.startswith('[{"index":0,"embedding":[[')


def test_oai_shape_usage_and_key_order(client):
    res = client.simulate_post("/v1/embeddings", json={"input": ["a", "hello", [5, 6, 7, 8]], "model": "x"})
    assert res.status_code == 200
    body = res.json
    assert list(body) == ["model", "object", "usage", "data"]
    assert body["model"] == "x"
    assert body["object"] == "list"
    assert body["usage"] == {"prompt_tokens": 10, "total_tokens": 10}
    assert list(body["usage"]) == ["prompt_tokens", "total_tokens"]
    for i, item in enumerate(body["data"]):
        assert list(item) == ["embedding", "index", "object"]
        assert (item["index"], item["object"]) == (i, "embedding")
    np.testing.assert_allclose(body["data"][2]["embedding"], llama_normalize(pooled_vector([5, 6, 7, 8]), 2),
                               rtol=1e-6)


@pytest.mark.parametrize("model,expected", [("x", "x"), ("", ""), (None, "alias-b"), (5, "alias-b"),
                                            (["x"], "alias-b")])
def test_model_echo(make_client, model, expected):
    client = make_client("--embedding", "--alias", "alias-c,alias-b")
    body = {"input": "a"} if model is None else {"input": "a", "model": model}
    assert client.simulate_post("/v1/embeddings", json=body).json["model"] == expected


def test_model_defaults_to_the_server_model_name(client):
    assert client.simulate_post("/v1/embeddings", json={"input": "a"}).json["model"] == DEFAULT_NAME


def test_base64_round_trips_to_the_float_vector(client):
    floats = client.simulate_post("/v1/embeddings", json={"input": ["a", "hello"]}).json["data"]
    res = client.simulate_post("/v1/embeddings", json={"input": ["a", "hello"], "encoding_format": "base64"})
    assert res.status_code == 200
    for item, float_item in zip(res.json["data"], floats, strict=True):
        assert list(item) == ["embedding", "index", "object", "encoding_format"]
        assert item["encoding_format"] == "base64"
        raw = base64.b64decode(item["embedding"], validate=True)
        assert len(item["embedding"]) % 4 == 0
        decoded = np.frombuffer(raw, dtype="<f4")
        assert decoded.tolist() == float_item["embedding"]  # float32 widened to double, exactly
    for item, ids in zip(res.json["data"], ([CLS, A, SEP], [CLS, HELLO, SEP]), strict=True):
        expected = llama_normalize(pooled_vector(ids), 2)
        np.testing.assert_allclose(np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4"), expected,
                                   rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("p", [-1, 0, 1, 2, 3, -2, 5])
def test_embd_normalize_matches_llama_formulas(client, p):
    res = client.simulate_post("/embeddings", json={"input": ["a b", "hello"], "embd_normalize": p})
    assert res.status_code == 200
    for item, ids in zip(res.json, ([CLS, A, B, SEP], [CLS, HELLO, SEP]), strict=True):
        expected = llama_normalize(pooled_vector(ids), p)
        np.testing.assert_allclose(item["embedding"][0], expected, rtol=2e-6, atol=1e-7)
    if p == 0:
        assert max(abs(v) for v in res.json[0]["embedding"][0]) == pytest.approx(32760.0)


def test_server_default_normalization(make_client):
    client = make_client("--embedding", "--embd-normalize", "1")
    vector = client.simulate_post("/v1/embeddings", json={"input": "hello"}).json["data"][0]["embedding"]
    assert sum(abs(v) for v in vector) == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_allclose(vector, llama_normalize(pooled_vector([CLS, HELLO, SEP]), 1), rtol=1e-6)


@pytest.mark.parametrize("p", [-1, 0, 1, 2, 3])
def test_zero_vector_stays_zero(make_client, p):
    engine = FakeEngine()
    engine.fixed_vector = np.zeros(4, dtype=np.float32)
    res = make_client("--embedding", engine=engine).simulate_post(
        "/v1/embeddings", json={"input": "a", "embd_normalize": p})
    assert res.json["data"][0]["embedding"] == [0.0, 0.0, 0.0, 0.0]


def test_floats_print_as_widened_float32_and_nan_as_null(make_client):
    engine = FakeEngine()
    engine.fixed_vector = np.array([0.1, np.nan, np.inf, -3.3], dtype=np.float32)
    res = make_client("--embedding", engine=engine).simulate_post(
        "/embedding", json={"content": "a", "embd_normalize": -1})
    # repr(float(np.float32(x))): llama's nlohmann prints the widened double the same way
    assert res.text == '[{"index":0,"embedding":[[0.10000000149011612,null,null,-3.299999952316284]]}]'


def test_pooling_none_returns_raw_rows_per_token(make_client):
    client = make_client("--embedding", engine=FakeEngine(pooling=Pooling.NONE))
    res = client.simulate_post("/embeddings", json={"input": ["hello hello hello", "a"], "embd_normalize": 2})
    assert res.status_code == 200
    first = res.json[0]["embedding"]
    assert len(first) == 5  # [CLS] + 3 words + [SEP]
    ids = [CLS, HELLO, HELLO, HELLO, SEP]
    assert first == token_rows(ids).astype(np.float64).tolist()  # not normalized
    assert len(res.json[1]["embedding"]) == 3


# ---------------------------------------------------------------- engine errors


@pytest.mark.parametrize("value,status,message", [
    ([[]], 400, "Input content cannot be empty"),
    ([5000], 400, "Prompt contains invalid tokens"),
    ([-1, 5], 400, "Prompt contains invalid tokens"),
])
def test_engine_input_errors(client, value, status, message):
    res = client.simulate_post("/v1/embeddings", json={"input": value})
    assert (res.status_code, res.text) == (status, handler_error(status, message, "invalid_request_error"))


@pytest.mark.parametrize("kind,message", [
    ("ubatch", "input (20 tokens) is too large to process. increase the physical batch size (current batch size: 16)"),
    ("positions", "input (20 tokens) is too large to process. the model accepts at most 16 tokens"),
])
def test_input_too_long_keeps_llama_wording_as_400(make_client, kind, message):
    client = make_client("--embedding", engine=FakeEngine(max_input_tokens=16, limit_kind=kind))
    res = client.simulate_post("/v1/embeddings", json={"input": " ".join(["w"] * 18)})
    assert (res.status_code, res.text) == (400, handler_error(400, message, "invalid_request_error"))
    assert "too large" in res.json["error"]["message"]


def test_input_longer_than_the_context_is_exceed_context_size(make_client):
    client = make_client("--embedding", engine=FakeEngine(max_input_tokens=16, limit_kind="context"))
    res = client.simulate_post("/embeddings", json={"input": list(range(1, 21))})
    assert res.status_code == 400
    assert res.text == ('{"error":{"code":400,"message":"input (20 tokens) is larger than the max context size '
                        '(16 tokens). skipping","type":"exceed_context_size_error","n_prompt_tokens":20,'
                        '"n_ctx":16}}')


@pytest.mark.parametrize("exc,status,kind,message", [
    (QueueFull("queue is full"), 503, "unavailable_error", "queue is full"),
    (TooManyInputs(5000, 4096), 413, "invalid_request_error",
     "this request has 5000 inputs; the engine queue holds at most 4096 (--max-queue-items)"),
    (OutOfMemory("out of memory; batches are now capped at 2 rows"), 500, "server_error",
     "out of memory; batches are now capped at 2 rows"),
    (ReplyTimeout("timed out"), 504, "timeout_error", "timed out"),
    (ForwardFailed("metal said no"), 500, "server_error", "metal said no"),
    (NotLoaded(), 503, "unavailable_error", "Loading model"),
    (UnsupportedCheckpoint("no such head"), 501, "not_supported_error", "no such head"),
    (EngineError("odd"), 500, "server_error", "odd"),
])
def test_engine_errors_are_mapped(make_client, exc, status, kind, message):
    engine = FakeEngine()
    engine.raise_on_embed = exc
    res = make_client("--embedding", engine=engine).simulate_post("/v1/embeddings", json={"input": "a"})
    assert (res.status_code, res.text) == (status, handler_error(status, message, kind))
    assert res.headers.get("Retry-After") == ("1" if status == 503 else None)  # only transient errors say retry


def test_unexpected_exception_is_500_without_leaks_and_the_server_keeps_serving(make_client, caplog):
    engine = FakeEngine()
    engine.raise_on_embed = RuntimeError("secret internal detail")
    client = make_client("--embedding", engine=engine)
    res = client.simulate_post("/v1/embeddings", json={"input": "a"})
    assert res.status_code == 500
    assert list(res.json["error"]) == ["code", "message", "type"]
    assert res.json["error"]["type"] == "server_error"
    assert "secret" not in res.text and "Traceback" not in res.text
    assert "secret internal detail" in caplog.text and "Traceback" in caplog.text  # logged instead
    engine.raise_on_embed = None
    assert client.simulate_post("/v1/embeddings", json={"input": "a"}).status_code == 200


def test_timing_headers_on_embeddings_only(client):
    res = client.simulate_post("/v1/embeddings", json={"input": "a"})
    assert res.headers["x-queue-time"] == "2"
    assert res.headers["x-inference-time"] == "12"
    assert int(res.headers["x-tokenization-time"]) >= 0
    assert int(res.headers["x-total-time"]) >= 0
    assert "x-total-time" not in client.simulate_get("/health").headers


# ---------------------------------------------------------------- /tokenize, /detokenize


def test_tokenize_defaults_and_options(make_client):
    engine = FakeEngine()
    client = make_client(engine=engine)
    assert client.simulate_post("/tokenize", json={"content": "a hello"}).text == '{"tokens":[%d,%d]}' % (A, HELLO)
    assert engine.encode_calls[-1] == {"parts": ["a hello"], "add_special": False, "parse_special": True}
    res = client.simulate_post("/tokenize", json={"content": "a", "add_special": True, "parse_special": False})
    assert res.json == {"tokens": [CLS, A, SEP]}
    assert engine.encode_calls[-1]["parse_special"] is False
    assert client.simulate_post("/tokenize", json={"content": [7, "a"]}).json == {"tokens": [7, A]}
    assert client.simulate_post("/tokenize", json={}).text == '{"tokens":[]}'


def test_tokenize_with_pieces(client):
    res = client.simulate_post("/tokenize", json={"content": [7, "hello"], "with_pieces": True})
    assert res.text == '{"tokens":[{"id":7,"piece":[226,130]},{"id":%d,"piece":" hello"}]}' % HELLO


def test_tokenize_bad_content_is_400(client):
    res = client.simulate_post("/tokenize", json={"content": 5})
    assert res.status_code == 400
    assert res.json["error"]["message"] == ELEMENTS


def test_detokenize(client):
    ids = client.simulate_post("/tokenize", json={"content": "hello a", "add_special": True}).json["tokens"]
    assert client.simulate_post("/detokenize", json={"tokens": ids}).json == {"content": "[CLS] hello a [SEP]"}
    assert client.simulate_post("/detokenize", json={}).text == '{"content":""}'
    for bad in ("x", [1.5], [None], None):
        res = client.simulate_post("/detokenize", json={"tokens": bad})
        assert res.status_code == 400, bad
        assert res.json["error"]["type"] == "invalid_request_error"


# ---------------------------------------------------------------- /props


PARAMS_KEYS = [
    "seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p", "top_n_sigma",
    "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n", "repeat_penalty", "presence_penalty",
    "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "mirostat",
    "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay", "max_tokens", "n_predict", "n_keep",
    "n_discard", "ignore_eos", "stream", "n_probs", "min_keep", "chat_format", "reasoning_format",
    "reasoning_in_content", "generation_prompt", "samplers", "speculative.types", "timings_per_token",
    "post_sampling_probs", "backend_sampling", "lora",
]


def test_props_shape_and_values(make_client):
    res = make_client("--alias", "bge", "--metrics", "--no-slots").simulate_get("/props")
    assert res.status_code == 200
    body = res.json
    assert list(body) == ["default_generation_settings", "total_slots", "model_alias", "model_ftype", "model_path",
                          "modalities", "endpoint_slots", "endpoint_props", "endpoint_metrics", "ui",
                          "chat_template", "bos_token", "eos_token", "build_info", "is_sleeping",
                          "cors_proxy_enabled", "family", "weights", "resident_bytes", "kernels", "max_seq", "rows", "batch_tokens", "widths", "prompts",
                          "default_prompt_name", "instruction_template", "chat_template_inputs", "dimensions",
                          "input_modalities", "multi_vector"]
    assert list(body["default_generation_settings"]) == ["params", "n_ctx"]
    assert list(body["default_generation_settings"]["params"]) == PARAMS_KEYS
    assert body["default_generation_settings"]["n_ctx"] == 256
    assert body["default_generation_settings"]["params"]["top_k"] == 40
    assert (body["total_slots"], body["model_alias"], body["model_ftype"]) == (2, "bge", "F32")
    assert body["model_path"] == "/models/fake-minilm"
    assert body["modalities"] == {"vision": False, "video": False, "audio": False}
    assert (body["endpoint_slots"], body["endpoint_props"], body["endpoint_metrics"]) == (False, False, True)
    assert (body["bos_token"], body["eos_token"]) == ("[CLS]", "[SEP]")
    assert body["build_info"].startswith("mlx-embed-server-")
    assert body["is_sleeping"] is False
    assert (body["max_seq"], body["rows"], body["batch_tokens"], body["widths"]) == (16, 16, 4096, [8, 16, 512])
    assert body["family"] == "bert"
    assert (body["weights"], body["resident_bytes"]) == ("float32", 90868376)
    assert (body["prompts"], body["default_prompt_name"], body["instruction_template"]) == ({}, None, None)
    assert body["dimensions"] == {"min": 1, "max": 4}


@pytest.mark.parametrize(("argv", "seed"), [((), 4294967295), (("--seed", "42"), 42), (("-s", "-1"), 4294967295)])
def test_props_report_the_seed(make_client, argv, seed):
    # llama.cpp's test_server_props starts the server with --seed 42 and reads it back here
    params = make_client(*argv).simulate_get("/props").json["default_generation_settings"]["params"]
    assert params["seed"] == seed and list(params) == PARAMS_KEYS


def test_post_props(make_client):
    res = make_client().simulate_post("/props", json={})
    assert res.status_code == 501
    assert res.text == handler_error(501, "This server does not support changing global properties. Start it with "
                                          "`--props`", "not_supported_error")
    assert make_client("--props").simulate_post("/props", json={}).text == '{"success":true}'


# ---------------------------------------------------------------- /models, /slots


@pytest.mark.parametrize("path", ["/models", "/v1/models"])
def test_models_shape(make_client, path):
    before = int(time.time())
    body = make_client("--alias", "zeta,alpha", "--tags", "small,embed").simulate_get(path).json
    assert list(body) == ["models", "object", "data"]
    ollama = body["models"][0]
    assert list(ollama) == ["name", "model", "modified_at", "size", "digest", "type", "description", "tags",
                            "capabilities", "parameters", "details"]
    assert (ollama["name"], ollama["model"], ollama["capabilities"]) == ("alpha", "alpha", ["embedding"])
    assert list(ollama["details"]) == ["parent_model", "format", "family", "families", "parameter_size",
                                       "quantization_level"]
    (model,) = body["data"]
    assert list(model) == ["id", "aliases", "tags", "object", "created", "owned_by", "meta"]
    assert model["id"] == "alpha"
    assert model["aliases"] == ["alpha", "zeta"]
    assert model["tags"] == ["embed", "small"]
    assert (model["object"], model["owned_by"]) == ("model", "llamacpp")
    assert before <= model["created"] <= int(time.time())
    assert model["meta"] == {"vocab_type": 3, "n_vocab": 1000, "n_ctx": 256, "n_ctx_train": 512, "n_embd": 4,
                             "n_params": 22713216, "size": 90868376, "ftype": "F32", "weights": "float32",
                             "resident_bytes": 90868376, "prompts": [],
                             "default_prompt_name": None, "instruction_template": None,
                             "chat_template_inputs": False, "dimensions": {"min": 1, "max": 4},
                             "input_modalities": ["text"], "multi_vector": False}
    assert list(model["meta"]) == ["vocab_type", "n_vocab", "n_ctx", "n_ctx_train", "n_embd", "n_params", "size",
                                   "ftype", "weights", "resident_bytes", "prompts", "default_prompt_name", "instruction_template",
                                   "chat_template_inputs", "dimensions", "input_modalities", "multi_vector"]


def test_models_without_alias_lists_the_model_name(make_client):
    model = make_client().simulate_get("/v1/models").json["data"][0]
    assert (model["id"], model["aliases"], model["tags"]) == (DEFAULT_NAME, [DEFAULT_NAME], [])


def test_slots(make_client):
    engine = FakeEngine()
    engine.processing = 1
    res = make_client(engine=engine).simulate_get("/slots")
    assert res.text == ('[{"id":0,"n_ctx":256,"speculative":false,"is_processing":true},'
                        '{"id":1,"n_ctx":256,"speculative":false,"is_processing":false}]')
    res = make_client("--no-slots").simulate_get("/slots")
    assert (res.status_code, res.text) == (501, handler_error(
        501, "This server does not support slots endpoint. Start it with `--slots`", "not_supported_error"))


# ---------------------------------------------------------------- /metrics

METRIC_NAMES = [
    ("prompt_tokens_total", "counter"), ("prompt_tokens_cached_total", "counter"),
    ("prompt_seconds_total", "counter"), ("tokens_predicted_total", "counter"),
    ("tokens_predicted_seconds_total", "counter"), ("n_decode_total", "counter"), ("n_tokens_max", "counter"),
    ("spec_decode_num_draft_tokens_total", "counter"), ("spec_decode_num_accepted_tokens_total", "counter"),
    ("spec_decode_num_drafts_total", "counter"), ("prompt_tokens_seconds", "gauge"),
    ("predicted_tokens_seconds", "gauge"), ("requests_processing", "gauge"), ("requests_deferred", "gauge"),
    ("n_busy_slots_per_decode", "gauge"),
]


def scrape(client) -> dict[str, str]:
    res = client.simulate_get("/metrics")
    assert res.status_code == 200
    return parse_metrics(res.text)


def test_metrics_disabled_is_501(make_client):
    res = make_client().simulate_get("/metrics")
    assert (res.status_code, res.text) == (501, handler_error(
        501, "This server does not support metrics endpoint. Start it with `--metrics`", "not_supported_error"))


def test_metrics_text_format(make_client):
    res = make_client("--metrics").simulate_get("/metrics")
    assert res.headers["content-type"] == "text/plain; version=0.0.4"
    assert abs(int(res.headers["process-start-time-unix"]) - time.time()) < 60
    lines = res.text.splitlines()
    assert res.text.endswith("\n")
    # llama's metrics, in its order, then ours (in flight, draining)
    assert len(lines) == 3 * len(METRIC_NAMES) + 6
    assert lines[3 * len(METRIC_NAMES):] == [
        "# HELP mlx_embed:requests_in_flight HTTP requests being handled now, every route.",
        "# TYPE mlx_embed:requests_in_flight gauge", "mlx_embed:requests_in_flight 0",
        "# HELP mlx_embed:draining 1 after SIGTERM/SIGINT while requests in flight finish.",
        "# TYPE mlx_embed:draining gauge", "mlx_embed:draining 0"]
    for i, (name, kind) in enumerate(METRIC_NAMES):
        help_line, type_line, value_line = lines[3 * i: 3 * i + 3]
        assert help_line.startswith(f"# HELP llamacpp:{name} ") and len(help_line) > len(f"# HELP llamacpp:{name} ")
        assert type_line == f"# TYPE llamacpp:{name} {kind}"
        assert value_line.startswith(f"llamacpp:{name} ")


def test_metrics_count_embedding_work_and_throughput_since_last_scrape(make_client):
    engine = FakeEngine()
    client = make_client("--embedding", "--metrics", engine=engine)
    client.simulate_post("/v1/embeddings", json={"input": ["a", "hello"]})  # 6 tokens, 0.5 s in the fake
    values = scrape(client)
    assert values["llamacpp:prompt_tokens_total"] == "6"
    assert values["llamacpp:prompt_seconds_total"] == "0.5"
    assert values["llamacpp:n_decode_total"] == "1"
    assert values["llamacpp:prompt_tokens_seconds"] == "12"
    assert values["llamacpp:tokens_predicted_total"] == "0"
    assert values["llamacpp:requests_deferred"] == "3"
    assert scrape(client)["llamacpp:prompt_tokens_seconds"] == "0"  # nothing new since the last scrape
    client.simulate_post("/v1/embeddings", json={"input": "a b c d"})  # 6 more tokens, 0.5 s more
    assert scrape(client)["llamacpp:prompt_tokens_seconds"] == "12"


# ---------------------------------------------------------------- routes this server does not serve


@pytest.mark.parametrize("path", ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/v2/rerank"])
def test_rerank_routes_answer_not_enabled(client, path):
    res = client.simulate_post(path, json={"query": "q", "documents": ["a"]})
    assert (res.status_code, res.text) == (501, handler_error(
        501, "This server does not support reranking. Start it with `--reranking`", "not_supported_error"))


@pytest.mark.parametrize("path", ["/completion", "/completions", "/v1/completions", "/chat/completions",
                                  "/v1/chat/completions", "/infill", "/v1/responses", "/v1/messages",
                                  "/apply-template"])
def test_generation_routes_say_they_are_not_served(client, path):
    res = client.simulate_post(path, json={"prompt": "hi"})
    assert (res.status_code, res.text) == (501, handler_error(
        501, f"This server serves embeddings and reranking only; {path} is not available", "not_supported_error"))


@pytest.mark.parametrize("origin, allowed", [("https://a.example", "https://a.example"),
                                             ("https://b.example", "https://b.example"), ("https://evil.example", None)])
def test_cors_origin_list_reflects_only_listed_origins(make_client, origin, allowed):
    res = make_client("--cors-origins", "https://a.example, https://b.example").simulate_get(
        "/health", headers={"Origin": origin})
    assert res.headers.get("Access-Control-Allow-Origin") == allowed
