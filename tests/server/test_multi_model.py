"""Several models in one real server: MiniLM (twice, one shared copy), the tiny real BERT and the trained
cross-encoder from one preset; routing, defaults, a failed load, metrics, hot reload with a request in flight
(POST /models?reload=1 and SIGHUP), a cap of one under overlapping requests, idle unloads, config errors."""
from __future__ import annotations

import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import ce_fixture_dir, minilm_dir, parse_metrics, tiny_bert_dir
from tests.server.harness import ServerProcess, run_cli

CE = str(ce_fixture_dir())
TEXTS = ["The cat sits on the mat.", "A 200-page report on growth", ""]
QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital of France.", "Bananas are yellow.", "France is in Europe."]
# about 2 s of MiniLM on two CPU cores: long enough to reload under it (tests/compat/test_routing.py holds a
# request in flight deterministically; here it shows end to end that the answer comes from the old engine)
LONG = ["word " * 200] * 7


def preset_text(folder: Path, *, minilm_pooling: str = "", with_tiny: bool = True, with_broken: bool = True) -> str:
    sections = [f"[minilm]\nmodel = {minilm_dir()}\nalias = text-embedding-3-small\n{minilm_pooling}",
                f"[minilm-copy]\nmodel = {minilm_dir()}/\nalias = copy\n",  # the same folder: one shared copy
                f"[tiny]\nmodel = {tiny_bert_dir()}\n" if with_tiny else "",
                f"[ce]\nmodel = {CE}\nreranking = true\n",
                f"[broken]\nmodel = {folder / 'broken'}\n" if with_broken else ""]
    return "[*]\nubatch-size = 512\n\n" + "\n".join(sections)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("multi")
    (out / "broken").mkdir()  # no config.json: its load fails until the test puts a model there
    (out / "models.ini").write_text(preset_text(out), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def server(folder):
    with ServerProcess("--models-preset", str(folder / "models.ini"), "-t", "2", "--metrics") as srv:
        yield srv


@pytest.fixture(scope="module")
def minilm_reference() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir()), device="cpu").encode(TEXTS, normalize_embeddings=True)


def embed(server: ServerProcess, texts, model: str | None = None) -> np.ndarray:
    res = server.post("/v1/embeddings", {"input": texts, "encoding_format": "float", **_model(model)})
    assert res.status_code == 200, res.text
    return np.asarray([item["embedding"] for item in res.json()["data"]])


def _model(model: str | None) -> dict:
    return {} if model is None else {"model": model}


def models(server: ServerProcess) -> dict[str, dict]:
    return {item["id"]: item for item in server.get("/models").json()["data"]}


def metrics(server: ServerProcess) -> dict[str, float]:
    return {series: float(value) for series, value in parse_metrics(server.get("/metrics").text).items()}


def wait_for(predicate, timeout: float = 20.0, step: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(step)


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    for a, b in zip(got, want, strict=True):
        assert float(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b)) >= 0.999999


# -- one process, three checkpoints --------------------------------------------------------------------------------
def test_requests_route_by_id_and_alias_to_real_models(server, minilm_reference):
    assert models(server)["minilm"]["status"]["value"] == "unloaded"  # nothing loads before it is used
    for name in ("minilm", "text-embedding-3-small", "copy", None):  # None: the first embedder
        assert_close(embed(server, TEXTS, name), minilm_reference)
    tiny = embed(server, TEXTS, "tiny")
    assert tiny.shape == (3, 128) and np.allclose(np.linalg.norm(tiny, axis=1), 1, atol=1e-6)
    body = server.post("/v1/embeddings", {"input": "x", "model": "copy"}).json()
    assert body["model"] == "copy"


def test_rerank_routes_default_to_the_reranker_with_the_reference_scores(server):
    from sentence_transformers import CrossEncoder

    reference = CrossEncoder(CE, activation_fn=torch.nn.Identity(), device="cpu").predict(
        [(QUERY, doc) for doc in DOCUMENTS])
    body = server.post("/rerank", {"query": QUERY, "documents": DOCUMENTS}).json()
    assert body["model"] == "ce" and body["results"][0]["index"] == 0
    scores = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert [scores[i] for i in range(3)] == pytest.approx(reference.tolist(), abs=1e-4)


