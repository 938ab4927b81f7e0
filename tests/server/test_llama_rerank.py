"""llama.cpp's own rerank tests (tools/server/tests/unit/test_rerank.py, docs/llama-server-contract.md §8.3), against our server,
plus score parity with the reference implementations, the cohere SDK and a generative reranker over HTTP.

The cross-encoder is the trained fixture bert-tiny-ce-distilled in place of jina-reranker-v1-tiny-en, with
the jina_reranker_tiny preset's flags. That fixture does not put TEST_DOCUMENTS[2] first for "Machine learning
is" (it scores [1] "Learning is ..." 0.07 higher), so llama's `max index == 2` is replaced by orderings this
model really gets right: the French text last for that query, and the Paris sentence first for "What is the
capital of France?". Its `min index == 3` holds and is kept. llama's own tests also run on the fixture's
llama.cpp GGUF conversion (scored as llama-server scores it: no pooler, token types 0).
"""
from __future__ import annotations

import math
from pathlib import Path

import cohere
import pytest
import torch

from tests.engine.families.qwen3_fixture import CARD_INSTRUCTION, CARD_PREFIX, CARD_SUFFIX, make_checkpoint
from tests.conftest import ce_fixture_dir, gguf_fixture
from tests.server.harness import ServerProcess

CE_FIXTURE = str(ce_fixture_dir())
PRESET = ("-m", CE_FIXTURE, "--alias", "jina-reranker", "--ctx-size", "512", "--batch-size", "512",
          "--parallel", "1", "--offline", "--reranking")
EPS = 1e-4

TEST_DOCUMENTS = [
    "A machine is a physical system that uses power to apply forces and control movement to perform an action. "
    "The term is commonly applied to artificial devices.",
    "Learning is the process of acquiring new understanding, knowledge, behaviors, skills, values, attitudes, and "
    "preferences.",
    "Machine learning is a field of study in artificial intelligence concerned with the development and study of "
    "statistical algorithms that can learn from data and generalize to unseen data, and thus perform tasks "
    "without explicit instructions.",
    "Paris, capitale de la France, est une grande ville européenne et un centre mondial de l'art, de la mode, de "
    "la gastronomie et de la culture.",
]
QUERY = "Machine learning is"
FRANCE = "What is the capital of France?"
LONG_DOCUMENT = "This is a test " * 200  # 800 word pieces: over the 512-token limit with any query

GEN_QUERY = "What is the capital of China?"
GEN_DOCS = ["The capital of China is Beijing.", "Gravity is a force.", "Explain gravity.", "yes no maybe"]


@pytest.fixture(scope="module")
def cross_encoder():
    from sentence_transformers import CrossEncoder

    return CrossEncoder(CE_FIXTURE, activation_fn=torch.nn.Identity(), device="cpu")


@pytest.fixture(scope="module")
def server():
    with ServerProcess(*PRESET) as srv:
        yield srv


@pytest.fixture(scope="module", params=["safetensors", "gguf"])
def llama_server(request):
    """The server llama's tests run on: the fixture folder, or its F32 GGUF with the same preset flags."""
    if request.param == "safetensors":
        srv = request.getfixturevalue("server")
        srv.model_format = "safetensors"
        yield srv
        return
    gguf_preset = ("-m", str(gguf_fixture("bert-tiny-ce-distilled-f32.gguf")), *PRESET[2:])
    with ServerProcess(*gguf_preset) as srv:
        srv.model_format = "gguf"
        yield srv


def _results(res) -> list[dict]:
    assert res.status_code == 200, res.text
    body = res.json()
    return body if isinstance(body, list) else body["results"]


def _pair_lengths(cross_encoder, query: str, documents: list[str]) -> list[int]:
    return [len(cross_encoder.tokenizer(query, doc)["input_ids"]) for doc in documents]


# ---------------------------------------------------------------- llama's test_rerank.py


