"""Ollama's routes over the fake engine (compat/wire/ollama.py, compat/resources/ollama.py): the bodies Ollama's
server writes (`server/routes.go`, `api/types.go`), its names and errors, the legacy route's normalization rule
(`llm/llama_server.go` legacyEmbeddingsWereRaw), keep_alive, and the same lease, limits, key and OpenAPI
document as the other routes. The vectors are checked against our own /v1/embeddings answers."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from compat.wire.ollama import legacy_raw, parse_keep_alive, resolve_name
from engine.errors import QueueFull
from engine.types import ModelState, VocabType
from tests.compat.fakes import FakeEngine
from tests.compat.test_openapi import _document, _fields_read, _properties, _validate
from tests.compat.test_routing import Server


def _v1(client, text, **extra):
    res = client.simulate_post("/v1/embeddings", json={"input": text, **extra})
    assert res.status_code == 200
    return [np.array(item["embedding"]) for item in res.json["data"]]


def test_embed_answers_ollamas_body_with_l2_normalized_vectors(make_client):
    client = make_client("--embedding")
    res = client.simulate_post("/api/embed", json={"model": "nomic-embed-text:latest", "input": ["a b", "c"]})
    assert res.status_code == 200
    body = res.json
    assert list(body) == ["model", "embeddings", "total_duration", "load_duration", "prompt_eval_count"]
    assert body["model"] == "nomic-embed-text:latest"  # echoed as sent, as Ollama does
    assert isinstance(body["total_duration"], int) and 0 <= body["load_duration"] <= body["total_duration"]
    expected = _v1(client, ["a b", "c"], embd_normalize=2)
    np.testing.assert_allclose(body["embeddings"], expected, rtol=1e-6)
    assert np.allclose(np.linalg.norm(body["embeddings"], axis=1), 1.0)
    usage = client.simulate_post("/v1/embeddings", json={"input": ["a b", "c"]}).json["usage"]
    assert body["prompt_eval_count"] == usage["prompt_tokens"]
    one = client.simulate_post("/api/embed", json={"model": "m", "input": "a b"}).json["embeddings"]
    np.testing.assert_allclose(one, expected[:1], rtol=1e-6)


def test_an_empty_input_loads_and_answers_no_embeddings(make_client):
    client = make_client("--embedding")
    for body in ({"model": "m", "input": ""}, {"model": "m", "input": []}, {"model": "m"}):
        res = client.simulate_post("/api/embed", json=body)
        assert (res.status_code, res.json) == (200, {"model": "m", "embeddings": []})
    assert client.simulate_post("/api/embeddings", json={"model": "m"}).json == {"embedding": []}


def test_dimensions_cut_then_normalize_as_ollama(make_client):
    client = make_client("--embedding")
    res = client.simulate_post("/api/embed", json={"model": "m", "input": "a b c", "dimensions": 2})
    expected = _v1(client, "a b c", dimensions=2, embd_normalize=2)
    np.testing.assert_allclose(res.json["embeddings"], expected, rtol=1e-6)
    # Ollama keeps the whole vector for 0 or a width at least the model's
    for dimensions in (0, 4, 99):
        res = client.simulate_post("/api/embed", json={"model": "m", "input": "a b c", "dimensions": dimensions})
        assert len(res.json["embeddings"][0]) == 4


def test_truncate_false_makes_an_overlong_input_ollamas_400(make_client):
    engine = FakeEngine(max_input_tokens=4)
    client = make_client("--embedding", engine=engine)
    text = "a b c d e f"
    res = client.simulate_post("/api/embed", json={"model": "m", "input": text, "truncate": False})
    assert (res.status_code, res.json) == (400, {"error": "the input length exceeds the context length"})
    res = client.simulate_post("/api/embed", json={"model": "m", "input": text})  # truncate defaults to true
    assert res.status_code == 200 and res.json["prompt_eval_count"] == 4
    assert engine.embed_calls[-1]["truncate"] is True


@pytest.mark.parametrize("body,message", [
    ({"model": "m", "input": [1, 2]}, "invalid input type"),
    ({"model": "m", "input": {"a": 1}}, "invalid input type"),
    ({"model": "m", "input": "a", "truncate": "yes"}, '"truncate" must be a boolean'),
    ({"model": "m", "input": "a", "dimensions": "2"}, '"dimensions" must be an integer'),
    ({"model": "m", "input": "a", "keep_alive": "soon"}, 'time: invalid duration "soon"'),
    ({"model": "m", "input": "a", "options": [1]}, '"options" must be an object'),
])
def test_bad_requests_answer_ollamas_error_shape(make_client, body, message):
    res = make_client("--embedding").simulate_post("/api/embed", json=body)
    assert (res.status_code, res.json) == (400, {"error": message})


def test_options_and_keep_alive_are_accepted(make_client):
    client = make_client("--embedding")
    for keep_alive in ("5m", "1h30m", 0, -1, "-1s", 12.5):
        res = client.simulate_post("/api/embed", json={"model": "m", "input": "a", "keep_alive": keep_alive,
                                                       "options": {"num_ctx": 2048}})
        assert res.status_code == 200, res.json


def test_keep_alive_reads_gos_durations_and_seconds():
    assert parse_keep_alive(None) == 300.0
    assert parse_keep_alive("5m") == 300.0 and parse_keep_alive("1h30m") == 5400.0
    assert parse_keep_alive("0") == 0.0 and parse_keep_alive(0) == 0.0 and parse_keep_alive("250ms") == 0.25
    assert parse_keep_alive(-1) is None and parse_keep_alive("-1m") is None  # forever


def test_ollama_names_resolve_to_served_ids_and_aliases():
    served = ["minilm", "text-embedding-3-small", "org/model:q8"]
    assert resolve_name("minilm", served) == "minilm"
    assert resolve_name("minilm:latest", served) == "minilm"
    assert resolve_name("text-embedding-3-small:latest", served) == "text-embedding-3-small"
    assert resolve_name("org/model:q8", served) == "org/model:q8"
    assert resolve_name("minilm:v2", served) is None


@pytest.mark.parametrize("family,vocab,module,raw", [
    ("bert", VocabType.WPM, True, False),  # all-MiniLM: Normalize module
    ("bert", VocabType.WPM, False, True),  # a BERT without Normalize: raw
    ("bert", VocabType.WPM, None, False),  # a GGUF file: Ollama's default, normalized
    ("xlm_roberta", VocabType.UGM, True, True),  # bge-m3: not WordPiece, raw
    ("nomic_bert", VocabType.WPM, None, True),  # nomic-bert: raw unless it says Normalize
    ("nomic_bert", VocabType.WPM, True, False),
    ("qwen3", VocabType.BPE, False, False),  # every other architecture: normalized
    ("gemma3_text", VocabType.SPM, None, False),
])
def test_the_legacy_route_normalizes_by_ollamas_rule(family, vocab, module, raw):
    info = dataclasses.replace(FakeEngine().info, family=family, vocab_type=vocab, normalize_module=module)
    assert legacy_raw(info) is raw


@pytest.mark.parametrize("module,normalize", [(True, 2), (False, -1)])
def test_legacy_embeddings_answer_one_vector(make_client, module, normalize):
    engine = FakeEngine()
    engine.info = dataclasses.replace(engine.info, normalize_module=module)
    client = make_client("--embedding", engine=engine)
    res = client.simulate_post("/api/embeddings", json={"model": "all-minilm", "prompt": "a b"})
    assert list(res.json) == ["embedding"]
    np.testing.assert_allclose(res.json["embedding"], _v1(client, "a b", embd_normalize=normalize)[0], rtol=1e-6)


def test_errors_of_the_engine_and_of_the_kind_are_ollamas_shape(make_client):
    client = make_client("--reranking", engine=FakeEngine(kind="cross-encoder"))
    res = client.simulate_post("/api/embed", json={"model": "m", "input": "a"})
    assert (res.status_code, res.json) == (400, {"error": "this server runs a reranker (rank pooling): it serves "
                                                          "/rerank, not embeddings"})
    res = make_client().simulate_post("/api/embed", json={"model": "m", "input": "a"})  # no --embedding
    assert res.status_code == 501 and "--embeddings" in res.json["error"]
    engine = FakeEngine()
    engine.raise_on_embed = QueueFull("Too many inputs queued; retry later")
    res = make_client("--embedding", engine=engine).simulate_post("/api/embed", json={"model": "m", "input": "a"})
    assert (res.status_code, res.json) == (503, {"error": "Too many inputs queued; retry later"})
    assert res.headers["Retry-After"] == "1"
    res = make_client("--embedding").simulate_post("/api/embed", body=b"{not json")
    assert res.status_code == 400 and isinstance(res.json["error"], str)


def test_tags_show_ps_and_version_on_one_model(make_client):
    client = make_client("--embedding", "--alias", "all-minilm")
    tags = client.simulate_get("/api/tags").json["models"]
    assert [m["name"] for m in tags] == ["all-minilm:latest"] and tags[0]["model"] == "all-minilm:latest"
    assert tags[0]["details"]["embedding_length"] == 4 and tags[0]["details"]["parameter_size"] == "22.7M"
    assert tags[0]["size"] == 90868376 and len(tags[0]["digest"]) == 64
    ps = client.simulate_get("/api/ps").json["models"]
    assert [m["name"] for m in ps] == ["all-minilm:latest"] and ps[0]["expires_at"].startswith("2318-")
    show = client.simulate_post("/api/show", json={"model": "anything:latest"}).json
    assert show["capabilities"] == ["embedding"] and show["model_info"]["bert.embedding_length"] == 4
    res = client.simulate_post("/api/show", json={})
    assert (res.status_code, res.json) == (400, {"error": "model is required"})
    assert client.simulate_get("/api/version").json == {"version": "0.12.0"}


def test_several_models_route_by_ollama_name_and_404_an_unknown_one(tmp_path):
    server = Server(tmp_path)
    res = server.client.simulate_post("/api/embed", json={"model": "text-embedding-3-small:latest", "input": "a"})
    assert res.status_code == 200 and res.json["model"] == "text-embedding-3-small:latest"
    assert len(server.engines.of("minilm")[0].embed_calls) == 1
    assert server.client.simulate_post("/api/embeddings", json={"model": "tiny", "prompt": "a"}).status_code == 200
    assert len(server.engines.of("tiny")[0].embed_calls) == 1
    for path, body in (("/api/embed", {"model": "llama3:8b", "input": "a"}),
                       ("/api/embeddings", {"model": "llama3:8b", "prompt": "a"}),
                       ("/api/show", {"model": "llama3:8b"})):
        res = server.client.simulate_post(path, json=body)
        assert (res.status_code, res.json) == (404, {"error": "model 'llama3:8b' not found"})
    res = server.client.simulate_post("/api/embed", json={"model": "ce", "input": "a"})  # a reranker
    assert res.status_code == 400 and "reranker" in res.json["error"]
    assert server.models()["minilm"]["stats"]["requests"] == 1  # counted as the other routes are


def test_several_models_list_tags_ps_and_keep_alive_zero_unloads(tmp_path):
    server = Server(tmp_path)
    tags = server.client.simulate_get("/api/tags").json["models"]
    assert [m["name"] for m in tags] == ["minilm:latest", "tiny:latest"]  # embedding models, loaded or not
    assert server.client.simulate_get("/api/ps").json == {"models": []}
    server.client.simulate_post("/api/embed", json={"model": "tiny", "input": "a"})
    assert [m["name"] for m in server.client.simulate_get("/api/ps").json["models"]] == ["tiny:latest"]
    res = server.client.simulate_post("/api/embed", json={"model": "tiny", "input": "a", "keep_alive": 0})
    assert res.status_code == 200
    assert server.models()["tiny"]["status"]["value"] == ModelState.UNLOADED.value
    assert server.client.simulate_get("/api/ps").json == {"models": []}
    show = server.client.simulate_post("/api/show", json={"model": "tiny:latest"}).json  # loads it
    assert show["details"]["embedding_length"] == 4


def test_the_api_key_guards_the_ollama_routes(make_client):
    client = make_client("--embedding", "--api-key", "sk-x")
    assert client.simulate_post("/api/embed", json={"model": "m", "input": "a"}).status_code == 401
    assert client.simulate_get("/api/tags").status_code == 401
    res = client.simulate_post("/api/embed", json={"model": "m", "input": "a"},
                               headers={"Authorization": "Bearer sk-x"})
    assert res.status_code == 200


def test_the_client_batch_limit_applies(make_client):
    res = make_client("--embedding", "--max-client-batch-size", "2").simulate_post(
        "/api/embed", json={"model": "m", "input": ["a", "b", "c"]})
    assert res.status_code == 413 and "at most 2" in res.json["error"]


def test_the_openapi_document_names_the_fields_the_parsers_read_and_the_answers_validate(make_client):
    from compat.wire.ollama import parse_embed_request, parse_legacy_request, parse_show_request
    document = _document()
    assert _fields_read(lambda b: parse_embed_request(b, 4), {"input": "x"}) == _properties(document,
                                                                                              "OllamaEmbedRequest")
    assert _fields_read(parse_legacy_request, {"prompt": "x"}) == _properties(document, "OllamaEmbeddingsRequest")
    assert _fields_read(parse_show_request, {"model": "x"}) == _properties(document, "OllamaShowRequest")
    client = make_client("--embedding")
    for method, path, body in (("post", "/api/embed", {"model": "m", "input": ["a", "b"]}),
                               ("post", "/api/embed", {"model": "m", "input": [1]}),
                               ("post", "/api/embeddings", {"model": "m", "prompt": "a"}),
                               ("post", "/api/show", {"model": "m"}), ("get", "/api/tags", None),
                               ("get", "/api/ps", None), ("get", "/api/version", None)):
        res = client.simulate_request(method.upper(), path, json=body)
        _validate(document, path, method, res.status_code, res.json)
