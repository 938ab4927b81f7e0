"""compat/stages.py: a request asking for its stage times gets their stamps, in order; others get nothing."""
from __future__ import annotations

from compat import stages

ORDER = ["app", "parsed", "engine_in", "engine_out", "rendered", "serialized"]


def test_stage_times_only_when_asked(make_client):
    client = make_client("--embedding")
    plain = client.simulate_post("/v1/embeddings", json={"input": "a b"})
    assert plain.status_code == 200 and stages.RESPONSE_HEADER not in plain.headers
    asked = client.simulate_post("/v1/embeddings", json={"input": "a b"}, headers={stages.REQUEST_HEADER: "1"})
    assert asked.status_code == 200
    assert asked.json == plain.json  # the body is the same, serialized once
    stamps = stages.parse(asked.headers[stages.RESPONSE_HEADER])
    assert [name for name in stamps if name in ORDER] == ORDER  # no waitress here: no `arrived`
    assert all(stamps[a] <= stamps[b] for a, b in zip(ORDER, ORDER[1:]))
    assert (stamps["queue_s"], stamps["inference_s"]) == (0.002, 0.0125)  # the fake engine's timings
    assert stamps["tokenize_s"] >= 0


def test_stage_times_on_other_routes_and_errors(make_client):
    client = make_client("--embedding")
    res = client.simulate_get("/health", headers={stages.REQUEST_HEADER: "1"})
    assert res.status_code == 200 and set(stages.parse(res.headers[stages.RESPONSE_HEADER])) == {"app", "serialized"}
    bad = client.simulate_post("/v1/embeddings", body="{", headers={stages.REQUEST_HEADER: "1"})
    assert bad.status_code == 400 and bad.json["error"]["type"] == "invalid_request_error"
