"""`-m DIR --embedding` on decoder backbones, end to end: Qwen3-Embedding's layout (last-token pooling from
1_Pooling) against sentence-transformers, and a causal Llama without pooling information, which gets
llama-server's default for a decoder (pooling none)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.engine.families.decoder_fixture import TEXTS, save_random
from tests.engine.families.test_qwen3 import LASTTOKEN_POOLING, ST_MODULES
from tests.server.harness import ServerProcess


@pytest.fixture(scope="module")
def qwen3_embedding(tmp_path_factory):
    return save_random(tmp_path_factory.mktemp("srv_qwen3") / "m", "Qwen3Model", "Qwen3Config", seed=7,
                       append_eos=True, files={"modules.json": ST_MODULES, "1_Pooling/config.json": LASTTOKEN_POOLING})[0]


def test_qwen3_embedding_served_with_embedding_matches_sentence_transformers(qwen3_embedding):
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(qwen3_embedding), device="cpu").encode(TEXTS, normalize_embeddings=True)
    with ServerProcess("-m", str(qwen3_embedding), "--embedding", "--metrics") as srv:
        res = srv.post("/v1/embeddings", {"input": TEXTS, "encoding_format": "float"})
        assert res.status_code == 200
        for item, want in zip(res.json()["data"], expected, strict=True):
            assert float(np.dot(item["embedding"], want)) >= 0.99999
        props = srv.get("/props").json()
        assert props["family"] == "qwen3"
        meta = srv.get("/v1/models").json()
        assert meta["models"][0]["details"]["family"] == "qwen3"
        assert meta["data"][0]["meta"]["n_embd"] == 64 and meta["data"][0]["meta"]["ftype"] == "F32"
        assert "llamacpp:prompt_tokens_total" in srv.get("/metrics").text


def test_causal_llama_defaults_to_pooling_none_as_llama_server(tmp_path):
    folder, _ = save_random(tmp_path / "m", "LlamaForCausalLM", "LlamaConfig", seed=8)
    with ServerProcess("-m", str(folder), "--embedding") as srv:
        res = srv.post("/v1/embeddings", {"input": "hello world"})
        assert res.status_code == 400 and "not OAI compatible" in res.json()["error"]["message"]
        n_tokens = len(srv.post("/tokenize", {"content": "hello world"}).json()["tokens"])
        body = srv.post("/embedding", {"content": "hello world"}).json()
        assert len(body[0]["embedding"]) == n_tokens and len(body[0]["embedding"][0]) == 64
        assert srv.get("/props").json()["family"] == "llama"
