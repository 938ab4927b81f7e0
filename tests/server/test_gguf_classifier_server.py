"""Our server on a 3-label classifier GGUF (tests/engine/test_gguf_classifier.py's file) with --reranking:
/rerank answers as llama-server does (the first label's raw logit per document), TEI's /predict and vLLM's
/classify score every label the file names, and /v1/embeddings is refused in llama's error shape."""
from __future__ import annotations

import numpy as np

from tests.engine.test_gguf_classifier import DOCUMENTS, LABELS, QUERY, classifier_gguf, folder  # noqa: F401
from tests.server.harness import ServerProcess


def test_classifier_gguf_serves_rerank_predict_and_classify(classifier_gguf):  # noqa: F811
    from tests.peer_llama import LlamaServer

    with LlamaServer(classifier_gguf, "--reranking") as llama:
        theirs = llama.post("/rerank", {"query": QUERY, "documents": DOCUMENTS})
    with ServerProcess("-m", str(classifier_gguf), "--reranking") as srv:
        ours = srv.post("/rerank", {"query": QUERY, "documents": DOCUMENTS}).json()
        predicted = srv.post("/predict", {"inputs": [[QUERY, DOCUMENTS[0]]], "raw_scores": True}).json()[0]
        classified = srv.post("/classify", {"input": DOCUMENTS[:2]}).json()
        refused = srv.post("/v1/embeddings", {"input": "hello"})
    assert [r["index"] for r in ours["results"]] == [r["index"] for r in theirs["results"]]
    np.testing.assert_allclose([r["relevance_score"] for r in ours["results"]],
                               [r["relevance_score"] for r in theirs["results"]], rtol=0, atol=1e-3)
    assert sorted(item["label"] for item in predicted) == sorted(LABELS)
    first = {item["label"]: item["score"] for item in predicted}[LABELS[0]]  # the pair's first logit: its rank
    assert abs(first - next(r["relevance_score"] for r in theirs["results"] if r["index"] == 0)) < 1e-3
    assert [row["num_classes"] for row in classified["data"]] == [3, 3]
    assert all(abs(sum(row["probs"]) - 1) < 1e-6 and row["label"] == LABELS[int(np.argmax(row["probs"]))]
               for row in classified["data"])
    assert refused.status_code == 400 and "not embeddings" in refused.json()["error"]["message"]
