"""An LFM2 ColBERT checkpoint (pylate's layout) served with `-m DIR --embedding`: queries and documents through the
real server's routes in pylate's formats (test_lfm2_colbert.py's reference), MaxSim on /maxsim and /v1/maxsim."""
from __future__ import annotations

import numpy as np
import pytest

from tests.engine.families.test_lfm2_colbert import CONFIG, TEXTS, assert_rows_match, build_colbert, pylate_encode
from tests.server.harness import ServerProcess


@pytest.fixture(scope="module")
def colbert(tmp_path_factory):
    return build_colbert(tmp_path_factory.mktemp("lfm2-colbert-server") / "m", CONFIG)


@pytest.fixture(scope="module")
def server(colbert):
    with ServerProcess("-m", str(colbert[0]), "--embedding", "-t", "2") as srv:
        yield srv


def test_embedding_routes_take_the_role_from_prompt_name(server, colbert):
    for role in ("query", "document"):
        expected = pylate_encode(*colbert, TEXTS[:4], role == "query")
        oai = server.post("/v1/embeddings", json={"input": TEXTS[:4], "prompt_name": role})
        assert oai.status_code == 200, oai.text
        assert_rows_match([np.array(item["embedding"]) for item in oai.json()["data"]], expected)
        llama = server.post("/embeddings", json={"content": TEXTS[:4], "prompt_name": role})
        assert llama.status_code == 200, llama.text
        assert_rows_match([np.array(item["embedding"]) for item in llama.json()], expected)
    unknown = server.post("/v1/embeddings", json={"input": TEXTS[0], "prompt_name": "passage"})
    assert unknown.status_code == 400 and "'query' or a 'document'" in unknown.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/maxsim", "/v1/maxsim"])
def test_maxsim_route_scores_as_pylate(server, colbert, path):
    query, documents = TEXTS[1], [TEXTS[2], TEXTS[-2], TEXTS[3], TEXTS[-1]]
    q = pylate_encode(*colbert, [query], True)[0]
    expected = [float((q @ d.T).max(axis=1).sum()) for d in pylate_encode(*colbert, documents, False)]
    response = server.post(path, json={"query": query, "documents": documents, "return_documents": True})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["index"] for r in results] == sorted(range(len(documents)), key=lambda i: (-expected[i], i))
    for result in results:
        assert abs(result["relevance_score"] - expected[result["index"]]) < 1e-4
        assert result["document"]["text"] == documents[result["index"]]
    refused = server.post(path, json={"query": query, "documents": documents, "instruction": "x"})
    assert refused.status_code == 400
    assert server.get("/health").status_code == 200
