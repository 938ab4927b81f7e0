"""Images on the rerank routes, through falcon's TestClient over the fake engine: forms, sources, limits, refusals."""
from __future__ import annotations

import base64
import json

import pytest

from engine.types import ImageInput
from tests.compat.fakes import FakeEngine, item_words, pair_score

ROUTES = ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"]
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40  # bytes only: the fake engine does not decode
B64 = base64.b64encode(PNG).decode()
URL = f"data:image/png;base64,{B64}"
MULTIMODAL = "Multimodal data provided, but model does not support multimodal requests."


def vision_engine() -> FakeEngine:
    return FakeEngine(kind="generative-reranker", modalities=("text", "image"))


def error(res) -> tuple[int, str]:
    return res.status_code, res.json["error"]["message"]


@pytest.mark.parametrize("path", ROUTES)
def test_image_documents_and_an_image_query_in_every_form(make_client, path):
    engine = vision_engine()
    client = make_client("--reranking", engine=engine)
    documents = ["a chart of revenue", {"image": URL, "text": "revenue"},
                 {"type": "image_url", "image_url": {"url": URL}},
                 [{"type": "text", "text": "revenue "}, {"type": "image_url", "image_url": URL}],
                 {"prompt_string": "<__media__>revenue", "multimodal_data": [B64]},
                 [{"type": "image_url", "image_url": URL}, {"type": "text", "text": " vs "},
                  {"type": "image_url", "image_url": URL}]]
    res = client.simulate_post(path, json={"query": {"text": "revenue", "image_url": {"url": URL}},
                                           "documents": documents})
    assert res.status_code == 200, res.text
    call = engine.rerank_calls[-1]
    assert call["query"] == ImageInput((PNG, "revenue"))  # the image first, its text after
    assert call["documents"] == ["a chart of revenue", ImageInput((PNG, "revenue")), ImageInput.image(PNG),
                                 ImageInput(("revenue ", PNG)), ImageInput((PNG, "revenue")),
                                 ImageInput((PNG, " vs ", PNG))]
    scores = [pair_score(item_words(call["query"]), item_words(d)) for d in call["documents"]]
    assert {r["index"]: r["relevance_score"] for r in res.json["results"]} == dict(enumerate(scores))


@pytest.mark.parametrize("path", [*ROUTES, "/v2/rerank"])
def test_a_text_only_reranker_refuses_an_image_naming_the_item(make_client, path):
    client = make_client("--reranking", engine=FakeEngine(kind="cross-encoder"))
    res = client.simulate_post(path, json={"query": "q", "documents": ["a", {"image": URL}]})
    assert error(res) == (400, f"document 1: {MULTIMODAL}")
    res = client.simulate_post(path, json={"query": {"type": "image_url", "image_url": URL}, "documents": ["a"]})
    assert error(res) == (400, f"query: {MULTIMODAL}")


def test_the_image_limit_counts_the_query_once(make_client):
    client = make_client("--reranking", "--image-max-count", "2", engine=vision_engine())
    body = {"query": {"image": URL}, "documents": [{"image": URL}, "text"]}
    assert client.simulate_post("/rerank", json=body).status_code == 200
    body["documents"].append({"image": URL})
    assert error(client.simulate_post("/rerank", json=body)) == (
        400, "the request has 3 images; at most 2 are allowed (--image-max-count)")


def test_sources_follow_the_media_rules_and_errors_name_the_item(make_client, tmp_path):
    (tmp_path / "allowed").mkdir()
    (tmp_path / "allowed" / "page.png").write_bytes(PNG)
    (tmp_path / "outside.png").write_bytes(PNG)
    engine = vision_engine()
    client = make_client("--reranking", "--media-path", str(tmp_path / "allowed"), engine=engine)
    ok = client.simulate_post("/rerank", json={"query": "q", "documents": [{"image": "file://page.png"}]})
    assert ok.status_code == 200 and engine.rerank_calls[-1]["documents"] == [ImageInput.image(PNG)]
    for document, message in [
        ({"image": f"file://{tmp_path}/outside.png"}, f"document 1: file path is not allowed: {tmp_path}/outside.png "
                                                       "is outside --media-path"),
        ({"image": "file://../outside.png"}, "document 1: file:// paths must not contain '..'"),
        ({"image": "http://127.0.0.1:9/a.png"}, "document 1: http(s) image URLs are not allowed unless the server is "
                                                 "started with --allow-remote-media"),
        ({"image": "not base64!"}, "document 1: the image is not a data: URL, a file:// or http(s):// URL, or base64"),
    ]:
        res = client.simulate_post("/rerank", json={"query": "q", "documents": ["a", document]})
        assert error(res) == (400, message)
    res = client.simulate_post("/rerank", json={"query": {"image": "file://../x.png"}, "documents": ["a"]})
    assert error(res) == (400, "query: file:// paths must not contain '..'")


def test_return_documents_echoes_an_image_document_as_sent(make_client):
    client = make_client("--reranking", engine=vision_engine())
    documents = [{"image": URL, "id": "page-1"}, "text"]
    res = client.simulate_post("/v1/rerank", json={"query": "q", "documents": documents, "return_documents": True})
    by_index = {r["index"]: r["document"] for r in res.json["results"]}
    assert by_index == {0: documents[0], 1: {"text": "text"}}
    assert json.loads(res.text)["usage"]["prompt_tokens"] > 0


def test_props_and_models_say_what_a_reranker_takes(make_client):
    vision = make_client("--reranking", engine=vision_engine())
    props = vision.simulate_get("/props").json
    assert props["modalities"]["vision"] is True and props["input_modalities"] == ["text", "image"]
    listing = vision.simulate_get("/v1/models").json
    assert listing["models"][0]["capabilities"] == ["rerank", "multimodal"]
    assert listing["data"][0]["meta"]["input_modalities"] == ["text", "image"]
    text = make_client("--reranking", engine=FakeEngine(kind="cross-encoder"))
    assert text.simulate_get("/props").json["input_modalities"] == ["text"]
    assert "prompts" not in text.simulate_get("/props").json  # embedding-model fields stay away from rerankers
