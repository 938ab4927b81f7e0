"""A SiglipModel served with `-m DIR --embedding`: its text tower through the real server."""
from __future__ import annotations

import pytest

from tests.engine.families.siglip_fixture import TEXT_WIDTH, make_checkpoint
from tests.engine.families.test_siglip import LONG, TEXTS, reference
from tests.engine.helpers import cosine
from tests.server.harness import ServerProcess


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("siglip-server") / "model")


@pytest.fixture(scope="module")
def server(folder):
    srv = ServerProcess("-m", str(folder), "--embedding", "-t", "2").start()
    yield srv
    srv.stop()


def test_text_embeddings_match_transformers(server, folder):
    _, expected = reference(folder, TEXTS)
    body = server.post("/v1/embeddings", json={"input": TEXTS}).json()
    for item, theirs in zip(body["data"], expected, strict=True):
        assert cosine(item["embedding"], theirs) >= 0.99999
    assert body["usage"]["prompt_tokens"] == sum(len(server.post("/tokenize", json={"content": t, "add_special": True})
                                                     .json()["tokens"]) for t in TEXTS)


def test_inputs_over_64_tokens_are_refused_unless_truncated(server, folder):
    refused = server.post("/v1/embeddings", json={"input": LONG})
    assert refused.status_code == 400 and "too large" in refused.json()["error"]["message"]
    _, expected = reference(folder, [LONG], truncation=True)
    body = server.post("/v1/embeddings", json={"input": LONG, "truncate": True}).json()
    assert body["usage"]["prompt_tokens"] == TEXT_WIDTH
    assert cosine(body["data"][0]["embedding"], expected[0]) >= 0.99999


def test_props_report_the_fixed_width(server):
    props = server.get("/props").json()
    assert (props["max_seq"], props["widths"]) == (TEXT_WIDTH, [TEXT_WIDTH])
    assert server.get("/v1/models").json()["data"][0]["meta"]["n_embd"] == 32