@pytest.mark.parametrize("key,label", [("documents", "relevance_score"), ("texts", "score")])
def test_rerank(llama_server, key, label):
    results = _results(llama_server.post("/rerank", {"query": QUERY, key: TEST_DOCUMENTS}))
    assert len(results) == 4
    best = max(results, key=lambda r: r[label])
    worst = min(results, key=lambda r: r[label])
    assert [r[label] for r in results] == sorted((r[label] for r in results), reverse=True)
    if llama_server.model_format == "gguf":
        # Without its pooler the file ranks these documents differently, in llama-server too (its answers on
        # this file rank a Japanese sentence first for an English question): only the shape is llama's here.
        assert best[label] > worst[label]
        return
    assert worst["index"] == 3
    assert best[label] > worst[label]
    assert {r["index"] for r in results[:3]} == {0, 1, 2}  # sorted: the French text comes last
    france = _results(llama_server.post("/rerank", {"query": FRANCE, key: TEST_DOCUMENTS}))
    assert france[0]["index"] == 3


def test_rerank_tei_format_is_a_bare_array(llama_server):
    body = llama_server.post("/rerank", {"query": QUERY, "texts": TEST_DOCUMENTS}).json()
    assert isinstance(body, list) and [list(item) for item in body] == [["index", "score"]] * 4


@pytest.mark.parametrize("documents", [[], None, 123, [1, 2, 3]])
def test_invalid_rerank_req(llama_server, documents):
    res = llama_server.post("/rerank", {"query": QUERY, "documents": documents})
    assert res.status_code == 400
    assert res.json()["error"]["message"] == '"documents" must be a non-empty string array'


@pytest.mark.parametrize("query,doc1,doc2", [
    ("Machine learning is", "A machine", "Learning is"),
    ("Which city?", "Machine learning is ", "Paris, capitale de la"),
])
def test_rerank_usage(llama_server, cross_encoder, query, doc1, doc2):
    body = llama_server.post("/rerank", {"query": query, "documents": [doc1, doc2]}).json()
    n = sum(_pair_lengths(cross_encoder, query, [doc1, doc2]))
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == n


@pytest.mark.parametrize("top_n,count", [(None, 4), (2, 2), (4, 4), (99, 4)])
@pytest.mark.parametrize("key", ["documents", "texts"])
def test_rerank_top_n(llama_server, key, top_n, count):
    body = {"query": QUERY, key: TEST_DOCUMENTS}
    if top_n is not None:
        body["top_n"] = top_n
    assert len(_results(llama_server.post("/rerank", body))) == count


# ---------------------------------------------------------------- parity, options, shapes


def test_scores_equal_sentence_transformers_raw_logits(server, cross_encoder):
    for query in (QUERY, FRANCE, ""):
        want = cross_encoder.predict([(query, doc) for doc in TEST_DOCUMENTS])
        for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/v2/rerank"):
            body = server.post(path, {"query": query, "documents": TEST_DOCUMENTS}).json()
            got = {r["index"]: r["relevance_score"] for r in body["results"]}
            assert all(abs(got[i] - float(want[i])) < EPS for i in range(4)), (path, got, want)
            assert [r["index"] for r in body["results"]] == sorted(range(4), key=lambda i: -want[i])
            n = sum(_pair_lengths(cross_encoder, query, TEST_DOCUMENTS))
            assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}
            assert body["model"] == "jina-reranker"


def test_return_documents_and_model_echo(server):
    docs = ["Paris is the capital of France.", {"text": "Gravity is a force.", "id": "g"}]
    body = server.post("/v1/rerank", {"query": FRANCE, "documents": docs, "return_documents": True,
                                      "model": "rerank-english-v3.0"}).json()
    assert body["model"] == "rerank-english-v3.0"
    assert [(r["index"], r["document"]) for r in body["results"]] == [
        (0, {"text": "Paris is the capital of France."}), (1, {"text": "Gravity is a force.", "id": "g"})]


def test_too_long_pair_is_too_large_and_truncate_serves_it(server, cross_encoder):
    res = server.post("/rerank", {"query": QUERY, "documents": ["short", LONG_DOCUMENT]})
    assert res.status_code == 400
    assert "too large" in res.json()["error"]["message"]
    body = server.post("/rerank", {"query": QUERY, "documents": ["short", LONG_DOCUMENT], "truncate": True}).json()
    want = cross_encoder.predict([(QUERY, "short"), (QUERY, LONG_DOCUMENT)])  # truncates to 512, longest first
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert abs(got[0] - float(want[0])) < EPS and abs(got[1] - float(want[1])) < EPS
    assert body["usage"]["prompt_tokens"] == _pair_lengths(cross_encoder, QUERY, ["short"])[0] + 512


