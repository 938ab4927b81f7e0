"""The real server on llama.cpp GGUF files: `-m FILE.gguf` and `-hf org/repo:QUANT` from the Hugging Face cache,
answering as llama-server did on the same files (shared/fixtures/gguf/NAME.llama-server.json)."""
from __future__ import annotations

import json
import shutil

import numpy as np

from tests.conftest import gguf_fixture
from tests.server.harness import ServerProcess, clean_env, run_cli


def _answers(name: str) -> dict:
    return json.loads(gguf_fixture(f"{name}.llama-server.json").read_text(encoding="utf-8"))


def test_minilm_gguf_serves_llama_servers_ids_vectors_and_identity(tmp_path):
    answers = _answers("minilm-f16")
    shutil.copy(gguf_fixture("minilm-f16.gguf"), tmp_path / "minilm-f16.gguf")
    # llama-server ran in the file's folder with `-m minilm-f16.gguf`: the same here
    with ServerProcess("-m", "minilm-f16.gguf", "--embedding", cwd=tmp_path) as srv:
        props = srv.get("/props").json()
        assert {k: props[k] for k in ("model_path", "model_alias", "bos_token", "eos_token", "total_slots")} == \
            {k: answers["props"][k] for k in ("model_path", "model_alias", "bos_token", "eos_token", "total_slots")}
        assert props["model_ftype"] == "F16"
        model = srv.get("/v1/models").json()
        assert model["data"][0]["id"] == "minilm-f16.gguf"
        assert model["models"][0]["details"]["format"] == "gguf"
        meta = model["data"][0]["meta"]
        assert (meta["vocab_type"], meta["n_vocab"], meta["n_embd"], meta["n_ctx_train"], meta["ftype"]) == \
            (3, 30522, 384, 512, "F16")
        ids = [srv.post("/tokenize", {"content": s, "add_special": True}).json()["tokens"]
               for s in answers["sentences"]]
        assert ids == answers["tokenize"]["ids"]
        data = srv.post("/v1/embeddings", {"input": answers["sentences"]}).json()["data"]
        for item, want in zip(data, answers["embeddings"]["vectors"], strict=True):
            got = np.asarray(item["embedding"])
            assert got @ np.asarray(want) / np.linalg.norm(got) / np.linalg.norm(want) >= 0.9999
        assert srv.post("/detokenize", {"tokens": [101, 7592, 1010, 2088, 999, 102]}).json() == \
            {"content": "[CLS] hello , world ![SEP]"}


def test_reranker_gguf_scores_as_llama_server():
    answers = _answers("bert-tiny-ce-distilled-f32")["rerank"]
    with ServerProcess("-m", str(gguf_fixture("bert-tiny-ce-distilled-f32.gguf")), "--reranking") as srv:
        for result in answers["results"]:
            body = srv.post("/v1/rerank", {"query": result["query"], "documents": answers["documents"]}).json()
            scores = {r["index"]: r["relevance_score"] for r in body["results"]}
            np.testing.assert_allclose([scores[i] for i in range(len(answers["documents"]))], result["scores"],
                                       atol=1e-3)
        assert "cannot reproduce the original checkpoint's scores" in srv.output()


def test_hf_repo_with_a_quant_tag_resolves_a_gguf_offline(tmp_path):
    # The hub cache layout, built by hand: models--org--name/{refs/main, snapshots/<commit>/...}
    repo = tmp_path / "hub" / "models--example-org--minilm-GGUF"
    snapshot = repo / "snapshots" / "0123456789abcdef"
    snapshot.mkdir(parents=True)
    (snapshot / "minilm-Q4_0.gguf").symlink_to(gguf_fixture("minilm-q4_0.gguf"))
    (snapshot / "minilm-F16.gguf").symlink_to(gguf_fixture("minilm-f16.gguf"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123456789abcdef")
    env = clean_env(HF_HUB_CACHE=str(tmp_path / "hub"))
    with ServerProcess("--embedding", "-hf", "example-org/minilm-GGUF:q4_0", "--offline", env=env) as srv:
        props = srv.get("/props").json()
        assert props["model_path"] == str(snapshot / "minilm-Q4_0.gguf") and props["model_ftype"] == "Q4_0"
        assert srv.get("/v1/models").json()["data"][0]["id"] == "example-org/minilm-GGUF:q4_0"
    with ServerProcess("--embedding", "-hf", "example-org/minilm-GGUF", "--hf-file", "minilm-F16.gguf", "--offline",
                       env=env) as srv:
        assert srv.get("/props").json()["model_ftype"] == "F16"
    missing = run_cli("--embedding", "-hf", "example-org/minilm-GGUF:Q5_K_M", "--offline", "--port", "0", env=env)
    assert missing.returncode != 0 and "Q5_K_M" in missing.stderr


def test_modern_bert_gguf_identity_and_vectors_equal_llama_servers(tmp_path):
    """Our server and the real llama-server on the same written `modern-bert` GGUF: /v1/models meta, /props
    special tokens, /tokenize and /v1/embeddings."""
    import requests

    from tests.engine.test_gguf_written import write_modernbert_gguf
    from tests.peer_llama import LlamaServer

    path = tmp_path / "tiny-modernbert-f32.gguf"
    write_modernbert_gguf(path)
    texts = ["hello", "Gravity is a force. " * 12]
    # (this llama-server build reports vocab_type as `true` for every file; ours is llama.h's enum, BPE = 2)
    fields = ("n_vocab", "n_embd", "n_ctx_train", "n_params", "size", "ftype")
    with LlamaServer(path, "--embedding") as llama:
        theirs_meta = requests.get(llama.base + "/v1/models", timeout=30).json()["data"][0]["meta"]
        theirs_props = requests.get(llama.base + "/props", timeout=30).json()
        theirs_ids = [llama.tokenize(s) for s in texts]
        theirs = llama.embeddings(texts)
    with ServerProcess("-m", str(path), "--embedding") as srv:
        meta = srv.get("/v1/models").json()["data"][0]["meta"]
        props = srv.get("/props").json()
        ids = [srv.post("/tokenize", {"content": s, "add_special": True}).json()["tokens"] for s in texts]
        ours = [item["embedding"] for item in srv.post("/v1/embeddings", {"input": texts}).json()["data"]]
    assert {k: meta[k] for k in fields} == {k: theirs_meta[k] for k in fields}
    assert (meta["vocab_type"], meta["ftype"]) == (2, "all F32")
    assert (props["bos_token"], props["eos_token"]) == (theirs_props["bos_token"], theirs_props["eos_token"])
    assert ids == theirs_ids
    for a, b in zip(ours, theirs, strict=True):
        assert np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b) >= 0.9999
