"""TEI's POST /embed_sparse (compat/wire/sparse.py, compat/resources/sparse.py) on a real engine serving a tiny
random SPLADE checkpoint saved by sentence-transformers' SparseEncoder, its answers compared with
SparseEncoder.encode; what the other routes answer for a sparse model (TEI refuses `normalize`, /embed_all),
/props, /v1/models, /info, /metrics, the API key and the OpenAPI document; /embed_sparse on a dense model."""
from __future__ import annotations

import numpy as np
import pytest
from falcon.testing import TestClient

from compat.app import create_app
from compat.settings import parse_settings
from engine import Engine, EngineOptions
from tests.compat.fakes import FakeEngine
from tests.engine.families.test_splade import TEXTS, VALUE_TOLERANCE, make_masked_lm, reference, save_sparse_encoder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    mlm = make_masked_lm(tmp_path_factory.mktemp("mlm"), "BertForMaskedLM", seed=7)
    return save_sparse_encoder(mlm, tmp_path_factory.mktemp("splade"), new_layout=True)


@pytest.fixture(scope="module")
def engine(folder):
    eng = Engine(EngineOptions(model_path=str(folder), threads=2, max_seq=64))
    eng.wait_loaded(120)
    yield eng
    eng.close(wait=True)


def client_for(engine, *argv: str) -> TestClient:
    settings = parse_settings(["--embedding", "--metrics", *argv], {}, system_config_files=[])
    return TestClient(create_app(settings, engine))


@pytest.fixture(scope="module")
def client(engine):
    return client_for(engine)


def dense(answer: list[dict], width: int = 30522) -> np.ndarray:
    out = np.zeros(width, np.float32)
    indices = [entry["index"] for entry in answer]
    assert indices == sorted(indices) and len(set(indices)) == len(indices)  # TEI's order, each once
    assert all(entry["value"] != 0 for entry in answer)  # nonzero entries only
    out[indices] = [entry["value"] for entry in answer]
    return out


def test_embed_sparse_matches_sparse_encoder(client, folder):
    res = client.simulate_post("/embed_sparse", json={"inputs": TEXTS})
    assert res.status_code == 200
    assert all(list(entry) == ["index", "value"] for one in res.json for entry in one)
    expected = reference(folder, TEXTS)
    assert len(res.json) == len(TEXTS)
    for answer, row in zip(res.json, expected):
        np.testing.assert_allclose(dense(answer), row, atol=VALUE_TOLERANCE, rtol=1e-4)
    # one string: a list holding one answer, the same as in the batch
    one = client.simulate_post("/embed_sparse", json={"inputs": TEXTS[1]}).json
    assert len(one) == 1
    np.testing.assert_allclose(dense(one[0]), expected[1], atol=VALUE_TOLERANCE, rtol=1e-4)
    # POST / routes a sparse model's body to /embed_sparse, as TEI does for a splade model
    root = client.simulate_post("/", json={"inputs": TEXTS[1]}).json
    np.testing.assert_allclose(dense(root[0]), expected[1], atol=VALUE_TOLERANCE, rtol=1e-4)
    # ours: max_active_dims keeps the largest entries, as SparseEncoder.encode(max_active_dims=) does
    top = client.simulate_post("/embed_sparse", json={"inputs": TEXTS, "max_active_dims": 3}).json
    for answer, row in zip(top, reference(folder, TEXTS, max_active_dims=3)):
        assert len(answer) == 3
        np.testing.assert_allclose(dense(answer), row, atol=VALUE_TOLERANCE, rtol=1e-4)


def test_embed_sparse_inputs_truncation_and_errors(client, engine):
    ids = engine.encode_prompt(["hello world"])
    by_ids = client.simulate_post("/embed_sparse", json={"inputs": [ids]}).json
    by_text = client.simulate_post("/embed_sparse", json={"inputs": "hello world"}).json
    assert by_ids == by_text
    long = " ".join(["planet"] * 100)
    res = client.simulate_post("/embed_sparse", json={"inputs": long})
    assert (res.status_code, res.json["error_type"]) == (413, "Validation")
    assert client.simulate_post("/embed_sparse", json={"inputs": long, "truncate": True}).status_code == 200
    left = client.simulate_post("/embed_sparse", json={"inputs": long + " end", "truncate": True,
                                                       "truncation_direction": "Left"})
    assert left.status_code == 200
    for body, status, error_type in (({"inputs": []}, 400, "Empty"), ({"inputs": ""}, 400, "Empty"),
                                     ({"inputs": "a", "max_active_dims": 0}, 422, "Validation"),
                                     ({"inputs": "a", "truncation_direction": "up"}, 422, "Validation"),
                                     ({"inputs": [[10**9]]}, 422, "Tokenizer")):
        res = client.simulate_post("/embed_sparse", json=body)
        assert (res.status_code, res.json["error_type"]) == (status, error_type), body
        assert list(res.json) == ["error", "error_type"]


