"""GET /openapi.json: every route of the app is in it, the request schemas name exactly the fields the parsers
read, and what the routes answer validates against it."""
from __future__ import annotations

from typing import Any

import falcon.inspect
import jsonschema
import pytest
from falcon.testing import TestClient

from compat.app import create_app
from compat.openapi import UndeclaredRoute, openapi_document
from compat.settings import parse_settings
from compat.wire.embeddings import parse_embeddings_request
from compat.wire.inputs import parse_model_field
from compat.wire.rerank import parse_rerank_request
from compat.wire.router import parse_model_request
from compat.wire.tokenize import parse_detokenize_request, parse_tokenize_request
from tests.compat.fakes import FakeEngine
from tests.compat.test_routing import Server


class RecordingBody(dict):
    """A request body that remembers every key a parser looked up."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


def _fields_read(parse, *bodies: dict) -> set[str]:
    read: set[str] = set()
    for body in bodies:
        recording = RecordingBody(body)
        parse(recording)
        parse_model_field(recording)  # the routes read `model` to find the engine
        read |= recording.read
    return read


def _document(*argv: str, path: str = "/openapi.json", headers: dict | None = None) -> dict:
    client = TestClient(create_app(parse_settings(["--embedding", *argv], {}, system_config_files=[]), FakeEngine()))
    res = client.simulate_get(path, headers=headers)
    assert res.status_code == 200
    return res.json


def _properties(document: dict, name: str) -> set[str]:
    return set(document["components"]["schemas"][name]["properties"])


def test_request_schemas_name_exactly_the_fields_the_parsers_read():
    document = _document()
    embeddings = _fields_read(lambda b: parse_embeddings_request(b, oai_route=True, default_normalize=2, width=4),
                              {"input": "x"}, {"content": "x"})
    assert embeddings == _properties(document, "EmbeddingsRequest")
    rerank = _fields_read(lambda b: parse_rerank_request(b, cohere_v2=False),
                          {"query": "q", "documents": ["a"]}, {"query": "q", "texts": ["a"]})
    assert rerank == _properties(document, "RerankRequest")
    assert _fields_read(parse_tokenize_request, {"content": "a"}) == _properties(document, "TokenizeRequest")
    assert _fields_read(parse_detokenize_request, {"tokens": [1]}) == _properties(document, "DetokenizeRequest")
    recording = RecordingBody({"model": "m"})
    parse_model_request(recording)
    assert recording.read == _properties(document, "ModelRequest")


def _app_routes(app) -> dict[str, set[str]]:
    return {route.path: {m.method.lower() for m in route.methods if not m.internal}
            for route in falcon.inspect.inspect_routes(app)}


def test_every_route_of_the_app_is_documented_with_its_methods(tmp_path):
    settings = parse_settings(["--embedding", "--metrics"], {}, system_config_files=[])
    single = create_app(settings, FakeEngine())
    several = Server(tmp_path).client.app
    for app in (single, several):
        document = TestClient(app).simulate_get("/openapi.json").json
        assert document["openapi"] == "3.1.0"
        assert {path: set(item) for path, item in document["paths"].items()} == _app_routes(app)
    assert {"/models/load", "/models/unload"} <= set(TestClient(several).simulate_get("/openapi.json").json["paths"])


def test_a_route_without_a_declaration_stops_the_app():
    settings = parse_settings(["--embedding"], {}, system_config_files=[])
    app = create_app(settings, FakeEngine())

    class Extra:
        def on_get(self, req, resp):
            pass

    app.add_route("/not-declared", Extra())
    with pytest.raises(UndeclaredRoute, match="/not-declared"):
        openapi_document(app, settings, "dev")


def test_the_prefix_keys_and_limits_are_in_the_document():
    document = _document("--api-prefix", "/api", "--api-key", "sk-secret", "--max-client-batch-size", "7",
                         "--payload-limit", "1234", path="/api/openapi.json", headers={"X-Api-Key": "sk-secret"})
    assert document["servers"] == [{"url": "/api"}]
    assert document["security"] == [{"bearer": []}, {"apiKey": []}]
    assert document["paths"]["/health"]["get"]["security"] == []
    assert "security" not in document["paths"]["/v1/embeddings"]["post"]
    assert "1234 bytes" in document["info"]["description"]
    assert "at most 7 prompts" in document["components"]["schemas"]["EmbeddingsRequest"]["properties"]["input"][
        "description"]
    assert "sk-secret" not in str(document)


def _validate(document: dict, path: str, method: str, status: int, body: Any) -> None:
    responses = document["paths"][path][method]["responses"]
    answer = responses.get(str(status), responses["default"])
    schema = next(iter(answer["content"].values()))["schema"]
    jsonschema.Draft202012Validator({**schema, "components": document["components"]}).validate(body)


@pytest.mark.parametrize("method,path,body", [
    ("post", "/v1/embeddings", {"input": ["a b", "c"]}),
    ("post", "/v1/embeddings", {"input": "a", "encoding_format": "base64"}),
    ("post", "/v1/embeddings", {"content": "a"}),
    ("post", "/embedding", {"content": ["a", [5, 6]]}),
    ("post", "/tokenize", {"content": "a b", "with_pieces": True}),
    ("post", "/tokenize", {"content": "a b"}),
    ("post", "/detokenize", {"tokens": [201, 202]}),
    ("get", "/props", None),
    ("get", "/models", None),
    ("get", "/v1/models", None),
    ("get", "/slots", None),
    ("get", "/health", None),
    ("post", "/v1/embeddings", {"input": []}),  # errors validate too
    ("post", "/rerank", {"query": "q", "documents": ["a"]}),  # 501: not a reranker
])
def test_answers_validate_against_the_document(method, path, body):
    client = TestClient(create_app(parse_settings(["--embedding"], {}, system_config_files=[]), FakeEngine()))
    document = client.simulate_get("/openapi.json").json
    res = client.simulate_request(method.upper(), path, json=body)
    _validate(document, path, method, res.status_code, res.json)


@pytest.mark.parametrize("body", [
    {"query": "q b", "documents": ["a b", {"text": "q"}], "return_documents": True, "top_n": 1},
    {"query": "q", "texts": ["a", "q"], "return_text": True},
])
@pytest.mark.parametrize("path", ["/rerank", "/v2/rerank"])
def test_rerank_answers_validate_against_the_document(path, body):
    client = TestClient(create_app(parse_settings(["--reranking"], {}, system_config_files=[]),
                                   FakeEngine(kind="cross-encoder")))
    document = client.simulate_get("/openapi.json").json
    res = client.simulate_post(path, json=body)
    assert res.status_code == 200
    _validate(document, path, "post", 200, res.json)


def test_router_answers_validate_against_the_document(tmp_path):
    server = Server(tmp_path)
    document = server.client.simulate_get("/openapi.json").json
    server.embed("tiny")
    for method, path, body in (("get", "/models", None), ("get", "/props", None),
                               ("post", "/models/load", {"model": "ce"}), ("post", "/models/load", {"model": "x"})):
        res = server.client.simulate_request(method.upper(), path, json=body)
        _validate(document, path, method, res.status_code, res.json)
