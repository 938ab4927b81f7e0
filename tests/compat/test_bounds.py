"""Bounded input and the drain, through falcon's TestClient over a fake engine: what is refused, with which status
and message, and that the server keeps serving afterwards."""
from __future__ import annotations

import base64
import json
import threading
import time

import orjson
import pytest
from falcon.testing import TestClient

import compat.media
import compat.wire.inputs
import compat.wire.rerank
from compat.app import create_app
from compat.lifecycle import ARRIVED_KEY, Lifecycle
from compat.settings import parse_settings
from compat.errors import ApiError
from compat.wire.inputs import MAX_JSON_DEPTH, TOO_DEEP, parse_json_object
from tests.compat.fakes import FakeEngine
from tests.compat.test_routing import GatedEngine, Server
from tests.conftest import parse_metrics

SHUTTING_DOWN = {"error": {"message": "Server is shutting down", "type": "unavailable_error", "code": 503}}


def test_a_content_length_over_the_payload_limit_is_413_in_the_envelope(make_client):
    client = make_client("--embedding", "--payload-limit", "1000")
    res = client.simulate_post("/v1/embeddings", body='{"input": "' + "x" * 1000 + '"}')
    assert res.status_code == 413
    assert res.json == {"error": {"message": "the request body is larger than the server accepts (1000 bytes, "
                                             "--payload-limit)", "type": "invalid_request_error", "code": 413}}
    assert client.simulate_post("/v1/embeddings", json={"input": "x" * 900}).status_code == 200


def test_the_default_payload_limit_refuses_64_mib(make_client):
    client = make_client("--embedding")
    res = client.simulate_post("/v1/embeddings", body=b"[" * (64 << 20))
    assert res.status_code == 413 and "2000000 bytes" in res.json["error"]["message"]


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 5000])
def test_json_nesting_is_bounded(make_client, depth):
    client = make_client("--embedding")
    body = '{"input": "x", "extra": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"
    res = client.simulate_post("/v1/embeddings", body=body)
    if depth <= MAX_JSON_DEPTH:
        assert res.status_code == 200  # deep but within the bound: an unknown field is ignored
    else:
        assert res.status_code == 400
        assert res.json["error"]["type"] == "invalid_request_error"
        assert "deep" in res.json["error"]["message"] or "depth" in res.json["error"]["message"]
    assert client.simulate_post("/v1/embeddings", json={"input": "x"}).status_code == 200


def _nesting(value: object) -> int:
    """The reference: levels of arrays/objects in a parsed value."""
    if isinstance(value, (list, dict)):
        return 1 + max(map(_nesting, value.values() if isinstance(value, dict) else value), default=0)
    return 0


def _at_depth(value: object, depth: int) -> dict:
    """A body whose nesting is `depth`: value under an object, under lists."""
    body: object = value
    for _ in range(depth - 1 - _nesting(value)):
        body = [body]
    return {"x": body}


@pytest.mark.parametrize("value", [1, "s", [], {}, {"a": [1, 2]}, {"a": [[1], [2, {"b": [3]}]]},
                                   # brackets and quotes inside strings, escaped quotes and backslashes
                                   {"[[[": "{{{", "a": ["]]]", "\\", "\\[", '\"[', '"', "\\\"{{"], "b": {"c": []}},
                                   ["\\", ["\\\\\"]]", [[]]], "é[ü"], "]" * 40, "[" * 40])
def test_the_nesting_bound_counts_levels_of_the_text(value):
    # exactly MAX_JSON_DEPTH levels parse, one more is refused; the text as clients send it: compact, indented,
    # or with non-ASCII escaped
    for depth, fits in ((MAX_JSON_DEPTH, True), (MAX_JSON_DEPTH + 1, False)):
        body = _at_depth(value, depth)
        assert _nesting(body) == depth
        for text in (orjson.dumps(body), json.dumps(body, indent=2).encode(), json.dumps(body)):
            if fits:
                assert parse_json_object(text) == body
            else:
                with pytest.raises(ApiError) as caught:
                    parse_json_object(text)
                assert (caught.value.status, caught.value.message) == (400, TOO_DEEP)