def test_rank_mode_refuses_embeddings_clearly(server):
    for path, body in (("/v1/embeddings", {"input": "hello"}), ("/embedding", {"content": "hello"})):
        res = server.post(path, body)
        assert res.status_code == 400
        assert res.json()["error"]["message"] == ("this server runs a reranker (rank pooling): it serves /rerank, "
                                                  "not embeddings")


def test_models_say_rerank(server):
    assert server.get("/v1/models").json()["models"][0]["capabilities"] == ["rerank"]


def test_rerank_sigmoid_gives_sigmoid_of_the_raw_scores(server):
    raw = {r["index"]: r["relevance_score"]
           for r in server.post("/rerank", {"query": QUERY, "documents": TEST_DOCUMENTS}).json()["results"]}
    with ServerProcess(*PRESET, "--rerank-sigmoid") as sigmoid_server:
        body = sigmoid_server.post("/rerank", {"query": QUERY, "documents": TEST_DOCUMENTS}).json()
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert all(abs(got[i] - 1 / (1 + math.exp(-raw[i]))) < 1e-6 for i in range(4))
    assert [r["index"] for r in body["results"]] == sorted(range(4), key=lambda i: -raw[i])


def test_embedding_server_answers_501_on_rerank():
    with ServerProcess("--embedding", "--offline") as embedder:  # the bundled all-MiniLM-L6-v2
        res = embedder.post("/rerank", {"query": QUERY, "documents": TEST_DOCUMENTS})
        assert embedder.get("/v1/models").json()["models"][0]["capabilities"] == ["embedding"]
    assert res.status_code == 501
    assert res.json() == {"error": {"code": 501, "message": "This server does not support reranking. Start it "
                                                            "with `--reranking`", "type": "not_supported_error"}}


# ---------------------------------------------------------------- the cohere SDK


def test_cohere_v1_client(server, cross_encoder):
    want = cross_encoder.predict([(FRANCE, doc) for doc in TEST_DOCUMENTS])
    client = cohere.Client(base_url=server.base, api_key="x")
    res = client.rerank(query=FRANCE, documents=TEST_DOCUMENTS, top_n=2, model="rerank-english-v3.0")
    assert [r.index for r in res.results] == sorted(range(4), key=lambda i: -want[i])[:2]
    assert res.results[0].index == 3
    assert all(abs(r.relevance_score - float(want[r.index])) < EPS for r in res.results)
    assert all(r.document is None for r in res.results)
    docs = client.rerank(query=FRANCE, documents=["Gravity is a force.", {"text": "Paris is in France."}],
                         return_documents=True)
    assert [(r.index, r.document.text) for r in docs.results] == [(1, "Paris is in France."),
                                                                    (0, "Gravity is a force.")]


def test_cohere_v2_client(server, cross_encoder):
    want = cross_encoder.predict([(QUERY, doc) for doc in TEST_DOCUMENTS])
    client = cohere.ClientV2(base_url=server.base, api_key="x")
    res = client.rerank(model="rerank-v3.5", query=QUERY, documents=TEST_DOCUMENTS, top_n=3)
    assert [r.index for r in res.results] == sorted(range(4), key=lambda i: -want[i])[:3]
    assert all(abs(r.relevance_score - float(want[r.index])) < EPS for r in res.results)
    assert res.id and res.meta.api_version.version == "2" and res.meta.billed_units.search_units == 1
    n = sum(_pair_lengths(cross_encoder, QUERY, TEST_DOCUMENTS))
    assert res.model_extra == {"model": "rerank-v3.5", "usage": {"prompt_tokens": n, "total_tokens": n}}
    # Cohere v2 truncates long documents instead of refusing them
    long = client.rerank(model="rerank-v3.5", query=QUERY, documents=["short", LONG_DOCUMENT])
    assert sorted(r.index for r in long.results) == [0, 1]


# ---------------------------------------------------------------- a generative reranker (Qwen3 yes/no)


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("qwen3-reranker") / "model")


