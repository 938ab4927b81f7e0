"""API keys: every route but /health needs one (model management included), compared in constant time, never
logged; a key file readable by everyone is warned about; requests name configured models only, never a path."""
from __future__ import annotations

import hmac
import logging

import falcon.inspect
import pytest
from falcon.testing import TestClient

from compat import middleware
from compat.app import create_app
from compat.settings import parse_settings
from tests.compat.fakes import FakeEngine
from tests.compat.test_routing import PRESET, Server

KEY = "sk-this-is-the-secret-key"
PUBLIC = {"/health", "/v1/health"}
UNAUTHORIZED = {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}


def _routes(app) -> list[tuple[str, str]]:
    """(method, path) of every responder registered on the falcon app."""
    return [(method.method, route.path) for route in falcon.inspect.inspect_routes(app)
            for method in route.methods if not method.internal]


def _check_every_route_needs_the_key(client: TestClient, app) -> int:
    checked = 0
    for method, path in _routes(app):
        bare = client.simulate_request(method, path, json={"input": "x", "model": "minilm"})
        if path in PUBLIC:
            assert bare.status_code == 200, (method, path)
            continue
        assert bare.status_code == 401, (method, path)
        assert method == "HEAD" or bare.json == UNAUTHORIZED
        wrong = client.simulate_request(method, path, headers={"Authorization": "Bearer sk-wrong"})
        assert wrong.status_code == 401, (method, path)
        good = client.simulate_request(method, path, headers={"X-Api-Key": KEY}, json={"input": "x"})
        assert good.status_code != 401, (method, path)
        checked += 1
    return checked


def test_every_route_but_health_needs_a_key_on_the_single_model_server():
    settings = parse_settings(["--embedding", "--metrics", "--api-key", KEY], {}, system_config_files=[])
    app = create_app(settings, FakeEngine())
    assert _check_every_route_needs_the_key(TestClient(app), app) >= 20


def test_every_route_but_health_needs_a_key_on_the_several_model_server(tmp_path):
    server = Server(tmp_path, PRESET, "--api-key", KEY)
    app = server.client.app
    assert {("POST", "/models/load"), ("POST", "/models/unload"), ("POST", "/models")} <= set(_routes(app))
    _check_every_route_needs_the_key(server.client, app)
    for method, path, body in (("POST", "/models/load", {"model": "tiny"}), ("POST", "/models/unload", {"model": "tiny"}),
                               ("GET", "/models?reload=1", None), ("POST", "/models?reload=1", None)):
        res = server.client.simulate_request(method, path.split("?")[0], query_string=path.partition("?")[2],
                                             json=body)
        assert res.status_code == 401, (method, path)
    assert not server.engines.of("tiny")  # nothing was loaded by the refused requests


def test_keys_are_compared_in_constant_time_against_every_key(monkeypatch):
    compared = []
    compare_digest = hmac.compare_digest

    def recording(a, b):
        compared.append((a, b))
        return compare_digest(a, b)

    monkeypatch.setattr(middleware.hmac, "compare_digest", recording)
    settings = parse_settings(["--embedding", "--api-key", f"sk-first,{KEY},sk-third"], {}, system_config_files=[])
    client = TestClient(create_app(settings, FakeEngine()))
    assert client.simulate_post("/v1/embeddings", json={"input": "x"},
                                headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    # all three compared, even though the second matched: the time taken does not say which key was close
    assert compared == [(KEY.encode(), key.encode()) for key in ("sk-first", KEY, "sk-third")]


def test_keys_never_reach_the_log_or_a_repr(tmp_path, caplog):
    key_file = tmp_path / "keys"
    key_file.write_text("sk-from-the-file\n")
    key_file.chmod(0o600)
    caplog.set_level(logging.DEBUG)
    settings = parse_settings(["--embedding", "--api-key", KEY, "--api-key-file", str(key_file), "-v"],
                              {"LLAMA_API_KEY": "sk-from-env"}, system_config_files=[])
    client = TestClient(create_app(settings, FakeEngine()))
    for headers in ({}, {"Authorization": "Bearer sk-a-wrong-guess"}, {"X-Api-Key": KEY}):
        client.simulate_post("/v1/embeddings", json={"input": "x"}, headers=headers)
    client.simulate_get("/props", headers={"X-Api-Key": KEY})
    shown = caplog.text + repr(settings) + str(settings)
    for secret in (KEY, "sk-from-the-file", "sk-a-wrong-guess"):
        assert secret not in shown
    assert "LLAMA_API_KEY environment variable is set" in caplog.text  # the event is logged, the value is not


@pytest.mark.parametrize("mode,warned", [(0o600, False), (0o640, False), (0o644, True), (0o604, True)])
def test_a_key_file_readable_by_everyone_is_warned_about(tmp_path, caplog, mode, warned):
    key_file = tmp_path / "keys"
    key_file.write_text("sk-one\n")
    key_file.chmod(mode)
    settings = parse_settings(["--api-key-file", str(key_file)], {}, system_config_files=[])
    assert settings.api_key == ["sk-one"]
    assert ("readable by every user" in caplog.text) == warned
    if warned:
        assert str(key_file) in caplog.text and "chmod 600" in caplog.text and "sk-one" not in caplog.text


def test_requests_name_configured_models_only_never_a_path(tmp_path):
    server = Server(tmp_path)
    for name in ("/models/minilm", "/models/tiny", "../tiny", str(tmp_path), "/etc/passwd"):
        res = server.embed(name)
        assert res.status_code == 400 and "not found; this server serves: minilm, tiny, ce" in res.json["error"]["message"]
        res = server.client.simulate_post("/models/load", json={"model": name})
        assert res.status_code == 400
    assert not server.engines.made  # no engine was made for any of them
    assert server.embed("tiny").status_code == 200


def test_the_single_model_server_never_loads_what_a_request_names(make_client):
    engine = FakeEngine()
    res = make_client("--embedding", engine=engine).simulate_post(
        "/v1/embeddings", json={"input": "x", "model": "/etc/passwd"})
    assert res.status_code == 200 and res.json["model"] == "/etc/passwd"  # echoed, as llama-server does
    assert engine.info.path == "/models/fake-minilm" and len(engine.embed_calls) == 1
