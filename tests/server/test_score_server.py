"""vLLM's /score on the real server with the bundled cross-encoder, against sentence-transformers' CrossEncoder
on the same weights: sigmoid of the logit by default (vLLM's activation for a one-label cross-encoder), the raw
logit with use_activation false (what /rerank returns), 1:N and N:N."""
from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import ce_fixture_dir
from tests.server.harness import ServerProcess

CE = str(ce_fixture_dir())
EPS = 1e-4
QUERIES = ["What is the capital of France?", "Machine learning is"]
DOCS = ["Paris is the capital of France.", "Learning is the process of acquiring new understanding."]


@pytest.fixture(scope="module")
def logits():
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(CE, activation_fn=torch.nn.Identity(), device="cpu")
    return lambda pairs: [float(x) for x in model.predict(pairs)]


@pytest.fixture(scope="module")
def server():
    with ServerProcess("-m", CE, "--reranking", "--offline", "--ctx-size", "512") as srv:
        yield srv


def scores(res) -> list[float]:
    assert res.status_code == 200, res.text
    return [item["score"] for item in res.json()["data"]]


def test_one_to_n_default_is_the_sigmoid(server, logits):
    want = logits([(QUERIES[0], d) for d in DOCS])
    got = scores(server.post("/score", {"text_1": QUERIES[0], "text_2": DOCS}))
    assert got == pytest.approx([1 / (1 + math.exp(-x)) for x in want], abs=EPS)
    raw = scores(server.post("/v1/score", {"queries": QUERIES[0], "documents": DOCS, "use_activation": False}))
    assert raw == pytest.approx(want, abs=EPS)
    rerank = server.post("/rerank", {"query": QUERIES[0], "documents": DOCS}).json()["results"]
    assert raw == pytest.approx([next(r["relevance_score"] for r in rerank if r["index"] == i) for i in (0, 1)],
                                abs=1e-6)


def test_n_to_n_pairs_element_by_element(server, logits):
    want = logits(list(zip(QUERIES, DOCS)))
    got = scores(server.post("/v1/score", {"text_1": QUERIES, "text_2": DOCS, "use_activation": False}))
    assert got == pytest.approx(want, abs=EPS)
    res = server.post("/score", {"text_1": QUERIES, "text_2": DOCS + ["x"]})
    assert res.status_code == 400 and "1:1, 1:N or N:N" in res.json()["error"]["message"]
