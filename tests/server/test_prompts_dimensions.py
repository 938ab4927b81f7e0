"""prompt_name, --default-prompt-name and dimensions on the real server, against sentence-transformers'
encode(prompt_name=..., truncate_dim=...) on the same weights (all-MiniLM-L6-v2 with prompts added)."""
from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import minilm_dir
from tests.server.harness import ServerProcess, run_cli

PROMPTS = {"query": "query: ", "passage": "passage of text: ", "empty": ""}
TEXTS = ["The cat sits on the mat.", "Où est la gare ?", "A 200-page report on 3.5% growth"]


@pytest.fixture(scope="module")
def prompted_minilm(tmp_path_factory) -> Path:
    """The bundled MiniLM (its config_sentence_transformers.json has no prompts) with prompts and a default."""
    folder = tmp_path_factory.mktemp("minilm-prompts") / "minilm"
    shutil.copytree(minilm_dir(), folder)
    config = folder / "config_sentence_transformers.json"
    settings = json.loads(config.read_text())
    settings.update(prompts=PROMPTS, default_prompt_name="passage")
    config.write_text(json.dumps(settings))
    return folder


@pytest.fixture(scope="module")
def reference(prompted_minilm):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(prompted_minilm), device="cpu")


@pytest.fixture(scope="module")
def server(prompted_minilm):
    with ServerProcess("-m", str(prompted_minilm), "--embedding", "--offline") as srv:
        yield srv


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)


def oai_vectors(body: dict) -> np.ndarray:
    return np.asarray([item["embedding"] for item in body["data"]])


@pytest.mark.parametrize("prompt_name", ["query", "empty", None])
def test_prompt_name_matches_sentence_transformers(server, reference, prompt_name):
    """None: the checkpoint's default_prompt_name ("passage"), as sentence-transformers applies it."""
    want = reference.encode(TEXTS, prompt_name=prompt_name, normalize_embeddings=True)
    body = {"input": TEXTS, **({"prompt_name": prompt_name} if prompt_name else {})}
    res = server.post("/v1/embeddings", body)
    assert res.status_code == 200
    got = oai_vectors(res.json())
    assert cosines(got, want).min() >= 0.999999
    prompt = PROMPTS[prompt_name or "passage"]
    n_tokens = sum(len(reference.tokenize([prompt + t])["input_ids"][0]) for t in TEXTS)
    assert res.json()["usage"]["prompt_tokens"] == n_tokens
    llama = server.post("/embedding", {"content": TEXTS, **body}).json()
    np.testing.assert_allclose([item["embedding"][0] for item in llama], got, atol=1e-6)


@pytest.mark.parametrize("dimensions", [1, 64, 200, 384])
def test_dimensions_match_truncate_dim(server, reference, dimensions):
    want = reference.encode(TEXTS, prompt_name="query", truncate_dim=dimensions, normalize_embeddings=True)
    for fmt in ("float", "base64"):
        res = server.post("/v1/embeddings", {"input": TEXTS, "prompt_name": "query", "dimensions": dimensions,
                                             "encoding_format": fmt})
        assert res.status_code == 200
        data = res.json()["data"]
        got = (oai_vectors(res.json()) if fmt == "float" else
               np.asarray([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data]))
        assert got.shape == (len(TEXTS), dimensions)
        np.testing.assert_allclose(got, want, atol=2e-6)


def test_errors_name_the_known_prompts_and_the_width(server):
    res = server.post("/embeddings", {"input": "x", "prompt_name": "nope"})
    assert res.status_code == 400
    assert res.json()["error"]["message"] == ("prompt_name 'nope' is not one of this model's prompts "
                                              "(known: query, passage, empty)")
    res = server.post("/v1/embeddings", {"input": "x", "dimensions": 385})
    assert res.status_code == 400 and "from 1 to 384" in res.json()["error"]["message"]
    res = server.post("/v1/embeddings", {"input": "x", "instruction": "Find code"})
    assert res.status_code == 400 and "'instruction' is not supported by this model (bert)" in res.json()["error"][
        "message"]
    props = server.get("/props").json()
    assert props["prompts"] == PROMPTS and props["default_prompt_name"] == "passage"
    assert props["dimensions"] == {"min": 1, "max": 384}
    assert server.get("/v1/models").json()["data"][0]["meta"]["prompts"] == list(PROMPTS)


