"""`late_chunking` and `truncation_direction` on every embedding route, over the real bundled MiniLM: each route's
vectors equal Engine.embed_late_chunks' (tests/engine/test_late_chunking.py checks those against transformers),
normalized as the route normalizes, usage counting the document's tokens; bad values and inputs that cannot be
chunks refused in the client's own error shape."""
from __future__ import annotations

import numpy as np
import pytest
from falcon.testing import TestClient

from compat.app import create_app
from compat.settings import parse_settings
from tests.conftest import minilm_dir
from tests.engine.helpers import start_engine

CHUNKS = ["Mars is the fourth planet from the Sun. ", "Its reddish dust gives it its colour; ",
          "two small moons, Phobos and Deimos, orbit it."]
LONG = " ".join(f"word{i} and then some" for i in range(60))  # over the 64-token limit below


@pytest.fixture(scope="module")
def served():
    engine = start_engine(minilm_dir(), ubatch_tokens=64)
    settings = parse_settings(["--embedding", "-ub", "64"], {}, system_config_files=[])
    yield TestClient(create_app(settings, engine)), engine
    engine.close()


def late(engine, normalize: int = 2) -> np.ndarray:
    return np.asarray(engine.embed_late_chunks(CHUNKS, embd_normalize=normalize).vectors)


def test_openai_and_llama_routes_answer_one_vector_per_chunk(served):
    client, engine = served
    res = client.simulate_post("/v1/embeddings", json={"input": CHUNKS, "late_chunking": True})
    assert res.status_code == 200, res.text
    vectors = np.asarray([item["embedding"] for item in res.json["data"]])
    np.testing.assert_allclose(vectors, late(engine), atol=1e-6)
    n_tokens = len(engine.tokenizer.encode("".join(CHUNKS)))
    assert res.json["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    ordinary = client.simulate_post("/v1/embeddings", json={"input": CHUNKS}).json["data"]
    assert not np.allclose(vectors[0], ordinary[0]["embedding"], atol=1e-3)  # the context changed it
    llama = client.simulate_post("/embedding", json={"content": CHUNKS, "late_chunking": True})
    assert llama.status_code == 200, llama.text
    np.testing.assert_allclose([item["embedding"][0] for item in llama.json], late(engine), atol=1e-6)


def test_tei_cohere_and_ollama_routes_late_chunk_too(served):
    client, engine = served
    tei = client.simulate_post("/embed", json={"inputs": CHUNKS, "late_chunking": True})
    assert tei.status_code == 200, tei.text
    np.testing.assert_allclose(tei.json, late(engine), atol=1e-6)
    raw = client.simulate_post("/embed", json={"inputs": CHUNKS, "late_chunking": True, "normalize": False})
    np.testing.assert_allclose(raw.json, late(engine, -1), atol=1e-5)
    for version in (1, 2):
        cohere = client.simulate_post(f"/v{version}/embed", json={"texts": CHUNKS, "late_chunking": True,
                                                                  "embedding_types": ["float"]})
        assert cohere.status_code == 200, cohere.text
        np.testing.assert_allclose(cohere.json["embeddings"]["float"], late(engine), atol=1e-6)
    ollama = client.simulate_post("/api/embed", json={"model": "m", "input": CHUNKS, "late_chunking": True})
    assert ollama.status_code == 200, ollama.text
    np.testing.assert_allclose(ollama.json["embeddings"], late(engine), atol=1e-6)


@pytest.mark.parametrize("path,body", [
    ("/v1/embeddings", {"input": [LONG], "truncate": True}),
    ("/embedding", {"content": [LONG], "truncate": True}),
    ("/api/embed", {"model": "m", "input": [LONG]}),  # Ollama truncates by default
])
def test_truncation_direction_is_read_on_the_llama_openai_and_ollama_routes(served, path, body):
    client, engine = served
    ids = engine.tokenizer.encode(LONG)
    for direction in ("left", "Left", "right"):
        res = client.simulate_post(path, json={**body, "truncation_direction": direction})
        assert res.status_code == 200, res.text
        answer = res.json
        vector = (answer["data"][0]["embedding"] if "data" in answer else
                  answer["embeddings"][0] if "embeddings" in answer else answer[0]["embedding"][0])
        expected = engine.embed([ids], truncate=True, truncation_direction=direction, embd_normalize=2).vectors[0]
        np.testing.assert_allclose(vector, expected, atol=1e-6)
    bad = client.simulate_post(path, json={**body, "truncation_direction": "middle"})
    assert bad.status_code == 400
    assert "truncation_direction" in bad.text


def test_a_document_over_the_limit_is_refused_or_cut(served):
    client, engine = served
    chunks = [LONG[:-100], LONG[-100:]]
    refused = client.simulate_post("/v1/embeddings", json={"input": chunks, "late_chunking": True})
    assert refused.status_code == 400
    kept = client.simulate_post("/v1/embeddings", json={"input": chunks, "late_chunking": True, "truncate": True,
                                                        "truncation_direction": "left"})
    assert kept.status_code == 200, kept.text
    expected = engine.embed_late_chunks(chunks, truncate=True, truncation_direction="left", embd_normalize=2)
    np.testing.assert_allclose([item["embedding"] for item in kept.json["data"]], expected.vectors, atol=1e-6)
    assert kept.json["usage"]["prompt_tokens"] == 64


@pytest.mark.parametrize("path,body,status,where", [
    ("/v1/embeddings", {"input": ["a"], "late_chunking": "yes"}, 400, ("error", "message")),
    ("/v1/embeddings", {"input": [[101, 2000, 102]], "late_chunking": True}, 400, ("error", "message")),
    ("/v1/embeddings", {"input": ["a", ""], "late_chunking": True}, 400, ("error", "message")),
    ("/embed", {"inputs": ["a"], "late_chunking": 1}, 422, ("error",)),
    ("/v2/embed", {"texts": ["a"], "late_chunking": "no", "embedding_types": ["float"]}, 400, ("message",)),
    ("/api/embed", {"model": "m", "input": ["a"], "late_chunking": []}, 400, ("error",)),
])
def test_bad_late_chunking_requests_are_refused_in_each_clients_shape(served, path, body, status, where):
    client, _ = served
    res = client.simulate_post(path, json=body)
    assert res.status_code == status, res.text
    answer = res.json
    for key in where:
        answer = answer[key]
    message = answer if isinstance(answer, str) else str(answer)
    assert "late_chunking" in message or "chunk 1" in message, message