@pytest.mark.parametrize("raw", [b"", b" ", b"1, 2", b"] [", b"{}, {}", b"{}] [{}", b'{"a": 1}]', b"[" * 5000,
                                 b"[" * 40 + b"]" * 40, b'"s"', b"{"])
def test_a_body_that_is_no_json_object_alone_is_refused_as_parsing_it_alone_says(raw):
    # the body is parsed inside arrays (orjson's depth limit bounds it): what is valid only once wrapped stays
    # refused, with the message parsing the body alone gives
    try:
        alone = orjson.loads(raw)
        expected = "The request body must be a JSON object"
    except orjson.JSONDecodeError as exc:
        alone, expected = None, str(exc)
    assert not isinstance(alone, dict)
    with pytest.raises(ApiError) as caught:
        parse_json_object(raw)
    assert (caught.value.status, caught.value.message) == (400, expected)


def test_the_nesting_bound_is_orjsons_own_parse(monkeypatch):
    """A valid body within the bound is parsed once, by orjson, and nothing walks or scans it after: the bound
    costs one copy of the body (benchmarks/body_depth.py measures it; a byte scan cost 5-9x the parse)."""
    raw = orjson.dumps({"input": ['a "quoted" [bracketed] {braced} text with a \\ and a\nnewline ' * 6] * 400})
    calls = []
    real = orjson.loads
    monkeypatch.setattr(compat.wire.inputs.orjson, "loads", lambda data: calls.append(len(data)) or real(data))
    assert parse_json_object(raw) == real(raw)
    assert len(calls) == 1 and calls[0] < len(raw) + 2 * MAX_JSON_DEPTH * 64  # the body, wrapped, once
    assert not hasattr(compat.wire.inputs, "json_depth")  # no scan of the bytes beside it


def test_a_body_with_few_brackets_is_parsed_alone(monkeypatch):
    """A body holding at most MAX_JSON_DEPTH brackets cannot nest deeper: one parse of the body alone, unwrapped
    (the wrapped parse's thousand arrays cost ~1 ms, most of a short request's time outside its pass)."""
    raw = orjson.dumps({"input": "a short text", "model": "m", "extra": [[1, {"a": [2]}]]})
    calls = []
    real = orjson.loads
    monkeypatch.setattr(compat.wire.inputs.orjson, "loads", lambda data: calls.append(data) or real(data))
    assert parse_json_object(raw) == real(raw)
    assert calls == [raw]
    calls.clear()
    big = orjson.dumps({"input": ["word " * 200] * 100})  # few brackets, but too big to count: wrapped
    assert len(big) > compat.wire.inputs._COUNTED_BYTES and parse_json_object(big) == real(big)
    assert len(calls) == 1 and len(calls[0]) > len(big)


def _draining_client(*argv: str) -> tuple[TestClient, Lifecycle]:
    lifecycle = Lifecycle()
    settings = parse_settings(["--embedding", *argv], {}, system_config_files=[])
    return TestClient(create_app(settings, FakeEngine(), lifecycle)), lifecycle


def test_while_draining_health_and_newcomers_get_503_and_admitted_requests_are_served():
    client, lifecycle = _draining_client("--api-prefix", "/api")
    before = time.monotonic()
    assert client.simulate_get("/api/health").status_code == 200
    assert lifecycle.begin_drain() and not lifecycle.begin_drain()  # a second signal does not restart it
    for path in ("/api/health", "/api/v1/health"):
        res = client.simulate_get(path)
        assert (res.status_code, res.json, res.headers["Retry-After"]) == (503, SHUTTING_DOWN, "1")
    late = client.simulate_post("/api/v1/embeddings", json={"input": "x"}, extras={ARRIVED_KEY: time.monotonic()})
    assert (late.status_code, late.json) == (503, SHUTTING_DOWN)
    owed = client.simulate_post("/api/v1/embeddings", json={"input": "x"}, extras={ARRIVED_KEY: before})
    assert owed.status_code == 200 and len(owed.json["data"]) == 1
    assert lifecycle.in_flight == 0  # every request was counted out again, refused ones included


