"""A sequence classifier on the real server: huggingface_hub's InferenceClient(base_url).text_classification gets
transformers' label probabilities (best first, top_k and function_to_apply honoured), under --reranking and with
no mode flag, and the API key and /metrics cover /predict and /classify as every route."""
from __future__ import annotations

import numpy as np
import pytest

from tests.engine.test_classifier import SENTIMENT, TEXTS, make_bert_classifier, reference
from tests.server.harness import ServerProcess

ATOL = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_bert_classifier(tmp_path_factory.mktemp("bert-cls"), SENTIMENT)


@pytest.fixture(autouse=True)
def hub_client_online(monkeypatch):
    """InferenceClient refuses every request in the Hub library's offline mode (HF_HUB_OFFLINE, which other tests
    set and the library reads once at import), even to a local base_url: this server is local."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.mark.parametrize("mode", [(), ("--reranking",)])
def test_inference_client_text_classification(checkpoint, mode):
    from huggingface_hub import InferenceClient

    logits, probs = reference(checkpoint, TEXTS[:2])
    with ServerProcess("-m", str(checkpoint), "--offline", *mode) as server:
        client = InferenceClient(base_url=server.base)
        for text, row, raw in zip(TEXTS[:2], probs, logits):
            got = client.text_classification(text)
            order = np.argsort(-row, kind="stable")
            assert [g.label for g in got] == [SENTIMENT[int(i)] for i in order]
            np.testing.assert_allclose([g.score for g in got], row[order], rtol=0, atol=ATOL)
            top = client.text_classification(text, top_k=1, function_to_apply="none")
            assert len(top) == 1 and top[0].label == SENTIMENT[int(order[0])]
            assert top[0].score == pytest.approx(float(raw[order[0]]), abs=ATOL)


def test_api_key_and_metrics_cover_the_classify_routes(checkpoint):
    with ServerProcess("-m", str(checkpoint), "--offline", "--api-key", "k", "--metrics") as server:
        assert server.post("/predict", {"inputs": TEXTS[0]}).status_code == 401
        assert server.post("/classify", {"input": TEXTS[0]}).status_code == 401
        auth = {"Authorization": "Bearer k"}
        predicted = server.post("/predict", {"inputs": [[TEXTS[0]], [TEXTS[1]]]}, headers=auth)
        assert predicted.status_code == 200 and len(predicted.json()) == 2
        classified = server.post("/classify", {"input": TEXTS[:2]}, headers=auth)
        assert classified.status_code == 200
        n_tokens = classified.json()["usage"]["prompt_tokens"]
        metrics = server.get("/metrics", headers=auth).text
        line = next(ln for ln in metrics.splitlines() if ln.startswith("llamacpp:prompt_tokens_total"))
        assert float(line.split()[-1]) == 2 * n_tokens  # both requests' tokens (the same two texts)
