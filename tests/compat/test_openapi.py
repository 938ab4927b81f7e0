"""GET /openapi.json: every route of the app is in it, the request schemas name exactly the fields the parsers
read, and what the routes answer validates against it."""
from __future__ import annotations

import dataclasses
from typing import Any
from unittest.mock import ANY

import falcon.inspect
import jsonschema
import pytest
import schemathesis
from falcon.testing import TestClient

from compat.app import create_app
from compat.openapi import UndeclaredRoute, openapi_document
from compat.settings import parse_settings
from compat.wire.embeddings import parse_embeddings_request
from compat.wire.inputs import parse_model_field
from compat.wire.rerank import parse_rerank_request
from compat.wire.router import parse_model_request
from compat.wire.tokenize import parse_detokenize_request, parse_tokenize_request
from tests.compat.fakes import FakeEngine, word_id
from tests.compat.test_routing import Engines, Server
from tests.fuzzing import problems, refused_shares, tally_positive_cases


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


class RoomyEngines(Engines):
    """The router's fake engines with no token limit: the document cannot say how many tokens a text makes."""

    def __call__(self, options):
        engine = super().__call__(options)
        engine.info = dataclasses.replace(engine.info, max_input_tokens=10**6)
        return engine


@pytest.mark.parametrize("configuration", ["one model", "several models"])
def test_the_requests_the_document_allows_are_served(configuration, tmp_path):
    # schemathesis' valid requests for every operation, in process: few refused, no server error the document
    # does not declare (the measured run against the real server is tests/server/test_fuzz.py)
    if configuration == "one model":
        settings = parse_settings(["--embedding", "--metrics", "--props", "--max-client-batch-size", "8"], {},
                                  system_config_files=[])
        app = create_app(settings, FakeEngine(max_input_tokens=10**6))
    else:
        server = Server(tmp_path, engines=RoomyEngines())
        for name in ("minilm", "tiny", "ce"):  # loaded: the document then knows what each model accepts
            assert server.client.simulate_post("/models/load", json={"model": name}).status_code == 200
        app = server.client.app
    client = TestClient(app)
    tallies = tally_positive_cases(schemathesis.openapi.from_wsgi("/openapi.json", app),
                                   lambda case: case.call().status_code, examples=4)
    assert not problems(client.simulate_get("/openapi.json").json, tallies), refused_shares(tallies)


def _operation_responses(document: dict, method: str, path: str) -> set[str]:
    return set(document["paths"][path][method]["responses"])


def test_what_a_configuration_does_not_serve_documents_its_one_answer():
    document = _document()  # one embedding model, FakeEngine: no --reranking, --metrics, --props; not multi-vector
    for path in ("/rerank", "/v2/rerank", "/metrics", "/completion"):
        method = "get" if path == "/metrics" else "post"
        assert _operation_responses(document, method, path) == {"501", "default"}, path
    assert _operation_responses(document, "post", "/props") == {"501", "default"}
    assert _operation_responses(document, "post", "/maxsim") == {"400", "default"}  # a single-vector model
    assert _operation_responses(document, "post", "/models") == {"501", "default"}  # one model: nothing to reload
    assert _operation_responses(document, "post", "/v1/embeddings") == {"200", "default"}
    # the other servers' routes too, in their own error bodies: vLLM's score needs a reranker, TEI's /embed_all a
    # model served with --pooling none (TEI's Backend error, 424)
    assert _operation_responses(document, "post", "/score") == {"501", "default"}
    assert _operation_responses(document, "post", "/embed_all") == {"424", "default"}
    assert {"200"} <= _operation_responses(document, "post", "/embed") and "500" not in _operation_responses(
        document, "post", "/api/embed")
    served = _document("--metrics", "--props")
    assert _operation_responses(served, "get", "/metrics") == _operation_responses(served, "post", "/props") == {
        "200", "default"}


def test_the_document_states_what_the_model_accepts():
    schemas = _document()["components"]["schemas"]
    embeddings = schemas["EmbeddingsRequest"]["properties"]
    assert embeddings["dimensions"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 4}  # its width
    assert {k: v for k, v in embeddings["prompt_name"].items() if k != "description"} == {"type": "null"}
    assert {k: v for k, v in embeddings["instruction"].items() if k != "description"} == {"type": "null"}
    token = schemas["DetokenizeRequest"]["properties"]["tokens"]["items"]
    assert token == {"type": "integer", "minimum": 0, "maximum": 999}  # its vocabulary
    assert "image_url" not in str(embeddings["input"])  # it takes no images
    assert schemas["RerankRequest"]["required"] == ["query"]
    assert {"required": ["input"]} in schemas["EmbeddingsRequest"]["anyOf"]