def test_more_inputs_than_the_client_batch_size_is_413_naming_the_limit(make_client):
    client = make_client("--embedding", "--max-client-batch-size", "3")
    res = client.simulate_post("/v1/embeddings", json={"input": ["a", "b", "c", "d"]})
    assert res.status_code == 413
    assert res.json == {"error": {"code": 413, "message": "this request has 4 inputs; the server accepts at most 3 "
                                                          "per request (--max-client-batch-size)",
                                  "type": "invalid_request_error"}}
    assert client.simulate_post("/embedding", json={"content": ["a", "b", "c"]}).status_code == 200
    assert client.simulate_post("/v1/embeddings", json={"input": [1, 2, 3, 4, 5]}).status_code == 200  # one prompt


def test_more_documents_than_the_client_batch_size_is_413(make_client):
    client = make_client("--reranking", "--max-client-batch-size", "2", engine=FakeEngine(kind="cross-encoder"))
    for path, body in (("/rerank", {"query": "q", "documents": ["a", "b", "c"]}),
                       ("/v2/rerank", {"query": "q", "documents": ["a", "b", "c"]}),
                       ("/rerank", {"query": "q", "texts": ["a", "b", "c"]})):
        res = client.simulate_post(path, json=body)
        assert res.status_code == 413 and "3 documents; the server accepts at most 2" in res.json["error"]["message"]
    assert client.simulate_post("/rerank", json={"query": "q", "documents": ["a", "b"]}).status_code == 200


def test_more_inputs_than_the_engine_queue_holds_is_413_before_any_work(make_client):
    engine = FakeEngine(max_queue_items=2)
    engine.format_prompts = engine.embed_prompts = None  # called, they would raise: the count is checked first
    res = make_client("--embedding", engine=engine).simulate_post("/v1/embeddings", json={"input": ["a", "b", "c"]})
    assert (res.status_code, res.json["error"]["message"]) == (
        413, "this request has 3 inputs; the engine queue holds at most 2 (--max-queue-items)")


PNG_URL = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40).decode()
IMAGE_PART = {"type": "image_url", "image_url": {"url": PNG_URL}}
BROKEN = {"prompt_string": 5}  # refused by the parser (400), if it ever gets to it


def _counting(monkeypatch, module, name: str) -> list:
    """Calls of module.name, recorded (it still runs)."""
    calls, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args, **kwargs: calls.append(args) or real(*args, **kwargs))
    return calls


@pytest.mark.parametrize(("argv", "engine_kw", "message"), [
    (("--max-client-batch-size", "3"), {}, "this request has 4 inputs; the server accepts at most 3"),
    ((), {"max_queue_items": 3}, "this request has 4 inputs; the engine queue holds at most 3"),
])
def test_the_input_count_is_checked_on_the_raw_list_before_any_input_is_read(make_client, monkeypatch, argv,
                                                                              engine_kw, message):
    engine = FakeEngine(modalities=("text", "image"), **engine_kw)
    client = make_client("--embedding", *argv, engine=engine)
    parsed = _counting(monkeypatch, compat.wire.inputs, "_subprompt")
    fetched = _counting(monkeypatch, compat.media, "load")
    for path, body in (("/v1/embeddings", {"input": ["a", [IMAGE_PART], "c", BROKEN]}),
                       ("/embedding", {"content": [IMAGE_PART, IMAGE_PART, IMAGE_PART, BROKEN]})):
        res = client.simulate_post(path, json=body)
        assert (res.status_code, res.json["error"]["message"].startswith(message)) == (413, True), res.json
    assert (parsed, fetched, engine.encode_calls, engine.embed_calls) == ([], [], [], [])
    # a list holding a token id is one prompt, however long
    assert client.simulate_post("/v1/embeddings", json={"input": ["a", 5, "b", 6]}).status_code == 200


