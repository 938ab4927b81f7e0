"""A ColQwen2.5 checkpoint served with `-m DIR --embedding`: pages and queries through the real server, one
vector per token, equal to colpali-engine's."""
from __future__ import annotations

import numpy as np
import pytest

from tests.engine.families import colqwen2_fixture as fixture
from tests.engine.families.test_colqwen2 import (BLOCK, PAGES, QUERIES, assert_rows_match, document, query,
                                                    reference_rows)
from tests.server.harness import ServerProcess, b64

pytestmark = pytest.mark.filterwarnings("ignore:Palette images with Transparency")


@pytest.fixture(scope="module")
def colpali(tmp_path_factory):
    import transformers

    folder = tmp_path_factory.mktemp("colqwen2_5-server") / "model"
    reference = fixture.make_checkpoint(folder)
    return folder, reference, transformers.AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def server(colpali):
    with ServerProcess("-m", str(colpali[0]), "--embedding", "-t", "2") as srv:
        yield srv


def test_both_request_spellings_give_colpali_engines_token_vectors(server, colpali):
    llama = server.post("/embeddings", json={"content": [
        {"prompt_string": "<__media__>", "multimodal_data": [b64(PAGES[1])]}, QUERIES[0]]})
    assert llama.status_code == 200, llama.text
    oai = server.post("/v1/embeddings", json={"input": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PAGES[1])}"}}, QUERIES[0]]})
    assert oai.status_code == 200, oai.text
    expected = [reference_rows(colpali, document(BLOCK, "Describe the image."), [PAGES[1]]),
                reference_rows(colpali, query(QUERIES[0]))]
    llama_rows = [np.array(item["embedding"]) for item in llama.json()]
    oai_rows = [np.array(item["embedding"]) for item in oai.json()["data"]]
    for ours, same, theirs in zip(llama_rows, oai_rows, expected, strict=True):
        assert_rows_match(ours, theirs)  # one unit vector per real token, the page's image tokens included
        np.testing.assert_allclose(ours, same, rtol=0, atol=1e-6)  # the two requests may be batched differently
    assert oai.json()["usage"]["prompt_tokens"] == sum(len(rows) for rows in expected)


def test_maxsim_route_ranks_pages_as_colpali_engine(server, colpali):
    response = server.post("/v1/maxsim", json={"query": QUERIES[1], "documents": [
        {"image": f"data:image/png;base64,{b64(data)}"} for data in PAGES]})
    assert response.status_code == 200, response.text
    ref_query = reference_rows(colpali, query(QUERIES[1]))
    expected = [float((ref_query @ reference_rows(colpali, document(BLOCK, "Describe the image."), [data]).T)
                      .max(axis=1).sum()) for data in PAGES]
    results = response.json()["results"]
    assert [r["index"] for r in results] == sorted(range(len(PAGES)), key=lambda i: (-expected[i], i))
    for result in results:
        assert abs(result["relevance_score"] - expected[result["index"]]) < 1e-4


def test_props_and_models_say_it_takes_images_and_answers_per_token(server):
    props = server.get("/props").json()
    assert props["modalities"]["vision"] is True and props["multi_vector"] is True
    models = server.get("/v1/models").json()
    assert "multimodal" in models["models"][0]["capabilities"]
    assert models["models"][0]["details"]["family"] == "colqwen2"
    refused = server.post("/v1/embeddings", json={"input": QUERIES[0], "dimensions": 64})
    assert refused.status_code == 400