def test_several_models_name_their_models_and_post_models_needs_reload(tmp_path):
    server = Server(tmp_path)
    document = server.client.simulate_get("/openapi.json").json
    schemas = document["components"]["schemas"]
    assert schemas["EmbeddingsRequest"]["properties"]["model"]["enum"] == [
        None, "", "minilm", "text-embedding-3-small", "tiny"]
    assert schemas["RerankRequest"]["properties"]["model"]["enum"] == [None, "", "ce"]
    assert schemas["ModelRequest"]["properties"]["model"]["enum"] == ["ce", "minilm", "text-embedding-3-small", "tiny"]
    post = document["paths"]["/models"]["post"]
    assert post["parameters"] == [{"name": "reload", "in": "query", "required": True,
                                   "schema": {"type": "string", "minLength": 1}, "description": ANY}]
    assert set(post["responses"]) == {"200", "501", "default"}
    assert server.client.simulate_post("/models").status_code == 501  # no ?reload: the documented 501
    assert server.client.simulate_post("/models", params={"reload": "1"}).status_code == 200
    # not loaded yet, the models' limits are unknown; loaded, they are stated
    assert "maximum" not in schemas["EmbeddingsRequest"]["properties"]["dimensions"]["anyOf"][0]
    server.embed("minilm"), server.embed("tiny")
    loaded = server.client.simulate_get("/openapi.json").json["components"]["schemas"]["EmbeddingsRequest"]
    assert loaded["properties"]["dimensions"]["anyOf"][0]["maximum"] == 4


def test_a_one_model_server_lists_its_model_whatever_reload_says(make_client):
    # as a one-model llama-server does; POST /models is 501 either way (nothing to reload, no downloads)
    client = make_client("--embedding")
    assert client.simulate_get("/models", params={"reload": "1"}).status_code == 200
    assert client.simulate_post("/models", params={"reload": "1"}).status_code == 501
    assert client.simulate_post("/models").status_code == 501


def test_whole_floats_are_the_integers_the_document_allows(make_client):
    # JSON Schema's "integer" admits 2.0 (schemathesis sends it), and llama reads 2.0 as 2 where it wants an int
    engine = FakeEngine()
    client = make_client("--embedding", engine=engine)
    res = client.simulate_post("/v1/embeddings", json={"input": [201.0, 202], "embd_normalize": 2.0,
                                                       "dimensions": 2.0})
    assert res.status_code == 200 and len(res.json["data"][0]["embedding"]) == 2
    assert engine.embed_calls[-1]["token_lists"] == [[201, 202]]
    assert all(type(t) is int for t in engine.embed_calls[-1]["token_lists"][0])
    assert client.simulate_post("/detokenize", json={"tokens": [201.0]}).status_code == 200
    assert client.simulate_post("/tokenize", json={"content": ["a", 5.0]}).json == {"tokens": [word_id("a"), 5]}
    reranker = make_client("--reranking", engine=FakeEngine(kind="cross-encoder"))
    res = reranker.simulate_post("/rerank", json={"query": "q", "documents": ["a", "q"], "top_n": 1.0})
    assert res.status_code == 200 and len(res.json["results"]) == 1
    for bad in ({"input": [1, 2.5]}, {"input": "a", "embd_normalize": 2.5}, {"input": "a", "dimensions": 1.5}):
        assert client.simulate_post("/v1/embeddings", json=bad).status_code == 400, bad
    # and on the other servers' routes
    assert len(client.simulate_post("/embed", json={"inputs": "a", "dimensions": 2.0}).json[0]) == 2
    assert client.simulate_post("/decode", json={"ids": [201.0]}).status_code == 200
    assert len(client.simulate_post("/v1/embed", json={"texts": ["a"], "output_dimension": 2.0}).json[
        "embeddings"][0]) == 2
    assert len(client.simulate_post("/api/embed", json={"input": "a", "dimensions": 2.0}).json[
        "embeddings"][0]) == 2


@pytest.mark.parametrize("argv,engine", [
    (["--embedding"], FakeEngine()), (["--reranking"], FakeEngine(kind="cross-encoder", modalities=("text", "image"))),
    (["--embedding"], FakeEngine(modalities=("text", "image"), prompts=(("query", "q: "),),
                                 instruction_template="{task}: {text}")),
])
def test_every_schema_of_the_document_is_valid_json_schema(argv, engine):
    document = TestClient(create_app(parse_settings(argv, {}, system_config_files=[]), engine)).simulate_get(
        "/openapi.json").json
    for name, schema in document["components"]["schemas"].items():
        jsonschema.Draft202012Validator.check_schema(schema)
    request = document["components"]["schemas"]["EmbeddingsRequest"]
    validator = jsonschema.Draft202012Validator({**request, "components": document["components"]})
    if engine.info.takes_images and not engine.info.is_reranker:  # images, prompts and an instruction allowed
        assert validator.is_valid({"input": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}],
                                   "prompt_name": "query"})
        assert validator.is_valid({"input": "a", "instruction": "find"})
        assert not validator.is_valid({"input": "a", "instruction": "find", "prompt_name": "query"})
        assert not validator.is_valid({"input": "a", "prompt_name": "passage"})
