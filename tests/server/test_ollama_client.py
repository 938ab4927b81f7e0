"""The real `ollama` Python client against the real server on the bundled all-MiniLM-L6-v2: embed, embeddings,
list, show, ps, the API key, a several-model server's names, keep_alive 0, and Ollama's errors. The vectors are
our /v1/embeddings ones normalized as Ollama does: /api/embed always L2-normalized; the legacy /api/embeddings
normalized for MiniLM (its modules end in Normalize) and raw for a copy without that module
(`legacyEmbeddingsWereRaw` in Ollama's llm/llama_server.go)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

ollama = pytest.importorskip("ollama")

from tests.conftest import minilm_dir  # noqa: E402
from tests.server.harness import ServerProcess  # noqa: E402

KEY = "sk-ollama-test"
TEXTS = ["The cat sits on the mat.", "Où est la gare ?"]


def _v1(server: ServerProcess, texts: list[str], headers: dict | None = None, **extra) -> np.ndarray:
    res = server.post("/v1/embeddings", {"input": texts, **extra}, headers=headers)
    assert res.status_code == 200, res.text
    return np.asarray([item["embedding"] for item in res.json()["data"]])


@pytest.fixture(scope="module")
def server():
    with ServerProcess("-m", str(minilm_dir()), "--embedding", "--offline", "--alias", "all-minilm",
                       "--api-key", KEY) as srv:
        srv.wait_ready(headers={"Authorization": f"Bearer {KEY}"})
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.base, headers={"Authorization": f"Bearer {KEY}"})


def test_embed_matches_v1_embeddings_l2_normalized(server, client):
    want = _v1(server, TEXTS, headers={"Authorization": f"Bearer {KEY}"}, embd_normalize=2)
    got = client.embed(model="all-minilm", input=TEXTS)
    assert got.model == "all-minilm"
    np.testing.assert_allclose(np.asarray(got.embeddings), want, rtol=1e-6, atol=1e-7)
    assert got.prompt_eval_count > len(TEXTS) and got.total_duration >= got.load_duration >= 0
    one = client.embed(model="all-minilm:latest", input=TEXTS[0], dimensions=16)
    cut = want[0, :16] / np.linalg.norm(want[0, :16])
    np.testing.assert_allclose(one.embeddings[0], cut, rtol=1e-5, atol=1e-7)


def test_legacy_embeddings_keep_minilms_normalization(server, client):
    want = _v1(server, TEXTS[:1], headers={"Authorization": f"Bearer {KEY}"}, embd_normalize=2)[0]
    got = client.embeddings(model="all-minilm", prompt=TEXTS[0])
    np.testing.assert_allclose(got.embedding, want, rtol=1e-6, atol=1e-7)


def test_truncate_false_is_ollamas_error(client):
    long_text = "word " * 600
    assert len(client.embed(model="all-minilm", input=long_text).embeddings) == 1  # truncated by default
    with pytest.raises(ollama.ResponseError) as caught:
        client.embed(model="all-minilm", input=long_text, truncate=False)
    assert caught.value.status_code == 400 and caught.value.error == "the input length exceeds the context length"


def test_list_show_and_ps(client):
    listed = client.list().models
    assert [m.model for m in listed] == ["all-minilm:latest"]
    assert listed[0].details.family == "bert" and listed[0].size > 0
    shown = client.show("all-minilm")
    assert shown.capabilities == ["embedding"] and shown.modelinfo["bert.embedding_length"] == 384
    assert [m.model for m in client.ps().models] == ["all-minilm:latest"]


def test_the_key_is_required(server):
    with pytest.raises(ollama.ResponseError) as caught:
        ollama.Client(host=server.base).embed(model="all-minilm", input="x")
    assert caught.value.status_code == 401


@pytest.fixture(scope="module")
def raw_minilm(tmp_path_factory) -> Path:
    """MiniLM without its Normalize module: Ollama's legacy route answers its vectors raw."""
    folder = tmp_path_factory.mktemp("minilm-raw") / "minilm-raw"
    shutil.copytree(minilm_dir(), folder)
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps([m for m in modules if not m["type"].endswith("Normalize")]))
    return folder


def test_several_models_names_raw_legacy_keep_alive_and_404(raw_minilm):
    with ServerProcess("--embedding-model", f"{minilm_dir()}=minilm", "--embedding-model", f"{raw_minilm}=raw",
                       "--offline") as server:
        client = ollama.Client(host=server.base)
        assert [m.model for m in client.list().models] == ["minilm:latest", "raw:latest"]
        raw = client.embeddings(model="raw:latest", prompt=TEXTS[0]).embedding
        want = _v1(server, TEXTS[:1], model="raw", embd_normalize=-1)[0]
        np.testing.assert_allclose(raw, want, rtol=1e-6, atol=1e-7)
        assert abs(np.linalg.norm(raw) - 1) > 1e-3  # really unnormalized
        normalized = client.embed(model="raw", input=TEXTS[0]).embeddings[0]
        np.testing.assert_allclose(normalized, want / np.linalg.norm(want), rtol=1e-5, atol=1e-7)
        assert "raw:latest" in [m.model for m in client.ps().models]
        client.embed(model="raw", input=TEXTS[0], keep_alive=0)
        assert "raw:latest" not in [m.model for m in client.ps().models]
        with pytest.raises(ollama.ResponseError) as caught:
            client.embed(model="llama3:8b", input="x")
        assert caught.value.status_code == 404 and caught.value.error == "model 'llama3:8b' not found"
