"""max_chunks_per_doc and --rerank-chunks on the rerank routes: the field read on every route and handed to the
engine, bad values refused in the client's error shape, the option read from the command line, the environment and
a config file; and, over the real bundled cross-encoder, a long document's results (index, document, top_n) about
the document sent and its usage counting every window."""
from __future__ import annotations

import pytest
from falcon.testing import TestClient

from compat.app import create_app
from compat.settings import SettingsError, parse_settings
from engine import Pooling
from tests.compat.fakes import FakeEngine
from tests.conftest import ce_fixture_dir
from tests.engine.helpers import start_engine
from tests.engine.test_rerank_chunks import LONG, QUERY, SHORT, expected_windows

ALL_ROUTES = ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/v2/rerank"]


@pytest.mark.parametrize("path", ALL_ROUTES)
def test_every_route_hands_max_chunks_per_doc_to_the_engine(make_client, path):
    engine = FakeEngine(kind="cross-encoder")
    client = make_client("--reranking", engine=engine)
    assert client.simulate_post(path, json={"query": "a", "documents": ["b"], "max_chunks_per_doc": 3}).status_code == 200
    assert client.simulate_post(path, json={"query": "a", "documents": ["b"]}).status_code == 200
    assert [call["max_chunks"] for call in engine.rerank_calls] == [3, None]


@pytest.mark.parametrize("bad", [0, -2, 1.5, "3", True, [1]])
@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_a_bad_max_chunks_per_doc_is_400(make_client, path, bad):
    engine = FakeEngine(kind="cross-encoder")
    res = make_client("--reranking", engine=engine).simulate_post(
        path, json={"query": "a", "documents": ["b"], "max_chunks_per_doc": bad})
    assert res.status_code == 400
    assert res.json["error"]["message"] == '"max_chunks_per_doc" must be a positive integer'
    assert engine.rerank_calls == []


def test_rerank_chunks_is_an_option_in_every_layer(tmp_path):
    def chunks(argv=(), environ=None, ini=None):
        files = []
        if ini is not None:
            (tmp_path / "config.ini").write_text(ini)
            files.append(tmp_path / "config.ini")
        settings = parse_settings(list(argv), environ or {}, system_config_files=files)
        return settings.rerank_chunks, settings.engine_options(None).rerank_chunks

    assert chunks() == (0, 0)
    assert chunks(["--rerank-chunks", "4"]) == (4, 4)
    assert chunks(environ={"LLAMA_ARG_RERANK_CHUNKS": "5"}) == (5, 5)
    assert chunks(ini="rerank-chunks = 6\n") == (6, 6)
    with pytest.raises(SettingsError):
        parse_settings(["--rerank-chunks", "-1"], {}, system_config_files=[])


@pytest.fixture(scope="module")
def client():
    engine = start_engine(ce_fixture_dir(), pooling=Pooling.RANK)
    settings = parse_settings(["--reranking"], {}, system_config_files=[])
    yield TestClient(create_app(settings, engine)), engine
    engine.close()


def test_without_the_field_a_long_document_is_refused_as_llama_does(client):
    app, _ = client
    res = app.simulate_post("/v1/rerank", json={"query": QUERY, "documents": [SHORT, LONG]})
    assert res.status_code == 400
    assert "is too large to process" in res.json["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_results_are_about_the_documents_sent_and_usage_counts_every_window(client, path):
    app, engine = client
    windows = expected_windows(QUERY, LONG)
    alone = [engine.rerank(QUERY, [w]) for w in windows]
    short = engine.rerank(QUERY, [SHORT])
    documents = [SHORT, LONG, "The stock market closed higher today."]
    res = app.simulate_post(path, json={"query": QUERY, "documents": documents, "max_chunks_per_doc": 50,
                                        "return_documents": True, "top_n": 2})
    assert res.status_code == 200, res.text
    results = res.json["results"]
    third = engine.rerank(QUERY, [documents[2]])
    expected = [short.scores[0], max(r.scores[0] for r in alone), third.scores[0]]
    order = sorted(range(3), key=lambda i: -expected[i])[:2]
    assert [r["index"] for r in results] == order
    assert [r["relevance_score"] for r in results] == pytest.approx([expected[i] for i in order], abs=1e-4)
    assert all(r["document"] == {"text": documents[r["index"]]} for r in results)
    n_tokens = short.n_tokens[0] + sum(r.n_tokens[0] for r in alone) + third.n_tokens[0]
    assert res.json["usage"]["prompt_tokens"] == n_tokens == res.json["usage"]["total_tokens"]
