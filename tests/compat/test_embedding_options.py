"""prompt_name, instruction and dimensions on every embedding route, single-model and several-model."""
from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest

from engine.types import Pooling
from tests.compat.fakes import CLS, SEP, FakeEngine, pooled_vector, token_rows, word_id
from tests.compat.test_app import llama_normalize
from tests.compat.test_routing import Engines, Server

PROMPTS = (("query", "search_query: "), ("document", "search_document: "))
QWEN3_TEMPLATE = "Instruct: {task}\nQuery:{text}"
ROUTES = [("/v1/embeddings", "input"), ("/embeddings", "input"), ("/embedding", "content")]


def ids_of(text: str) -> list[int]:
    """What the fake engine makes of one text input."""
    return [CLS, *(word_id(w) for w in text.split()), SEP]


def vectors(res) -> list[np.ndarray]:
    body = res.json
    if isinstance(body, list):  # llama's shape: [{"index", "embedding": [[...]]}]
        return [np.asarray(item["embedding"][0]) for item in body]
    return [np.asarray(item["embedding"]) for item in body["data"]]


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(prompts=PROMPTS)


@pytest.mark.parametrize("path,field", ROUTES)
def test_prompt_name_prepends_the_prompt_on_every_route(make_client, engine, path, field):
    res = make_client("--embedding", engine=engine).simulate_post(
        path, json={field: ["hello world", "x"], "prompt_name": "query"})
    assert res.status_code == 200
    expected = [ids_of("search_query: hello world"), ids_of("search_query: x")]
    assert engine.embed_calls[-1]["token_lists"] == expected
    for got, ids in zip(vectors(res), expected, strict=True):
        np.testing.assert_allclose(got, llama_normalize(pooled_vector(ids), 2), rtol=1e-6)
    if path == "/v1/embeddings":  # usage counts the prompt's tokens too
        assert res.json["usage"] == {"prompt_tokens": 9, "total_tokens": 9}  # 5 + 4


def test_without_prompt_name_texts_embed_verbatim_or_with_the_default(make_client, engine):
    make_client("--embedding", engine=engine).simulate_post("/v1/embeddings", json={"input": "a b"})
    assert engine.embed_calls[-1]["token_lists"] == [ids_of("a b")]
    with_default = FakeEngine(prompts=PROMPTS, default_prompt_name="document")
    client = make_client("--embedding", engine=with_default)
    client.simulate_post("/v1/embeddings", json={"input": "a b"})
    assert with_default.embed_calls[-1]["token_lists"] == [ids_of("search_document: a b")]
    client.simulate_post("/v1/embeddings", json={"input": "a b", "prompt_name": "query"})  # the request wins
    assert with_default.embed_calls[-1]["token_lists"] == [ids_of("search_query: a b")]


def test_token_id_and_mixed_inputs_get_no_prompt(make_client, engine):
    client = make_client("--embedding", engine=engine)
    assert client.simulate_post("/v1/embeddings", json={"input": [[5, 6, 7], "a"], "prompt_name": "query"}
                                ).status_code == 200
    assert engine.embed_calls[-1]["token_lists"] == [[5, 6, 7], ids_of("search_query: a")]
    client.simulate_post("/v1/embeddings", json={"input": ["a", 9], "prompt_name": "query"})  # one mixed prompt
    assert engine.embed_calls[-1]["token_lists"] == [[CLS, word_id("a"), SEP, 9]]


@pytest.mark.parametrize("path,field", ROUTES)
def test_unknown_prompt_name_is_400_listing_the_known_ones(make_client, engine, path, field):
    res = make_client("--embedding", engine=engine).simulate_post(path, json={field: "a", "prompt_name": "qeury"})
    assert res.status_code == 400
    assert res.json["error"]["message"] == "prompt_name 'qeury' is not one of this model's prompts (known: query, document)"
    assert not engine.embed_calls
    res = make_client("--embedding").simulate_post(path, json={field: "a", "prompt_name": "query"})
    assert res.status_code == 400
    assert res.json["error"]["message"].endswith("(known: none: the model defines no prompts)")
    res = make_client("--embedding", engine=engine).simulate_post(path, json={field: "a", "prompt_name": 3})
    assert res.status_code == 400 and res.json["error"]["message"] == (
        "\"prompt_name\" must be a string naming one of the model's prompts")


@pytest.mark.parametrize("path,field", ROUTES)
def test_instruction_fills_the_family_template(make_client, path, field):
    qwen3 = FakeEngine(prompts=(("query", "Instruct: web\nQuery:"),), instruction_template=QWEN3_TEMPLATE)
    res = make_client("--embedding", engine=qwen3).simulate_post(
        path, json={field: "what is mlx", "instruction": "Find code"})
    assert res.status_code == 200
    assert qwen3.embed_calls[-1]["token_lists"] == [ids_of("Instruct: Find code\nQuery:what is mlx")]


def test_instruction_errors(make_client, engine):
    client = make_client("--embedding", engine=engine)
    res = client.simulate_post("/v1/embeddings", json={"input": "a", "instruction": "Find code"})
    assert res.status_code == 400
    assert res.json["error"]["message"] == (
        "'instruction' is not supported by this model (bert): only families whose model card defines an instruction "
        "template take one (qwen3 embedding models); use 'prompt_name' (known: query, document)")
    qwen3 = FakeEngine(prompts=PROMPTS, instruction_template=QWEN3_TEMPLATE)
    res = make_client("--embedding", engine=qwen3).simulate_post(
        "/v1/embeddings", json={"input": "a", "instruction": "x", "prompt_name": "query"})
    assert res.status_code == 400 and "cannot be combined" in res.json["error"]["message"]
    for bad in ("", 5, ["x"]):
        res = client.simulate_post("/v1/embeddings", json={"input": "a", "instruction": bad})
        assert res.status_code == 400 and res.json["error"]["message"] == '"instruction" must be a non-empty string'
    assert not engine.embed_calls and not qwen3.embed_calls


