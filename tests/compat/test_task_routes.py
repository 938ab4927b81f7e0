"""`task` on every embedding route, over a real engine on a tiny random jina-embeddings-v3 checkpoint in Jina's
layout (tests/engine/families/test_jina_embeddings_v3.py builds it): each route's vectors equal the reference's
(transformers' model with the task's adapter merged, the task's instruction before the text, L2-normalized as
the routes normalize); `prompt_name` naming a task and Cohere's input_type choose it too; /props, /v1/models
and /openapi.json say what a request may name; an unknown task, or any task for a model without adapters, is a
400 in the route's own error shape naming what the model has."""
from __future__ import annotations

import numpy as np
import orjson
import pytest
from falcon.testing import TestClient

from compat.app import create_app
from compat.cli import embed_main
from compat.settings import parse_settings
from tests.engine.families.test_jina_embeddings_v3 import (
    INSTRUCTIONS,
    MIN_COSINE,
    TASKS,
    references,
    remote_layout,
    save_hf,
)
from tests.engine.helpers import cosine, hf_hidden, start_engine

TEXTS = ["what is rotary position embedding?", "Rotary embeddings rotate query and key pairs."]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder, model = save_hf(tmp_path_factory.mktemp("jina_v3_hf"))
    path = tmp_path_factory.mktemp("jina_v3_served") / "remote"
    refs = references(model, remote_layout(folder, model, path))
    engine = start_engine(path)
    client = TestClient(create_app(parse_settings(["--embedding"], {}, system_config_files=[]), engine))
    yield client, engine, refs, path
    engine.close()


def expected(served, task: str | None, text: str, prompt: str | None = None) -> np.ndarray:
    """The reference's mean-pooled vector of `text` under `task`'s adapter, after `prompt` (default: the task's
    instruction, as Jina's encode(task=...) puts it)."""
    _, engine, refs, _ = served
    prefix = prompt if prompt is not None else INSTRUCTIONS.get(task, "")
    return hf_hidden(refs[task], engine.encode_prompt([prefix + text])).mean(axis=0)


def assert_vectors(served, vectors, task: str | None, prompt: str | None = None) -> None:
    vectors = np.asarray(vectors, dtype=np.float64)
    assert vectors.shape[0] == len(TEXTS)
    for text, got in zip(TEXTS, vectors, strict=True):
        assert abs(np.linalg.norm(got) - 1) < 1e-5
        assert cosine(got, expected(served, task, text, prompt)) >= MIN_COSINE, task


@pytest.mark.parametrize("task", ["retrieval.query", "retrieval.passage", "separation"])
def test_openai_and_llama_routes_run_the_task_asked(served, task):
    client = served[0]
    oai = client.simulate_post("/v1/embeddings", json={"input": TEXTS, "task": task})
    assert oai.status_code == 200, oai.text
    assert_vectors(served, [item["embedding"] for item in oai.json["data"]], task)
    by_name = client.simulate_post("/v1/embeddings", json={"input": TEXTS, "prompt_name": task})
    assert_vectors(served, [item["embedding"] for item in by_name.json["data"]], task)
    llama = client.simulate_post("/embedding", json={"content": TEXTS, "task": task})
    assert llama.status_code == 200, llama.text
    assert_vectors(served, [item["embedding"][0] for item in llama.json], task)


def test_no_task_runs_without_adapters_and_both_fields_combine(served):
    client = served[0]
    plain = client.simulate_post("/v1/embeddings", json={"input": TEXTS})
    assert_vectors(served, [item["embedding"] for item in plain.json["data"]], None)
    both = client.simulate_post("/v1/embeddings", json={"input": TEXTS, "task": "separation",
                                                        "prompt_name": "retrieval.query"})
    assert_vectors(served, [item["embedding"] for item in both.json["data"]], "separation",
                   INSTRUCTIONS["retrieval.query"])