def test_unknown_models_and_models_of_the_other_kind_are_400(server):
    res = server.post("/v1/embeddings", {"input": "x", "model": "text-embedding-ada-002"})
    assert res.status_code == 400
    assert res.json()["error"]["message"] == ("model 'text-embedding-ada-002' not found; this server serves: "
                                              "minilm, minilm-copy, tiny, ce, broken")
    assert server.post("/v1/embeddings", {"input": "x", "model": "ce"}).status_code == 400
    assert server.post("/v1/rerank", {"query": "q", "documents": ["d"], "model": "tiny"}).status_code == 400


def test_two_references_to_one_folder_share_one_loaded_copy(server):
    embed(server, "x", "minilm")
    listed = models(server)
    assert listed["minilm"]["status"]["value"] == listed["minilm-copy"]["status"]["value"] == "loaded"
    assert listed["minilm"]["meta"] == listed["minilm-copy"]["meta"] and listed["minilm"]["meta"]["n_embd"] == 384
    assert server.output().count(f"loading {minilm_dir().resolve()}") == 1  # the engine logs the resolved path


def test_a_failed_load_is_500_with_its_reason_and_the_next_request_retries(server, folder):
    res = server.post("/v1/embeddings", {"input": "x", "model": "broken"})
    assert res.status_code == 500 and "no config.json" in res.json()["error"]["message"]
    status = models(server)["broken"]["status"]
    assert status["value"] == "failed" and status["failed"] and "no config.json" in status["error"]
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_bert_dir() / name, folder / "broken" / name)
    assert embed(server, "x", "broken").shape == (1, 128)
    assert models(server)["broken"]["status"]["value"] == "loaded"


def test_metrics_per_model_and_llamas_totals_over_all_models(server):
    before = metrics(server)
    usage = [server.post("/v1/embeddings", {"input": text, "model": "tiny"}).json()["usage"]["prompt_tokens"]
             for text in ("one two", "three four five")]
    assert server.post("/v1/embeddings", {"input": "word " * 600, "model": "tiny"}).status_code == 400  # too long
    after = metrics(server)

    def moved(name: str) -> float:
        return after[f'mlx_embed:{name}{{model="tiny"}}'] - before.get(f'mlx_embed:{name}{{model="tiny"}}', 0)

    assert (moved("requests_total"), moved("errors_total"), moved("items_total")) == (3, 1, 2)
    assert moved("tokens_total") == sum(usage)
    assert after['mlx_embed:loaded{model="tiny"}'] == 1 and after['mlx_embed:loaded_bytes{model="tiny"}'] > 1e6
    assert 0 < after['mlx_embed:load_seconds{model="tiny"}'] < 60
    tokens = sum(value for name, value in after.items() if name.startswith("mlx_embed:tokens_total"))
    assert after["llamacpp:prompt_tokens_total"] == tokens  # every forward-pass token belongs to one request


# -- hot reload: a request in flight finishes on the engine it started with ----------------------------------------
def test_post_reload_with_a_request_in_flight(server, folder):
    mean = embed(server, TEXTS[0], "minilm")[0]
    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(embed, server, [TEXTS[0], *LONG], "minilm")
        wait_for(lambda: metrics(server)["llamacpp:requests_processing"] >= 1)
        (folder / "models.ini").write_text(preset_text(folder, minilm_pooling="pooling = cls\n", with_tiny=False),
                                           encoding="utf-8")
        res = server.post("/models?reload=1")
        assert res.status_code == 200 and "tiny" not in [m["id"] for m in res.json()["data"]]
        assert_close(in_flight.result(60)[:1], mean[None])
    cls = embed(server, TEXTS[0], "minilm")[0]
    assert float(cls @ mean) < 0.9999  # a changed model is a new engine: CLS pooling now
    assert_close(embed(server, TEXTS[0], "copy"), mean[None])  # unchanged references keep their copy
    assert server.post("/v1/embeddings", {"input": "x", "model": "tiny"}).status_code == 400


def test_sighup_reload_with_a_request_in_flight(server, folder):
    mean = embed(server, TEXTS[0], "copy")[0]
    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(embed, server, [TEXTS[0], *LONG], "copy")
        wait_for(lambda: metrics(server)["llamacpp:requests_processing"] >= 1)
        (folder / "models.ini").write_text(preset_text(folder, with_broken=False), encoding="utf-8")
        server.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "tiny" in models(server))
        assert "broken" not in models(server)
        assert_close(in_flight.result(60)[:1], mean[None])
    assert embed(server, "x", "tiny").shape == (1, 128)
    assert server.post("/v1/embeddings", {"input": "x", "model": "broken"}).status_code == 400
    assert_close(embed(server, TEXTS[0], "minilm"), mean[None])  # minilm is back to mean pooling