@pytest.mark.parametrize(("argv", "engine_kw", "message"), [
    (("--max-client-batch-size", "2"), {}, "this request has 3 documents; the server accepts at most 2"),
    ((), {"max_queue_items": 2}, "this request has {inputs} inputs; the engine queue holds at most 2"),
])
def test_the_document_count_is_checked_on_the_raw_list_before_any_document_is_read(make_client, monkeypatch,
                                                                                    argv, engine_kw, message):
    parsed = _counting(monkeypatch, compat.wire.rerank, "_item")
    fetched = _counting(monkeypatch, compat.media, "load")
    documents = [{"text": "a", "image": PNG_URL}, {"image_url": PNG_URL}, {"text": 5}]
    reranker = FakeEngine(kind="cross-encoder", modalities=("text", "image"), **engine_kw)
    embedder = FakeEngine(modalities=("text", "image"), **engine_kw)
    for flag, engine, path, key in (("--reranking", reranker, "/rerank", "documents"),
                                    ("--reranking", reranker, "/v2/rerank", "documents"),
                                    ("--reranking", reranker, "/rerank", "texts"),
                                    ("--embedding", embedder, "/maxsim", "documents")):
        res = make_client(flag, *argv, engine=engine).simulate_post(path, json={"query": "q", key: documents})
        expected = message.format(inputs=4 if path == "/maxsim" else 3)  # MaxSim's query is an input too
        assert (res.status_code, res.json["error"]["message"].startswith(expected)) == (413, True), (path, res.json)
    assert (len(parsed), fetched, reranker.rerank_calls, embedder.embed_calls) == (0, [], [], [])


def test_the_default_client_batch_size_refuses_20000_inputs_with_413(make_client):
    res = make_client("--embedding").simulate_post("/v1/embeddings", json={"input": ["x"] * 20000})
    assert res.status_code == 413 and "20000 inputs" in res.json["error"]["message"]


def test_metrics_show_requests_in_flight_and_the_drain():
    lifecycle = Lifecycle()
    engine = GatedEngine()
    settings = parse_settings(["--embedding", "--metrics"], {}, system_config_files=[])
    client = TestClient(create_app(settings, engine, lifecycle))
    held = threading.Thread(target=client.simulate_post, args=("/v1/embeddings",), kwargs={"json": {"input": "x"}})
    held.start()
    try:
        assert engine.entered.wait(10)
        metrics = parse_metrics(client.simulate_get("/metrics").text)
        assert (metrics["mlx_embed:requests_in_flight"], metrics["mlx_embed:draining"]) == ("1", "0")
        lifecycle.begin_drain()
        metrics = parse_metrics(client.simulate_get("/metrics").text)  # answered while draining, to watch it
        assert (metrics["mlx_embed:requests_in_flight"], metrics["mlx_embed:draining"]) == ("1", "1")
    finally:
        engine.gate.set()
        held.join(10)
    assert parse_metrics(client.simulate_get("/metrics").text)["mlx_embed:requests_in_flight"] == "0"


def test_metrics_show_each_models_load_on_a_several_model_server(tmp_path):
    server = Server(tmp_path)
    server.engines.gated.add("minilm")
    held = threading.Thread(target=server.embed, args=("minilm",))
    held.start()
    try:
        assert server.engines.first_made("minilm").entered.wait(10)
        metrics = parse_metrics(server.client.simulate_get("/metrics").text)
        assert metrics['mlx_embed:in_use{model="minilm"}'] == "1" and metrics['mlx_embed:in_use{model="tiny"}'] == "0"
        assert metrics["mlx_embed:requests_in_flight"] == "1"
    finally:
        server.engines.of("minilm")[0].gate.set()
        held.join(10)
    assert parse_metrics(server.client.simulate_get("/metrics").text)['mlx_embed:in_use{model="minilm"}'] == "0"