def test_default_prompt_name_option(prompted_minilm, reference):
    want = reference.encode(TEXTS[:1], prompt_name="query", normalize_embeddings=True)
    with ServerProcess("-m", str(prompted_minilm), "--embedding", "--offline", "--default-prompt-name",
                       "query") as srv:
        got = oai_vectors(srv.post("/v1/embeddings", {"input": TEXTS[:1]}).json())
        assert srv.get("/props").json()["default_prompt_name"] == "query"
    assert cosines(got, want).min() >= 0.999999
    res = run_cli("-m", str(prompted_minilm), "--embedding", "--offline", "--default-prompt-name", "nope")
    assert res.returncode != 0
    assert "--default-prompt-name 'nope' is not one of the model's prompts (known: empty, passage, query)" in (
        res.stdout + res.stderr)


# A chat template as sentence-transformers >= 6 records it: the tokenizer's template plus a "message" modality in
# sentence_bert_config.json; texts become [system prompt,] user messages rendered through it.
CHAT_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'system' %}[CLS] task : {{ m['content'] }} [SEP] "
                 "{% else %}{{ m['content'] | lower }}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %} [SEP]{% endif %}")


@pytest.fixture(scope="module")
def chat_minilm(prompted_minilm, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("minilm-chat") / "minilm"
    shutil.copytree(prompted_minilm, folder)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    sbert = json.loads((folder / "sentence_bert_config.json").read_text())
    forward = {"method": "forward", "method_output_name": "last_hidden_state"}
    sbert.update(modality_config={"text": forward, "message": {**forward, "format": "flat"}},
                 module_output_name="token_embeddings",
                 processing_kwargs={"chat_template": {"add_generation_prompt": True}})
    (folder / "sentence_bert_config.json").write_text(json.dumps(sbert))
    return folder


def test_chat_template_inputs_match_sentence_transformers(chat_minilm):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(chat_minilm), device="cpu")
    with ServerProcess("-m", str(chat_minilm), "--embedding", "--offline") as srv:
        assert srv.get("/props").json()["chat_template_inputs"] is True
        for prompt_name in ("query", "empty", None):  # None: the default prompt, "passage"
            want = reference.encode(TEXTS, prompt_name=prompt_name, normalize_embeddings=True)
            body = {"input": TEXTS, **({"prompt_name": prompt_name} if prompt_name else {})}
            res = srv.post("/v1/embeddings", body)
            assert res.status_code == 200
            assert cosines(oai_vectors(res.json()), want).min() >= 0.999999
        # over the 512-token limit with truncation: cut to max_seq_length (256), the template's tail kept
        long_text = "the quick brown fox jumps over the lazy dog " * 70
        want = reference.encode([long_text], prompt_name="query", normalize_embeddings=True)
        res = srv.post("/v1/embeddings", {"input": long_text, "prompt_name": "query", "truncate": True})
        assert res.status_code == 200 and res.json()["usage"]["prompt_tokens"] == 256
        assert cosines(oai_vectors(res.json()), want).min() >= 0.999999
        # token ids embed as given, never through the template
        ids = reference.tokenizer("plain")["input_ids"]
        got = oai_vectors(srv.post("/v1/embeddings", {"input": [ids]}).json())
        plain = SentenceTransformer(str(minilm_dir()), device="cpu").encode(["plain"], normalize_embeddings=True)
        assert cosines(got, plain).min() >= 0.999999

