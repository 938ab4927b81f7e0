"""Bounded input and the drain, through falcon's TestClient over a fake engine: what is refused, with which status
and message, and that the server keeps serving afterwards."""
from __future__ import annotations

import time

import pytest
from falcon.testing import TestClient

from compat.app import create_app
from compat.lifecycle import ARRIVED_KEY, Lifecycle
from compat.settings import parse_settings
from compat.wire.inputs import MAX_JSON_DEPTH, json_depth
from tests.compat.fakes import FakeEngine

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


def test_json_depth_counts_levels():
    assert [json_depth(v) for v in (1, "s", [], {}, {"a": [1, 2]}, {"a": [[1], [2, {"b": [3]}]]})] == [0, 0, 1, 1, 2, 5]


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