def test_dense_routes_on_a_sparse_model(client, folder):
    """TEI refuses `normalize` (the default of /embed and of its /v1/embeddings) and /embed_all for a SPLADE
    model, and answers /embed with normalize false with the dense vocabulary-wide vector."""
    res = client.simulate_post("/embed", json={"inputs": "hello"})
    assert (res.status_code, res.json["error_type"]) == (424, "Backend")
    assert "SPLADE" in res.json["error"] and "/embed_sparse" in res.json["error"]
    raw = client.simulate_post("/embed", json={"inputs": TEXTS[:2], "normalize": False}).json
    np.testing.assert_allclose(raw, reference(folder, TEXTS[:2]), atol=VALUE_TOLERANCE, rtol=1e-4)
    res = client.simulate_post("/embed_all", json={"inputs": "hello"})
    assert (res.status_code, res.json["error_type"]) == (424, "Backend")
    assert "`embed_all` is not available for SPLADE models" in res.json["error"]
    res = client.simulate_post("/v1/embeddings", json={"input": "hello"})
    assert res.status_code == 400
    assert res.json["error"]["type"] == "invalid_request_error"
    assert "sparse (SPLADE) encoder" in res.json["error"]["message"] and "/embed_sparse" in res.json["error"]["message"]
    # Ollama's /api/embed and Cohere's embed normalize: refused in their own error shapes
    res = client.simulate_post("/api/embed", json={"model": "m", "input": "hello"})
    assert res.status_code == 400 and "/embed_sparse" in res.json["error"]
    res = client.simulate_post("/v2/embed", json={"texts": ["hello"], "input_type": "search_query",
                                                  "embedding_types": ["float"]})
    assert res.status_code == 400 and "/embed_sparse" in res.json["message"]


def test_props_models_info_metrics_and_openapi(client):
    props = client.simulate_get("/props").json
    assert (props["sparse"], props["max_active_dims"], props["multi_vector"]) == (True, None, False)
    meta = client.simulate_get("/v1/models").json["data"][0]["meta"]
    assert (meta["n_embd"], meta["sparse"]) == (30522, True)
    info = client.simulate_get("/info").json
    assert info["model_type"] == {"embedding": {"pooling": "splade"}}
    before = _prompt_tokens(client)
    client.simulate_post("/embed_sparse", json={"inputs": "hello world"})  # [CLS] hello world [SEP]
    assert _prompt_tokens(client) == before + 4
    document = client.simulate_get("/openapi.json").json
    assert "/embed_sparse" in document["paths"]
    assert "max_active_dims" in document["components"]["schemas"]["TeiEmbedSparseRequest"]["properties"]


def test_api_key_guards_embed_sparse(engine):
    guarded = client_for(engine, "--api-key", "secret")
    assert guarded.simulate_post("/embed_sparse", json={"inputs": "a"}).status_code == 401
    ok = guarded.simulate_post("/embed_sparse", json={"inputs": "a"}, headers={"Authorization": "Bearer secret"})
    assert ok.status_code == 200


def test_embed_sparse_on_a_dense_model(make_client):
    res = make_client("--embedding", engine=FakeEngine()).simulate_post("/embed_sparse", json={"inputs": "a"})
    assert (res.status_code, res.json["error_type"]) == (424, "Backend")
    assert res.json["error"].startswith("Model is not an embedding model with SPLADE pooling")


def _prompt_tokens(client) -> int:
    for line in client.simulate_get("/metrics").text.splitlines():
        if line.startswith("llamacpp:prompt_tokens_total "):
            return int(float(line.split()[1]))
    raise AssertionError("no prompt_tokens_total")
