"""TEI's native routes on the real server with the bundled MiniLM: huggingface_hub's InferenceClient(base_url)
(feature_extraction, sentence_similarity) gets our /v1/embeddings vectors, and the other routes answer TEI's
shapes (Left truncation against the `tokenizers` library cutting from the left)."""
from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.conftest import minilm_dir
from tests.server.harness import ServerProcess

TEXTS = ["The cat sits on the mat.", "Où est la gare ?", "A 200-page report on 3.5% growth"]


@pytest.fixture(scope="module")
def server():
    with ServerProcess("-m", str(minilm_dir()), "--embedding", "--offline") as srv:
        yield srv


@pytest.fixture(autouse=True)
def hub_client_online(monkeypatch):
    """InferenceClient refuses every request in the Hub library's offline mode (HF_HUB_OFFLINE, which other tests
    of the suite set and the library reads once at import), even to a local base_url: this server is local."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def oai_vectors(server, body: dict) -> np.ndarray:
    res = server.post("/v1/embeddings", body)
    assert res.status_code == 200, res.text
    return np.asarray([item["embedding"] for item in res.json()["data"]])


def test_inference_client_feature_extraction(server):
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=server.base)
    want = oai_vectors(server, {"input": TEXTS})
    for i, text in enumerate(TEXTS):
        got = client.feature_extraction(text)
        np.testing.assert_allclose(np.asarray(got).reshape(-1), want[i], rtol=1e-5, atol=1e-6)
    raw = client.feature_extraction(TEXTS[0], normalize=False)
    np.testing.assert_allclose(np.asarray(raw).reshape(-1), oai_vectors(server, {"input": TEXTS[0],
                                                                                  "embd_normalize": -1})[0],
                               rtol=1e-5, atol=1e-6)


def test_inference_client_sentence_similarity(server):
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=server.base)
    got = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS)
    vectors = oai_vectors(server, {"input": TEXTS})
    np.testing.assert_allclose(got, vectors @ vectors[0], rtol=1e-5, atol=1e-6)


def test_embed_and_similarity_routes(server):
    res = server.post("/embed", {"inputs": TEXTS})
    assert res.status_code == 200
    np.testing.assert_allclose(res.json(), oai_vectors(server, {"input": TEXTS}), rtol=1e-5, atol=1e-6)
    cut = server.post("/embed", {"inputs": TEXTS[0], "dimensions": 8}).json()
    np.testing.assert_allclose(cut, oai_vectors(server, {"input": TEXTS[0], "dimensions": 8}), rtol=1e-5, atol=1e-6)
    sim = server.post("/similarity", {"inputs": {"source_sentence": TEXTS[1], "sentences": TEXTS}})
    assert sim.status_code == 200
    assert sim.json()[1] == pytest.approx(1.0, abs=1e-6)


def test_truncation_directions(server):
    long = " ".join(f"word{i % 50} w{i}" for i in range(400))
    too_long = server.post("/embed", {"inputs": long})
    assert too_long.status_code == 413
    assert too_long.json()["error_type"] == "Validation"
    n_kept = server.post("/v1/embeddings", {"input": long, "truncate": True}).json()["usage"]["prompt_tokens"]
    reference = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    reference.no_padding()
    for direction in ("left", "right"):
        reference.enable_truncation(n_kept, direction=direction)
        ids = reference.encode(long).ids
        got = server.post("/embed", {"inputs": long, "truncate": True, "truncation_direction": direction.title()})
        assert got.status_code == 200, got.text
        np.testing.assert_allclose(got.json()[0], oai_vectors(server, {"input": ids})[0], rtol=1e-5, atol=1e-6)


def test_tokenize_decode_and_info(server):
    text = "Café naïve!"
    res = server.post("/tokenize", {"inputs": text})
    assert res.status_code == 200
    tokens = res.json()[0]
    llama_ids = server.post("/tokenize", {"content": text, "add_special": True}).json()["tokens"]
    assert [t["id"] for t in tokens] == llama_ids
    assert tokens[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    raw = text.encode("utf-8")
    for token in tokens[1:-1]:
        assert raw[token["start"]:token["stop"]].decode("utf-8") == token["text"]
    decoded = server.post("/decode", {"ids": llama_ids}).json()
    assert decoded == ["cafe naive!"]
    assert server.post("/decode", {"ids": llama_ids, "skip_special_tokens": False}).json() == ["[CLS] cafe naive! [SEP]"]
    bad = server.post("/decode", {"ids": [10 ** 9]})
    assert (bad.status_code, bad.json()["error_type"]) == (422, "Tokenizer")
    info = server.get("/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] >= 256
    assert server.get("/health").status_code == 200
