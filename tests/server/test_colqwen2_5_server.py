"""A ColQwen2.5 checkpoint served with `-m DIR --embedding`: pages and queries through the real server, one
vector per token, equal to colpali-engine's."""
from __future__ import annotations

import base64

import pytest

from tests.engine.families import colqwen2_5_fixture as fixture
from tests.engine.families.test_colqwen2_5 import (BLOCK, PAGES, QUERIES, assert_rows_match, document, query,
                                                    reference_rows)
from tests.server.harness import ServerProcess

pytestmark = pytest.mark.filterwarnings("ignore:Palette images with Transparency")


@pytest.fixture(scope="module")
def colpali(tmp_path_factory):
    import transformers

    folder = tmp_path_factory.mktemp("colqwen2_5-server") / "model"
    reference = fixture.make_checkpoint(folder)
    return folder, reference, transformers.AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def server(colpali):
    srv = ServerProcess("-m", str(colpali[0]), "--embedding", "-t", "2").start()
    yield srv
    srv.stop()


def test_pages_and_queries_give_colpali_engines_token_vectors(server, colpali):
    import numpy as np

    page = base64.b64encode(PAGES[1]).decode()
    response = server.post("/embeddings", json={"content": [
        {"prompt_string": "<__media__>", "multimodal_data": [page]}, QUERIES[0]]})
    assert response.status_code == 200, response.text
    ours = [np.array(item["embedding"]) for item in response.json()]
    expected = [reference_rows(colpali, document(BLOCK, "Describe the image."), [PAGES[1]]),
                reference_rows(colpali, query(QUERIES[0]))]
    for rows, theirs in zip(ours, expected, strict=True):
        assert_rows_match(rows, theirs)  # one unit vector per real token, the page's image tokens included


def test_props_and_models_say_it_takes_images(server):
    props = server.get("/props").json()
    assert props["modalities"]["vision"] is True
    models = server.get("/v1/models").json()
    assert "multimodal" in models["models"][0]["capabilities"]
    assert models["models"][0]["details"]["family"] == "colqwen2_5"