def test_tei_ollama_and_cohere_routes_take_the_task(served):
    client = served[0]
    tei = client.simulate_post("/embed", json={"inputs": TEXTS, "task": "retrieval.passage"})
    assert tei.status_code == 200, tei.text
    assert_vectors(served, tei.json, "retrieval.passage")
    ollama = client.simulate_post("/api/embed", json={"model": "m", "input": TEXTS, "task": "text-matching"})
    assert ollama.status_code == 200, ollama.text
    assert_vectors(served, ollama.json["embeddings"], "text-matching")
    similarity = client.simulate_post("/similarity", json={
        "inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}, "parameters": {"task": "retrieval.query"}})
    assert similarity.status_code == 200, similarity.text
    source = expected(served, "retrieval.query", TEXTS[0], None)
    for score, text in zip(similarity.json, TEXTS[1:], strict=True):
        assert abs(score - cosine(source, expected(served, "retrieval.query", text, None))) < 1e-5
    for text in TEXTS:  # Ollama's legacy route: one prompt
        legacy = client.simulate_post("/api/embeddings", json={"model": "m", "prompt": text, "task": "separation"})
        assert legacy.status_code == 200, legacy.text
        assert cosine(np.asarray(legacy.json["embedding"]), expected(served, "separation", text, None)) >= MIN_COSINE
    for version in (1, 2):
        for input_type, task in (("search_query", "retrieval.query"), ("search_document", "retrieval.passage"),
                                 ("classification", "classification"), ("clustering", "separation")):
            cohere = client.simulate_post(f"/v{version}/embed", json={"texts": TEXTS, "input_type": input_type,
                                                                      "embedding_types": ["float"]})
            assert cohere.status_code == 200, cohere.text
            assert_vectors(served, cohere.json["embeddings"]["float"], task)
        chosen = client.simulate_post(f"/v{version}/embed", json={"texts": TEXTS, "input_type": "search_query",
                                                                  "task": "text-matching",
                                                                  "embedding_types": ["float"]})
        assert_vectors(served, chosen.json["embeddings"]["float"], "text-matching")


def test_an_unknown_task_is_refused_in_each_routes_shape_naming_the_tasks(served):
    client = served[0]
    known = "known: " + ", ".join(TASKS)
    oai = client.simulate_post("/v1/embeddings", json={"input": TEXTS, "task": "search"})
    assert oai.status_code == 400 and oai.json["error"]["type"] == "invalid_request_error"
    assert "task 'search' is not one of this model's tasks" in oai.json["error"]["message"]
    assert known in oai.json["error"]["message"]
    llama = client.simulate_post("/embedding", json={"content": TEXTS, "task": 3})
    assert llama.status_code == 400 and "\"task\" must be a string" in llama.json["error"]["message"]
    tei = client.simulate_post("/embed", json={"inputs": TEXTS, "task": "search"})
    assert tei.status_code in (400, 422) and known in tei.json["error"] and "error_type" in tei.json
    ollama = client.simulate_post("/api/embed", json={"model": "m", "input": TEXTS, "task": "search"})
    assert ollama.status_code == 400 and known in ollama.json["error"]
    cohere = client.simulate_post("/v2/embed", json={"texts": TEXTS, "task": "search"})
    assert cohere.status_code == 400 and known in cohere.json["message"]
    late = client.simulate_post("/v1/embeddings", json={"input": TEXTS, "task": "search", "late_chunking": True})
    assert late.status_code == 400 and known in late.json["error"]["message"]
    assert client.simulate_get("/health").status_code == 200


def test_props_models_and_openapi_name_the_tasks(served):
    client = served[0]
    props = client.simulate_get("/props").json
    assert props["tasks"] == INSTRUCTIONS and props["default_task"] is None
    meta = client.simulate_get("/v1/models").json["data"][0]["meta"]
    assert meta["tasks"] == TASKS and meta["default_task"] is None
    schemas = client.simulate_get("/openapi.json").json["components"]["schemas"]
    for name in ("EmbeddingsRequest", "TeiEmbedRequest", "OllamaEmbedRequest", "CohereEmbedRequest"):
        assert schemas[name]["properties"]["task"]["enum"] == [None, *sorted(TASKS)], name


def test_a_task_for_a_model_without_adapters_is_refused(make_client):
    client = make_client("--embedding")
    res = client.simulate_post("/v1/embeddings", json={"input": "hello", "task": "retrieval.query"})
    assert res.status_code == 400
    assert "'task' is not supported by this model" in res.json["error"]["message"]
    assert "no task adapters" in res.json["error"]["message"]
    assert "tasks" not in client.simulate_get("/props").json
    tei = make_client("--embedding").simulate_post("/embed", json={"inputs": "hello", "task": "classification"})
    assert tei.status_code in (400, 422) and "no task adapters" in tei.json["error"]


def test_mlx_embed_takes_the_task(served, capsys, tmp_path):
    """mlx-embed --task: the vectors /v1/embeddings gives for that task; a corpus run records it; images and an
    unknown task are refused."""
    client, _, _, path = served
    assert embed_main(["-m", str(path), "-p", TEXTS[0], "-p", TEXTS[1], "--task", "retrieval.passage", "--json"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert_vectors(served, out["embeddings"], "retrieval.passage")
    assert embed_main(["-m", str(path), "-p", TEXTS[0], "--task", "search"]) == 1
    assert "task 'search' is not one of this model's tasks" in capsys.readouterr().err
    image = tmp_path / "x.png"
    image.write_bytes(b"\x89PNG")
    assert embed_main(["-m", str(path), "--image", str(image), "--task", "separation"]) == 1
    assert "--task: only the texts of a model with task adapters" in capsys.readouterr().err
    source = tmp_path / "corpus.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    output = tmp_path / "out.parquet"
    assert embed_main(["-m", str(path), "--input", str(source), "--output", str(output), "--task", "separation",
                       "--quiet"]) == 0
    import pyarrow.parquet as pq

    table = pq.read_table(output)
    vectors = [np.asarray(v, dtype=np.float64) for v in table.column("embedding").to_pylist()]
    assert orjson.loads(table.schema.metadata[b"mlx_embed"])["task"] == "separation"
    assert_vectors(served, vectors, "separation")