@pytest.mark.parametrize("path,field", ROUTES)
@pytest.mark.parametrize("normalize", [2, -1, 1])
def test_dimensions_keeps_the_first_components_then_normalizes(make_client, path, field, normalize):
    res = make_client("--embedding").simulate_post(
        path, json={field: ["hello world", "b"], "dimensions": 2, "embd_normalize": normalize})
    assert res.status_code == 200
    for got, text in zip(vectors(res), ["hello world", "b"], strict=True):
        full = pooled_vector(ids_of(text))
        np.testing.assert_allclose(got, llama_normalize(full[:2], normalize), rtol=1e-6)
    if path == "/v1/embeddings":
        assert res.json["usage"]["prompt_tokens"] == 7  # truncation does not change what was embedded


def test_dimensions_with_base64_and_full_width(make_client):
    client = make_client("--embedding")
    res = client.simulate_post("/v1/embeddings", json={"input": "a b", "dimensions": 3, "encoding_format": "base64"})
    raw = np.frombuffer(base64.b64decode(res.json["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(raw, llama_normalize(pooled_vector(ids_of("a b"))[:3], 2).astype(np.float32))
    whole = client.simulate_post("/v1/embeddings", json={"input": "a b", "dimensions": 4}).json["data"][0]
    plain = client.simulate_post("/v1/embeddings", json={"input": "a b"}).json["data"][0]
    assert whole == plain


@pytest.mark.parametrize("bad", [0, 5, -1, "2", 2.5, True, [2]])
def test_dimensions_out_of_range_is_400(make_client, bad):
    engine = FakeEngine()
    res = make_client("--embedding", engine=engine).simulate_post("/v1/embeddings", json={"input": "a",
                                                                                          "dimensions": bad})
    assert res.status_code == 400
    assert res.json["error"]["message"] == "\"dimensions\" must be an integer from 1 to 4 (the model's embedding width)"
    assert not engine.embed_calls


def test_dimensions_with_pooling_none_cuts_every_token_row(make_client):
    engine = FakeEngine(pooling=Pooling.NONE)
    res = make_client("--embedding", "--pooling", "none", engine=engine).simulate_post(
        "/embedding", json={"content": "a b", "dimensions": 3})
    assert res.status_code == 200
    np.testing.assert_array_equal(np.asarray(res.json[0]["embedding"]), token_rows(ids_of("a b"))[:, :3])


def test_props_and_models_report_prompts_instruction_and_dimensions(make_client):
    qwen3 = FakeEngine(prompts=PROMPTS, default_prompt_name="query", instruction_template=QWEN3_TEMPLATE)
    client = make_client("--embedding", engine=qwen3)
    props = client.simulate_get("/props").json
    assert props["prompts"] == {"query": "search_query: ", "document": "search_document: "}
    assert (props["default_prompt_name"], props["instruction_template"]) == ("query", QWEN3_TEMPLATE)
    assert props["dimensions"] == {"min": 1, "max": 4}
    meta = client.simulate_get("/v1/models").json["data"][0]["meta"]
    assert (meta["prompts"], meta["default_prompt_name"]) == (["query", "document"], "query")
    assert (meta["instruction_template"], meta["dimensions"]) == (QWEN3_TEMPLATE, {"min": 1, "max": 4})
    reranker = make_client("--reranking", engine=FakeEngine(kind="cross-encoder"))
    assert "prompts" not in reranker.simulate_get("/props").json
    assert "dimensions" not in reranker.simulate_get("/v1/models").json["data"][0]["meta"]


class EnginesWithPrompts(Engines):
    """The preset's minilm folder has prompts; the other models have none."""

    def __call__(self, options):
        if Path(options.model_path).name != "minilm":
            return super().__call__(options)
        engine = FakeEngine(prompts=PROMPTS)
        self.made.append((options, engine))
        return engine


def test_several_models_each_use_their_own_prompts_and_width(tmp_path):
    server = Server(tmp_path, engines=EnginesWithPrompts())
    res = server.client.simulate_post("/v1/embeddings", json={"input": "a", "model": "minilm",
                                                              "prompt_name": "document", "dimensions": 1})
    assert res.status_code == 200 and len(res.json["data"][0]["embedding"]) == 1
    assert server.engines.of("minilm")[0].embed_calls[-1]["token_lists"] == [ids_of("search_document: a")]
    res = server.client.simulate_post("/embedding", json={"content": "a", "model": "tiny", "prompt_name": "document"})
    assert res.status_code == 400 and "known: none" in res.json["error"]["message"]
    res = server.client.simulate_post("/embeddings", json={"input": "a", "model": "tiny", "dimensions": 9})
    assert res.status_code == 400 and "from 1 to 4" in res.json["error"]["message"]


def test_default_prompt_name_is_a_per_model_option(tmp_path):
    preset = "[minilm]\nmodel = /models/minilm\ndefault-prompt-name = document\n[tiny]\nmodel = /models/tiny\n"
    server = Server(tmp_path, preset)
    assert server.embed("minilm").status_code == 200 and server.embed("tiny").status_code == 200
    chosen = {Path(options.model_path).name: options.default_prompt_name for options, _ in server.engines.made}
    assert chosen == {"minilm": "document", "tiny": None}
