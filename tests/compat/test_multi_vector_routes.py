"""A multi-vector model (the tiny random ColIdefics3) through the app: one list of rows per input on every
embedding route, llama's multimodal_data and OpenAI content parts alike, `dimensions` refused, /props and
/v1/models saying so, and /maxsim + /v1/maxsim ranking by colpali-engine's MaxSim; a single-vector model's
/maxsim is 400. The engine is real (in process), the routes run under falcon's test client."""
from __future__ import annotations

import base64

import numpy as np
import pytest
from falcon.testing import TestClient

from compat.app import create_app
from compat.settings import parse_settings
from tests.conftest import minilm_dir
from tests.engine.families import colidefics3_fixture as fx
from tests.engine.families.test_siglip import png_images
from tests.engine.helpers import cosine, start_engine
from tests.server.harness import b64, image_part

IMAGES = png_images(3, seed=11)
QUERY = "What was the total revenue in 2023?"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return fx.make_checkpoint(tmp_path_factory.mktemp("colidefics3-routes") / "model")


@pytest.fixture(scope="module")
def reference(folder):
    model, processor = fx.reference_model(folder), fx.reference_processor(folder)
    return {"query": fx.reference_queries(model, processor, [QUERY])[0],
            "pages": fx.reference_images(model, processor, IMAGES)}


@pytest.fixture(scope="module")
def client(folder):
    eng = start_engine(folder)
    settings = parse_settings(["-m", str(folder), "--embedding", "--metrics", "--image-max-count", "4"], {},
                              system_config_files=[])
    yield TestClient(create_app(settings, eng))
    eng.close()


def assert_rows(rows, expected) -> None:
    rows = np.asarray(rows)
    assert rows.shape == expected.shape
    assert min(cosine(a, b) for a, b in zip(rows, expected)) >= 0.9999
    np.testing.assert_allclose(rows, expected, atol=1e-5, rtol=0)


def test_every_embedding_route_answers_rows_per_input(client, reference):
    oai = client.simulate_post("/v1/embeddings", json={"input": [QUERY, image_part(IMAGES[0]), image_part(IMAGES[1])]})
    assert oai.status_code == 200, oai.text
    data = oai.json["data"]
    assert_rows(data[0]["embedding"], reference["query"])
    assert_rows(data[1]["embedding"], reference["pages"][0])
    assert_rows(data[2]["embedding"], reference["pages"][1])
    n_rows = sum(len(item["embedding"]) for item in data)
    assert oai.json["usage"] == {"prompt_tokens": n_rows, "total_tokens": n_rows}  # image tokens counted
    llama = client.simulate_post("/embedding", json={"content": [
        {"prompt_string": "<__media__>", "multimodal_data": [b64(IMAGES[0])]}, QUERY]})
    assert llama.status_code == 200, llama.text
    np.testing.assert_allclose(llama.json[0]["embedding"], data[1]["embedding"], atol=1e-6)  # either spelling
    np.testing.assert_allclose(llama.json[1]["embedding"], data[0]["embedding"], atol=1e-6)
    packed = client.simulate_post("/v1/embeddings", json={"input": [QUERY], "encoding_format": "base64"}).json
    rows = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), "<f4").reshape(-1, 128)
    np.testing.assert_allclose(rows, data[0]["embedding"], atol=1e-6)
    raw = client.simulate_post("/v1/embeddings", json={"input": [QUERY], "embd_normalize": -1}).json
    np.testing.assert_allclose(raw["data"][0]["embedding"], data[0]["embedding"], atol=1e-6)  # rows as the model made them


def test_dimensions_and_instructions_are_refused(client):
    res = client.simulate_post("/v1/embeddings", json={"input": [QUERY], "dimensions": 64})
    assert res.status_code == 400
    assert res.json["error"]["message"].startswith('"dimensions" is not supported by a multi-vector model')
    res = client.simulate_post("/v1/embeddings", json={"input": [QUERY], "instruction": "Find pages"})
    assert res.status_code == 400 and "builds its own query and document prompts" in res.json["error"]["message"]


def test_props_and_models_say_multi_vector_and_images(client):
    props = client.simulate_get("/props").json
    assert props["multi_vector"] is True and props["dimensions"] is None
    assert props["input_modalities"] == ["text", "image"] and props["modalities"]["vision"] is True
    meta = client.simulate_get("/v1/models").json["data"][0]["meta"]
    assert meta["multi_vector"] is True and meta["n_embd"] == 128


@pytest.mark.parametrize("path", ["/maxsim", "/v1/maxsim"])
def test_maxsim_ranks_documents_like_colpali(client, reference, path):
    documents = [image_part(IMAGES[0]), {"image": f"data:image/png;base64,{b64(IMAGES[1])}"},
                 {"prompt_string": "<__media__>", "multimodal_data": [b64(IMAGES[2])]}]
    before = client.simulate_get("/metrics").text
    res = client.simulate_post(path, json={"query": QUERY, "documents": documents, "top_n": 2,
                                           "return_documents": True})
    assert res.status_code == 200, res.text
    expected = [fx.maxsim(reference["query"], page) for page in reference["pages"]]
    order = sorted(range(3), key=lambda i: -expected[i])[:2]
    assert [r["index"] for r in res.json["results"]] == order
    for result in res.json["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-4)
        assert result["document"] == documents[result["index"]]
    n_tokens = len(reference["query"]) + sum(len(page) for page in reference["pages"])
    assert res.json["usage"]["prompt_tokens"] == n_tokens  # every input, image tokens included
    assert _prompt_tokens(client.simulate_get("/metrics").text) - _prompt_tokens(before) == n_tokens


def _prompt_tokens(metrics: str) -> float:
    return next(float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("llamacpp:prompt_tokens_total"))


def test_maxsim_refuses_images_beyond_the_limit_and_bad_items(client):
    res = client.simulate_post("/maxsim", json={"query": QUERY, "documents": [image_part(IMAGES[0])] * 5})
    assert res.status_code == 400 and "at most 4 are allowed (--image-max-count)" in res.json["error"]["message"]
    res = client.simulate_post("/maxsim", json={"query": QUERY, "documents": [image_part(b"not a png")]})
    assert res.status_code == 400 and res.json["error"]["message"].startswith("document 0: not an image")


def test_maxsim_on_a_single_vector_model_is_400():
    eng = start_engine(minilm_dir())
    try:
        settings = parse_settings(["-m", str(minilm_dir()), "--embedding"], {}, system_config_files=[])
        res = TestClient(create_app(settings, eng)).simulate_post("/maxsim", json={"query": "q", "documents": ["d"]})
    finally:
        eng.close()
    assert res.status_code == 400
    assert res.json["error"]["message"].startswith("MaxSim needs a multi-vector (late-interaction) model")


def test_answers_validate_against_the_openapi_document(client):
    from tests.compat.test_openapi import _validate

    document = client.simulate_get("/openapi.json").json
    for path, body in [("/v1/embeddings", {"input": [QUERY, image_part(IMAGES[0])]}),
                       ("/v1/embeddings", {"input": [QUERY], "encoding_format": "base64"}),
                       ("/embeddings", {"content": [QUERY]}),
                       ("/maxsim", {"query": QUERY, "documents": [image_part(IMAGES[0]), "a page"]}),
                       ("/v1/maxsim", {"query": QUERY, "texts": ["a page"]})]:
        res = client.simulate_post(path, json=body)
        assert res.status_code == 200, res.text
        _validate(document, path, "post", 200, res.json)