@pytest.fixture(scope="module")
def card_scores(qwen3_folder):
    """score(query, docs, instruction): the model card's recipe with transformers, and the token counts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen3_folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(qwen3_folder).eval()
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    prefix = tokenizer.encode(CARD_PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(CARD_SUFFIX, add_special_tokens=False)

    def score(query: str, docs: list[str], instruction: str = CARD_INSTRUCTION) -> tuple[list[float], list[int]]:
        pairs = [f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}" for doc in docs]
        middle = tokenizer(pairs, padding=False, return_attention_mask=False, add_special_tokens=False)
        batch = tokenizer.pad({"input_ids": [prefix + ids + suffix for ids in middle["input_ids"]]},
                              padding=True, return_tensors="pt")
        with torch.no_grad():
            last = model(**batch).logits[:, -1, :]
        return torch.sigmoid(last[:, yes] - last[:, no]).tolist(), batch["attention_mask"].sum(1).tolist()

    return score


@pytest.fixture(scope="module")
def qwen3_server(qwen3_folder):
    with ServerProcess("-m", str(qwen3_folder), "--reranking", "--offline") as srv:
        yield srv


def _assert_matches(body: dict, want: list[float], n_tokens: list[int]) -> None:
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert all(abs(got[i] - want[i]) < EPS for i in range(len(want))), (got, want)
    assert [r["index"] for r in body["results"]] == sorted(range(len(want)), key=lambda i: (-got[i], i))
    assert body["usage"]["prompt_tokens"] == sum(n_tokens)


def test_generative_reranker_default_instruction(qwen3_server, card_scores):
    want, n_tokens = card_scores(GEN_QUERY, GEN_DOCS)
    assert max(want) - min(want) > 10 * EPS  # the comparison can tell the documents apart
    _assert_matches(qwen3_server.post("/rerank", {"query": GEN_QUERY, "documents": GEN_DOCS}).json(), want, n_tokens)


def test_generative_reranker_request_instruction(qwen3_server, card_scores):
    want, n_tokens = card_scores(GEN_QUERY, GEN_DOCS, "Explain gravity.")
    assert want != card_scores(GEN_QUERY, GEN_DOCS)[0]
    body = qwen3_server.post("/v2/rerank", {"query": GEN_QUERY, "documents": GEN_DOCS,
                                            "instruction": "Explain gravity."}).json()
    _assert_matches(body, want, n_tokens)


def test_generative_reranker_server_instruction_and_sigmoid_flag(qwen3_folder, card_scores):
    # --rerank-sigmoid leaves P(yes) alone: it is already a probability
    instruction = "Judge if the document answers a geography question"
    with ServerProcess("-m", str(qwen3_folder), "--reranking", "--offline", "--rerank-instruction", instruction,
                       "--rerank-sigmoid") as srv:
        body = srv.post("/rerank", {"query": GEN_QUERY, "documents": GEN_DOCS}).json()
        override = srv.post("/rerank", {"query": GEN_QUERY, "documents": GEN_DOCS,
                                        "instruction": "Explain gravity."}).json()
    want, n_tokens = card_scores(GEN_QUERY, GEN_DOCS, instruction)
    assert max(abs(a - b) for a, b in zip(want, card_scores(GEN_QUERY, GEN_DOCS)[0], strict=True)) > 10 * EPS
    _assert_matches(body, want, n_tokens)  # so the server's instruction was really used
    _assert_matches(override, *card_scores(GEN_QUERY, GEN_DOCS, "Explain gravity."))


def test_qwen3_template_renders_the_model_card_prompt(qwen3_folder):
    from engine.loading.formats import open_checkpoint
    from engine.text.prompts import RerankPrompt, templates_dir

    prompt = RerankPrompt(open_checkpoint(qwen3_folder), fallback="qwen3_reranker.jinja")
    assert prompt.source == templates_dir() / "qwen3_reranker.jinja"
    for instruction in (None, "Find {code} & <tags>"):
        rendered = prompt.render("q {x} \"'", "doc\nline", instruction)
        card = (CARD_PREFIX + f"<Instruct>: {instruction or CARD_INSTRUCTION}\n<Query>: q {{x}} \"'\n"
                f"<Document>: doc\nline" + CARD_SUFFIX)
        assert rendered.encode() == card.encode()
