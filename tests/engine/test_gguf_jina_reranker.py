"""A jina-reranker-v1 GGUF (`jina-bert-v2` with its classifier as `cls`), which has no transformers reference:
written here with the gguf package's writer in the layout of the published files (llama.cpp's converter at
3f545bec refuses JinaBertForSequenceClassification), and scored against the real llama-server on the same file."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from tests.engine.helpers import start_engine
from tests.engine.test_gguf_jina import identity_of, llama_identity, write_jina_bert_gguf

pytest.importorskip("gguf")


def test_jina_reranker_v1_gguf_scores_equal_llama_servers(tmp_path, caplog):
    """jina-reranker-v1's layout: a `cls` classifier (no cls.output, the pooler dropped), a BPE vocabulary with
    pre `jina-v1-en`: llama-server scores `<s> q </s> </s> d </s>` as tanh(cls(h_<s>)), raw."""
    from engine import Pooling
    from tests.peer_llama import LlamaServer

    path = tmp_path / "tiny-jina-reranker-v1-f32.gguf"
    tokenizer = write_jina_bert_gguf(path, "geglu", vocab="bpe", classifier=True)
    query = "Machine learning is"
    docs = ["A machine is a physical system that uses power to apply forces.", "Gravity is a force. " * 4,
            "Machine learning is a field of study in artificial intelligence.", "yes no maybe", "Paris, capitale."]
    with caplog.at_level(logging.WARNING, logger="engine.loading.gguf.load"):
        eng = start_engine(path, pooling=Pooling.RANK, max_seq=128)
    try:
        assert eng.info.is_reranker
        assert caplog.text.count("a jina reranker converted for llama.cpp has no pooler") == 1
        pairs = eng.tokenizer.encode_pairs([(query, doc) for doc in docs])
        got = eng.rerank(query, docs).scores
        identity = identity_of(eng.info)
    finally:
        eng.close(wait=True)
    s, e = tokenizer.convert_tokens_to_ids(["<s>", "</s>"])
    assert pairs[0][0] == [s, *tokenizer.encode(query), e, e, *tokenizer.encode(docs[0]), e]
    with LlamaServer(path, "--reranking") as llama:
        theirs = llama.rerank(query, docs)
        theirs_identity = llama_identity(llama)
    assert identity == theirs_identity
    assert max(abs(a) for a in theirs) < 1 and np.ptp(theirs) > 0.05  # tanh'd, and told apart
    np.testing.assert_allclose(got, theirs, atol=1e-3)  # measured 4.7e-4 (erf GELU here, ggml's table there)
