"""The Python API (engine.Encoder / engine.Reranker) and the mlx-embed / mlx-rerank commands give what the real
server answers for the same inputs: MiniLM through /v1/embeddings, the trained cross-encoder through /v1/rerank,
and MiniLM matches sentence-transformers (the reference) through the API too."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import orjson
import pytest

from compat.cli import embed_main, rerank_main
from engine import Encoder, Reranker
from engine.errors import InputTooLong, InvalidInput
from tests.conftest import ce_fixture_dir, minilm_dir
from tests.engine.families.qwen3_fixture import make_checkpoint
from tests.server.harness import ROOT, ServerProcess, clean_env

TEXTS = ["The cat sits on the mat.", "A feline rests on a rug.", "Quarterly revenue, up 12%, beat forecasts."]
QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital of France.", "Bananas are yellow.", "France is a country in Europe.",
             "Paris is the capital of France."]  # a tie with document 0: ranked after it


@pytest.fixture(scope="module")
def embed_server():
    with ServerProcess("-m", str(minilm_dir()), "--embedding", "--offline") as srv:
        yield srv


@pytest.fixture(scope="module")
def rerank_server():
    with ServerProcess("-m", str(ce_fixture_dir()), "--reranking", "--offline") as srv:
        yield srv


@pytest.fixture(scope="module")
def encoder():
    with Encoder(minilm_dir()) as enc:
        yield enc


@pytest.fixture(scope="module")
def reranker():
    with Reranker(ce_fixture_dir()) as rr:
        yield rr


def server_vectors(server: ServerProcess, texts: list[str], **fields) -> np.ndarray:
    res = server.post("/v1/embeddings", json={"input": texts, **fields})
    assert res.status_code == 200, res.text
    return np.array([item["embedding"] for item in res.json()["data"]])


def server_scores(server: ServerProcess, query: str, documents: list[str]) -> list[float]:
    res = server.post("/v1/rerank", json={"query": query, "documents": documents})
    assert res.status_code == 200, res.text
    by_index = {r["index"]: r["relevance_score"] for r in res.json()["results"]}
    return [by_index[i] for i in range(len(documents))]


def run_json(main, *args: str, capsys) -> dict:
    assert main([*args, "--json"]) == 0
    return orjson.loads(capsys.readouterr().out)


# -- Python API ------------------------------------------------------------------------------------------------
def test_encoder_equals_server_and_reference(encoder, embed_server):
    from sentence_transformers import SentenceTransformer

    vectors = encoder.encode(TEXTS)
    assert vectors.dtype == np.float32 and vectors.shape == (3, 384)
    np.testing.assert_allclose(vectors, server_vectors(embed_server, TEXTS), rtol=0, atol=1e-6)
    reference = SentenceTransformer(str(minilm_dir()), device="cpu").encode(TEXTS, normalize_embeddings=True)
    cosines = np.sum(vectors * reference, axis=1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosines.min() > 0.999999


def test_encoder_options_follow_the_server(encoder, embed_server):
    raw = encoder.encode(TEXTS, normalize=False)
    np.testing.assert_allclose(raw, server_vectors(embed_server, TEXTS, embd_normalize=-1), rtol=0, atol=1e-6)
    assert abs(np.linalg.norm(raw[0]) - 1) > 0.1  # MiniLM's raw mean-pooled vectors are not unit length
    taxicab = encoder.encode(TEXTS, normalize=1)
    np.testing.assert_allclose(taxicab, server_vectors(embed_server, TEXTS, embd_normalize=1), rtol=0, atol=1e-6)
    short = encoder.encode(TEXTS, dimensions=32)
    expected = raw[:, :32] / np.linalg.norm(raw[:, :32], axis=1, keepdims=True)
    np.testing.assert_allclose(short, expected, rtol=0, atol=1e-6)
    # at most one text per forward pass: the same vectors (padding is masked, widths differ)
    np.testing.assert_allclose(encoder.encode(TEXTS, batch_size=1), encoder.encode(TEXTS), rtol=0, atol=1e-6)


def test_encoder_errors_are_the_servers(encoder):
    with pytest.raises(InputTooLong, match="602 tokens"):
        encoder.encode(["word " * 600])
    with pytest.raises(InvalidInput, match='"dimensions" must be an integer from 1 to 384'):
        encoder.encode(TEXTS, dimensions=385)
    rows = encoder.encode_rows(["a text", "", None, "word " * 600])
    assert rows.errors[0] is None and rows.errors[1] == "empty text" and rows.errors[2] == "missing text"
    # the engine's own refusal (what encode raises), with the way out
    assert rows.errors[3] == "input (602 tokens) exceeds the ubatch limit of 512 tokens (--truncate cuts it instead)"
    np.testing.assert_allclose(rows.vectors[0], encoder.encode(["a text"])[0], rtol=0, atol=1e-6)
    assert not rows.vectors[1:].any() and rows.n_tokens[1:] == [0, 0, 0]


def test_prompt_name_and_instruction_as_the_server_applies_them(tmp_path, embed_server, capsys):
    folder = tmp_path / "minilm"  # the bundled MiniLM's files, with prompts and a default prompt added
    folder.mkdir()
    for item in minilm_dir().iterdir():
        if item.name != "config_sentence_transformers.json":
            (folder / item.name).symlink_to(item)
    settings = json.loads((minilm_dir() / "config_sentence_transformers.json").read_text())
    (folder / "config_sentence_transformers.json").write_text(json.dumps(
        {**settings, "prompts": {"query": "query: ", "doc": "doc: "}, "default_prompt_name": "doc"}))
    with Encoder(folder) as prompted:
        np.testing.assert_allclose(prompted.encode(TEXTS, prompt_name="query"),
                                   server_vectors(embed_server, ["query: " + t for t in TEXTS]), rtol=0, atol=1e-6)
        np.testing.assert_allclose(prompted.encode(TEXTS),  # the checkpoint's default prompt
                                   server_vectors(embed_server, ["doc: " + t for t in TEXTS]), rtol=0, atol=1e-6)
        with pytest.raises(InvalidInput, match="not one of this model's prompts"):
            prompted.encode(TEXTS, prompt_name="passage")
        with pytest.raises(InvalidInput, match="'instruction' is not supported by this model"):
            prompted.encode(TEXTS, instruction="Find the answer")
    out = run_json(embed_main, "-m", str(folder), "-p", TEXTS[0], "--prompt-name", "query", capsys=capsys)
    assert out["embeddings"][0] == embed_server.post("/v1/embeddings", json={"input": ["query: " + TEXTS[0]]}).json()[
        "data"][0]["embedding"]
    assert embed_main(["-m", str(folder), "-p", TEXTS[0], "--instruction", "Find the answer"]) == 1
    assert "'instruction' is not supported by this model" in capsys.readouterr().err


def test_encoder_loads_a_gguf_file(encoder):
    gguf = ce_fixture_dir().parent / "gguf" / "minilm-f16.gguf"  # MiniLM converted by llama.cpp, f16 weights
    with Encoder(gguf) as from_gguf:
        vectors = from_gguf.encode(TEXTS)
    assert np.min(np.sum(vectors * encoder.encode(TEXTS), axis=1)) > 0.9999


def test_org_name_resolves_through_the_hugging_face_cache(tmp_path, monkeypatch, embed_server, capsys):
    from huggingface_hub import constants as hub_constants

    # the hub cache layout, built by hand: models--org--name/{refs/main, snapshots/<commit>/...}
    repo = tmp_path / "hub" / "models--example-org--minilm"
    snapshot = repo / "snapshots" / "0123456789abcdef"
    snapshot.mkdir(parents=True)
    for item in minilm_dir().iterdir():
        (snapshot / item.name).symlink_to(item)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123456789abcdef")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # read at each call
    with Encoder("example-org/minilm", offline=True) as from_cache:
        assert from_cache.info.path == str(snapshot)
        np.testing.assert_allclose(from_cache.encode(TEXTS), server_vectors(embed_server, TEXTS), rtol=0, atol=1e-6)
    out = run_json(embed_main, "-hf", "example-org/minilm", "--offline", "-p", TEXTS[0], capsys=capsys)
    assert out["model"] == "example-org/minilm" and len(out["embeddings"][0]) == 384


def test_encoder_as_a_ray_data_callable(encoder):
    batch = {"id": np.array([7, 8, 9]), "text": np.array(TEXTS)}
    out = encoder(batch)
    assert list(out["id"]) == [7, 8, 9]
    np.testing.assert_allclose(out["embedding"], encoder.encode(TEXTS), rtol=0, atol=1e-6)  # batch invariance
    with pytest.raises(InvalidInput, match="texts must be strings"):
        encoder({"text": np.array([TEXTS[0], None], dtype=object)})


def test_reranker_equals_server(reranker, rerank_server):
    expected = server_scores(rerank_server, QUERY, DOCUMENTS)
    np.testing.assert_allclose(reranker.predict([(QUERY, d) for d in DOCUMENTS]), expected, rtol=0, atol=1e-6)
    ranked = reranker.rank(QUERY, DOCUMENTS)
    # the server's scores of the two equal documents may differ in their last bits (the passes they shared):
    # equal to batch invariance is a tie
    assert [r["index"] for r in ranked] == sorted(range(4), key=lambda i: (-round(expected[i], 5), i))
    assert ranked[0]["index"] == 0 and ranked[1]["index"] == 3  # the tie: ascending index
    assert reranker.rank(QUERY, DOCUMENTS, top_n=2) == ranked[:2]
    assert reranker.kind == "cross-encoder"


def test_reranker_predict_mixes_queries_and_is_a_ray_callable(reranker, rerank_server):
    pairs = [(QUERY, DOCUMENTS[0]), ("yellow fruit", DOCUMENTS[1]), (QUERY, DOCUMENTS[2])]
    expected = [server_scores(rerank_server, q, [d])[0] for q, d in pairs]
    np.testing.assert_allclose(reranker.predict(pairs), expected, rtol=0, atol=1e-6)
    out = reranker({"query": np.array([q for q, _ in pairs]), "document": np.array([d for _, d in pairs])})
    np.testing.assert_allclose(out["score"], expected, rtol=0, atol=1e-6)


def test_generative_reranker_instruction_reaches_the_prompt(tmp_path, capsys):
    folder = make_checkpoint(tmp_path / "qwen3-reranker")  # a tiny random Qwen3 with the card's yes/no recipe
    query, documents, task = "What is the capital of China?", ["The capital of China is Beijing.", "Gravity."], \
        "Judge if the document answers a geography question"
    with ServerProcess("-m", str(folder), "--reranking", "--offline") as srv:
        expected = {}
        for instruction in (None, task):
            body = {"query": query, "documents": documents, **({"instruction": instruction} if instruction else {})}
            results = srv.post("/v1/rerank", json=body).json()["results"]
            expected[instruction] = [r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])]
    assert expected[None] != expected[task]
    out = run_json(rerank_main, "-m", str(folder), "-q", query, *(a for d in documents for a in ("-d", d)),
                   "--instruction", task, capsys=capsys)
    assert out["kind"] == "generative-reranker" and out["scores"] == expected[task]
    with Reranker(folder) as rr:
        np.testing.assert_allclose(rr.predict([(query, d) for d in documents]), expected[None], rtol=0, atol=1e-6)


def test_context_manager_releases_the_model():
    with Reranker(ce_fixture_dir()) as rr:
        engine = rr.engine
        assert engine.is_loaded
    assert engine.released.is_set() and not engine.is_loaded


# -- commands --------------------------------------------------------------------------------------------------
def test_mlx_embed_json_equals_server(embed_server, capsys):
    out = run_json(embed_main, "-m", str(minilm_dir()), *(a for t in TEXTS for a in ("-p", t)), capsys=capsys)
    res = embed_server.post("/v1/embeddings", json={"input": TEXTS}).json()
    assert out["model"] == str(minilm_dir())
    served = np.array([item["embedding"] for item in res["data"]])
    # the same vectors to batch invariance: which inputs share a pass (and so the padded width and the BLAS threads
    # each pass gets) depends on when the lanes pick them up, in either process
    np.testing.assert_allclose(out["embeddings"], served, rtol=0, atol=1e-6)
    printed = np.array(out["embeddings"])  # printed as float32 values, as the server prints them
    assert np.array_equal(printed.astype(np.float32).astype(np.float64), printed)
    assert out["prompt_tokens"] == res["usage"]["prompt_tokens"]
    vectors = np.array(out["embeddings"])
    np.testing.assert_allclose(out["similarity"], vectors @ vectors.T, rtol=0, atol=1e-6)


def test_mlx_embed_options_reach_the_engine(embed_server, capsys):
    out = run_json(embed_main, "-m", str(minilm_dir()), "-p", TEXTS[0], "--embd-normalize", "-1",
                   "--pooling", "cls", "--dimensions", "16", "--batch-size", "1", capsys=capsys)
    with ServerProcess("-m", str(minilm_dir()), "--embedding", "--offline", "--pooling", "cls") as cls_server:
        raw = server_vectors(cls_server, [TEXTS[0]], embd_normalize=-1)
    np.testing.assert_allclose(out["embeddings"], raw[:, :16], rtol=0, atol=1e-6)


def test_mlx_embed_text_output(capsys):
    assert embed_main(["-m", str(minilm_dir()), "-p", TEXTS[0], "-p", TEXTS[1]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("embedding 0 (") and len(lines[0].split(": ", 1)[1].split()) == 384
    assert lines[3] == "cosine similarity matrix:"
    assert lines[4].split() == ["0", "1"]
    row = lines[5].split()
    assert row[0] == "0" and row[1] == "1.0000" and 0.3 < float(row[2]) < 0.9  # related sentences


def test_mlx_embed_refuses_what_it_cannot_do(capsys):
    assert embed_main(["-m", str(minilm_dir())]) == 1
    assert "nothing to embed" in capsys.readouterr().err
    assert embed_main(["-m", str(minilm_dir()), "-p", "x", "--output", "o.parquet"]) == 1
    assert "--input" in capsys.readouterr().err
    assert embed_main(["-m", str(minilm_dir()), "-p", "word " * 600]) == 1
    assert "602 tokens" in capsys.readouterr().err
    assert embed_main(["-m", str(minilm_dir()), "-p", "x", "--rows-per-group", "8", "--quiet"]) == 1
    assert "--rows-per-group, --quiet: corpus mode options" in capsys.readouterr().err
    assert embed_main(["-m", str(minilm_dir()), "--input", "c.txt", "--output", "o.parquet", "--json"]) == 1
    assert "--json prints the vectors of -p texts" in capsys.readouterr().err
    assert embed_main(["--no-such-flag"]) == 1
    assert "invalid argument: --no-such-flag" in capsys.readouterr().err


def test_mlx_rerank_json_equals_server(rerank_server, capsys):
    out = run_json(rerank_main, "-m", str(ce_fixture_dir()), "-q", QUERY,
                   *(a for d in DOCUMENTS for a in ("-d", d)), "--top-n", "2", capsys=capsys)
    res = rerank_server.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS, "top_n": 2}).json()
    # raw logits, the same to batch invariance (the two processes share their BLAS threads over passes differently)
    assert out["scores"] == pytest.approx(server_scores(rerank_server, QUERY, DOCUMENTS), abs=1e-5)
    assert [r["index"] for r in out["ranking"]] == [r["index"] for r in res["results"]]
    assert [r["score"] for r in out["ranking"]] == pytest.approx([r["relevance_score"] for r in res["results"]],
                                                                 abs=1e-5)
    assert out["kind"] == "cross-encoder" and out["prompt_tokens"] == res["usage"]["prompt_tokens"]


def test_mlx_rerank_sigmoid_and_text_output(rerank_server, capsys):
    out = run_json(rerank_main, "-m", str(ce_fixture_dir()), "-q", QUERY, "-d", DOCUMENTS[0], "--rerank-sigmoid",
                   capsys=capsys)
    logit = server_scores(rerank_server, QUERY, DOCUMENTS[:1])[0]
    assert out["scores"] == pytest.approx([1 / (1 + np.exp(-logit))], abs=1e-7)
    assert rerank_main(["-m", str(ce_fixture_dir()), "-q", QUERY, "-d", DOCUMENTS[1], "-d", DOCUMENTS[0]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("score 0: ") and lines[1].startswith("score 1: ")
    assert lines[3] == "ranking:" and lines[4].split()[:3] == ["1.", "document", "1"]
    assert rerank_main(["-m", str(ce_fixture_dir()), "-q", QUERY]) == 1
    assert "at least one document" in capsys.readouterr().err
    assert rerank_main(["-m", str(ce_fixture_dir()), "-q", QUERY, "-d", "x", "--instruction", "Judge"]) == 1
    assert "only used by generative rerankers" in capsys.readouterr().err


def test_mlx_rerank_images_need_a_reranker_that_takes_them(tmp_path, capsys):
    image = tmp_path / "page.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n")
    ce = str(ce_fixture_dir())
    assert rerank_main(["-m", ce, "-q", QUERY, "-d", "x", "--image", str(image)]) == 1
    assert ("error: document 1 is an image, but this reranker (BertForSequenceClassification) scores text only"
            in capsys.readouterr().err)
    assert rerank_main(["-m", ce, "--query-image", str(image), "-d", "x"]) == 1
    assert "query is an image, but this reranker" in capsys.readouterr().err
    assert rerank_main(["-m", ce, "-q", QUERY, "--image", str(tmp_path / "missing.png")]) == 1
    assert f"--image {tmp_path / 'missing.png'}: No such file or directory" in capsys.readouterr().err
    assert rerank_main(["-m", ce, "--image", str(image)]) == 1
    assert "give a query and at least one document" in capsys.readouterr().err


def test_console_scripts_are_declared_and_run():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'mlx-embed = "compat.cli:embed_main"' in pyproject and 'mlx-rerank = "compat.cli:rerank_main"' in pyproject
    done = subprocess.run([sys.executable, "-c", "import sys; from compat.cli import embed_main; sys.exit(embed_main())",
                           "--help"], cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage: mlx-embed")
    assert "--ray-actors N" in done.stdout and "--embd-normalize N" in done.stdout
