"""The real cohere SDK (Client v1 and ClientV2) against our /v1/embed and /v2/embed on all-MiniLM-L6-v2 with
query / passage prompts: every embedding_types value, the floats equal to our /v1/embeddings vectors (with the
prompt input_type picks), the compact codes equal to their documented quantization, binary / ubinary to
sentence-transformers' quantize_embeddings of the same vectors."""
from __future__ import annotations

import base64

import cohere
import numpy as np
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from engine import dequantize, quantize
from tests.server.harness import ServerProcess
from tests.server.test_prompts_dimensions import TEXTS, prompted_minilm  # noqa: F401  (the fixture)

TYPES = ["float", "int8", "uint8", "binary", "ubinary", "base64"]


@pytest.fixture(scope="module")
def server(prompted_minilm):  # noqa: F811
    with ServerProcess("-m", str(prompted_minilm), "--embedding", "--offline") as srv:
        yield srv


def ours(server, prompt_name: str, **extra) -> np.ndarray:
    res = server.post("/v1/embeddings", {"input": TEXTS, "prompt_name": prompt_name, **extra})
    assert res.status_code == 200, res.text
    return np.asarray([item["embedding"] for item in res.json()["data"]], dtype=np.float32)


def same_vectors(got, want: np.ndarray) -> np.ndarray:
    """Two requests may be batched differently: equal within float32 noise."""
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape and np.allclose(got, want, rtol=0, atol=1e-6)
    return got


def check_by_type(embeddings, want: np.ndarray) -> None:
    """`want`: /v1/embeddings' floats; the codes are those of this answer's own floats."""
    floats = same_vectors(embeddings.float_, want)
    decoded = np.stack([np.frombuffer(base64.b64decode(s), dtype="<f4") for s in embeddings.base64])
    assert np.array_equal(decoded, floats)
    want = floats
    for kind in ("binary", "ubinary"):
        got = np.asarray(getattr(embeddings, kind))
        assert got.shape == (len(TEXTS), -(-want.shape[1] // 8))
        assert np.array_equal(got, quantize_embeddings(want, precision=kind))
    for kind in ("int8", "uint8"):
        got = np.asarray(getattr(embeddings, kind))
        assert np.array_equal(got, quantize(want, kind))
        back = dequantize(got, kind)
        assert np.min(np.sum(back * want, axis=1) / np.linalg.norm(back, axis=1)) > 0.998


def test_cohere_v1_client(server):
    client = cohere.Client(base_url=server.base, api_key="x")
    legacy = client.embed(texts=TEXTS, model="embed-english-v3.0", input_type="search_query")
    assert legacy.response_type == "embeddings_floats" and legacy.texts == TEXTS
    same_vectors(legacy.embeddings, ours(server, "query"))
    assert legacy.meta.billed_units.input_tokens > 0
    typed = client.embed(texts=TEXTS, model="embed-english-v3.0", input_type="search_document",
                         embedding_types=TYPES)
    assert typed.response_type == "embeddings_by_type"
    check_by_type(typed.embeddings, ours(server, "passage"))


def test_cohere_v2_client(server):
    client = cohere.ClientV2(base_url=server.base, api_key="x")
    res = client.embed(texts=TEXTS, model="embed-v4.0", input_type="search_document", embedding_types=TYPES,
                       output_dimension=256)
    assert res.meta.api_version.version == "2" and res.id
    want = ours(server, "passage", dimensions=256)
    assert np.allclose(np.linalg.norm(want, axis=1), 1, atol=1e-6)
    check_by_type(res.embeddings, want)
    full = client.embed(texts=TEXTS, model="embed-v4.0", input_type="search_query", embedding_types=TYPES)
    check_by_type(full.embeddings, ours(server, "query"))


def test_cohere_errors_reach_the_sdk(server):
    client = cohere.ClientV2(base_url=server.base, api_key="x")
    with pytest.raises(cohere.errors.BadRequestError) as info:
        client.embed(texts=["word " * 1000], model="m", input_type="search_query", embedding_types=["float"],
                     truncate="NONE")
    assert "too large" in info.value.body["message"]


def test_oai_compact_formats_are_the_documented_codes(server):
    want = ours(server, "query")
    for kind in ("int8", "uint8", "binary", "ubinary"):
        got = server.post("/v1/embeddings", {"input": TEXTS, "prompt_name": "query", "encoding_format": kind}).json()
        codes = np.asarray([item["embedding"] for item in got["data"]])
        if kind.endswith("binary"):  # a sign that flips within float32 noise would be a different bit
            assert np.mean(codes != quantize(want, kind)) < 0.01
        else:
            assert np.abs(codes.astype(np.int16) - quantize(want, kind)).max() <= 1