# -- residency end to end ---------------------------------------------------------------------------------------
def test_a_cap_of_one_under_overlapping_requests_then_idle_unload(tmp_path):
    (tmp_path / "models.ini").write_text(f"[mean]\nmodel = {tiny_bert_dir()}\n\n"
                                         f"[cls]\nmodel = {tiny_bert_dir()}\npooling = cls\n", encoding="utf-8")
    args = ("--models-preset", str(tmp_path / "models.ini"), "--models-max", "1", "--sleep-idle-seconds", "3")
    with ServerProcess(*args, "-t", "2") as srv:
        texts = [f"text number {i}" for i in range(4)]
        want = {name: embed(srv, texts, name) for name in ("mean", "cls")}
        assert not np.allclose(want["mean"], want["cls"], atol=1e-3)

        def request(i: int) -> None:  # alternating models: each answer must come whole from its own model
            name = ("mean", "cls")[i % 2]
            np.testing.assert_allclose(embed(srv, texts, name), want[name], atol=1e-5)

        with ThreadPoolExecutor(6) as pool:
            list(pool.map(request, range(24)))
        states = [m["status"]["value"] for m in models(srv).values()]
        assert sorted(states) == ["loaded", "unloaded"]  # the cap holds once nothing is in use
        wait_for(lambda: all(m["status"]["value"] == "unloaded" for m in models(srv).values()), timeout=10)
        np.testing.assert_allclose(embed(srv, texts, "cls"), want["cls"], atol=1e-5)  # and loads again


def test_a_memory_budget_of_one_model_under_overlapping_first_uses_and_one_model_alone_over_it(tmp_path):
    tiny_bytes = sum(f.stat().st_size for f in tiny_bert_dir().rglob("*.safetensors"))
    (tmp_path / "models.ini").write_text(f"[mean]\nmodel = {tiny_bert_dir()}\n\n"
                                         f"[cls]\nmodel = {tiny_bert_dir()}\npooling = cls\n\n"
                                         f"[minilm]\nmodel = {minilm_dir()}\n", encoding="utf-8")
    budget = tiny_bytes * 3 // 2  # one tiny BERT (float32: resident as its file), not two, and never MiniLM
    with ServerProcess("--models-preset", str(tmp_path / "models.ini"), "--models-memory", str(budget),
                       "--models-max", "0", "-t", "2", "--metrics") as srv:
        texts = [f"text number {i}" for i in range(4)]
        with ThreadPoolExecutor(4) as pool:  # first uses of both at once, then more overlapping requests
            answers = list(pool.map(lambda i: embed(srv, texts, ("mean", "cls")[i % 2]), range(12)))
        assert all(answer.shape == (4, 128) for answer in answers)
        listed = models(srv)
        loaded = [name for name, item in listed.items() if item["status"]["value"] == "loaded"]
        assert len(loaded) == 1  # once released, the budget holds
        resident = srv.get("/props", params={"model": loaded[0]}).json()["resident_bytes"]
        assert listed[loaded[0]]["memory_bytes"] == listed[loaded[0]]["stats"]["loaded_bytes"] == resident > 0
        assert metrics(srv)[f'mlx_embed:memory_bytes{{model="{loaded[0]}"}}'] == resident
        res = srv.post("/v1/embeddings", {"input": "x", "model": "minilm"})
        assert res.status_code == 500, res.text
        message = res.json()["error"]["message"]
        assert f"more than the whole memory budget of {budget} bytes" in message and "bytes resident" in message
        assert models(srv)["minilm"]["status"]["value"] == "failed"
        assert models(srv)["minilm"]["stats"]["last_error"] == message


def test_config_errors_stop_the_start_naming_file_section_and_key(tmp_path):
    preset = tmp_path / "models.ini"
    preset.write_text(f"[*]\nubatch-size = 256\n[tiny]\nmodel = {tiny_bert_dir()}\nport = 9000\n", encoding="utf-8")
    done = run_cli("--models-preset", str(preset))
    assert done.returncode == 1
    assert done.stderr.strip().endswith(f'error: {preset}: [tiny] line 5: key "port": a server-wide option, not a '
                                        f"model's; set it on the command line, in the environment or in the [*] "
                                        f"section of --config")
    done = run_cli("--embedding-model", str(tmp_path / "missing"))
    assert done.returncode == 1 and "is neither a model folder nor a Hugging Face repository" in done.stderr
