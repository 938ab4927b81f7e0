"""A several-model server's routes (compat/routing.py, compat/resources/model_management.py) over a real Residency whose
engines are fakes: routing by id and alias, defaults per route, errors, /models, load/unload, reload, metrics."""
from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from falcon.testing import TestClient

from compat.app import create_app
from compat.catalog import read_catalog
from compat.routing import ModelRouter
from compat.settings import parse_settings
from engine import Residency
from engine.errors import CheckpointNotFound, NotLoaded
from engine.types import EngineOptions, Pooling
from tests.compat.fakes import FakeEngine


class GatedEngine(FakeEngine):
    """Holds each embed call until the test opens the gate."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.entered = threading.Event()
        self.gate = threading.Event()

    def embed(self, token_lists, **kw):
        self.processing += 1
        self.entered.set()
        try:
            assert self.gate.wait(10)
            return super().embed(token_lists, **kw)
        finally:
            self.processing -= 1


class BrokenEngine(FakeEngine):
    def __init__(self, **kw):
        super().__init__(loaded=False, **kw)

    def wait_loaded(self, timeout=None):
        raise CheckpointNotFound("/models/ce: not a Hugging Face model folder (no config.json)")


class SlowLoadingEngine(FakeEngine):
    """Still loading when the request's deadline passes."""

    def __init__(self, **kw):
        super().__init__(loaded=False, **kw)

    def wait_loaded(self, timeout=None):
        raise NotLoaded("the model is still loading")


class Engines:
    """The engine factory: fake engines by folder name, gated or broken when a test says so."""

    def __init__(self) -> None:
        self.made: list[tuple[EngineOptions, FakeEngine]] = []
        self.gated: set[str] = set()
        self.broken: set[str] = set()
        self.slow: set[str] = set()
        self.sizes: dict[str, int] = {}  # resident bytes by folder name (default: the fake's 90868376)

    def __call__(self, options: EngineOptions) -> FakeEngine:
        name = Path(options.model_path).name
        kind = "cross-encoder" if options.pooling is Pooling.RANK else "embedder"
        cls = (BrokenEngine if name in self.broken else GatedEngine if name in self.gated
               else SlowLoadingEngine if name in self.slow else FakeEngine)
        engine = cls(kind=kind)
        if name in self.sizes:
            engine.info = dataclasses.replace(engine.info, resident_bytes=self.sizes[name])
        self.made.append((options, engine))
        return engine

    def of(self, name: str) -> list[FakeEngine]:
        return [engine for options, engine in self.made if Path(options.model_path).name == name]

    def first_made(self, name: str, timeout_s: float = 10) -> FakeEngine:
        """The first engine made for a folder, waiting for a request on another thread to make it."""
        deadline = time.monotonic() + timeout_s
        while not self.of(name):
            assert time.monotonic() < deadline, f"no engine was made for {name}"
            time.sleep(0.005)
        return self.of(name)[0]


PRESET = """
[minilm]
model = /models/minilm
alias = text-embedding-3-small
[tiny]
model = /models/tiny
[ce]
model = /models/ce
reranking = true
"""


class Server:
    def __init__(self, tmp_path: Path, preset: str = PRESET, *argv: str, engines: Engines | None = None):
        self.preset = tmp_path / "models.ini"
        self.preset.write_text(preset, encoding="utf-8")
        self.engines = engines if engines is not None else Engines()
        settings = parse_settings(["--models-preset", str(self.preset), "--metrics", *argv], {},
                                  system_config_files=[])
        self.residency = Residency(settings.models_max, engine_factory=self.engines,
                                   memory_bytes=settings.models_memory)
        self.router = ModelRouter(settings, self.residency, read_catalog(settings))
        self.client = TestClient(create_app(settings, self.router))

    def embed(self, model: str | None = None, text: str = "hello world"):
        return self.client.simulate_post("/v1/embeddings", json={"input": text, **({"model": model} if model else {})})

    def rerank(self, model: str | None = None):
        return self.client.simulate_post("/rerank", json={"query": "q", "documents": ["a b", "q"],
                                                          **({"model": model} if model else {})})

    def models(self) -> dict[str, dict]:
        return {item["id"]: item for item in self.client.simulate_get("/models").json["data"]}


@pytest.fixture
def server(tmp_path) -> Server:
    return Server(tmp_path)


def test_requests_route_by_id_or_alias_and_answers_echo_the_name_sent(server):
    res = server.embed("text-embedding-3-small")
    assert res.status_code == 200 and res.json["model"] == "text-embedding-3-small"
    assert len(server.engines.of("minilm")[0].embed_calls) == 1
    assert server.embed("tiny").json["model"] == "tiny"
    assert len(server.engines.of("tiny")[0].embed_calls) == 1 and len(server.engines.of("minilm")[0].embed_calls) == 1
    res = server.rerank("ce")
    assert res.status_code == 200 and res.json["model"] == "ce" and len(res.json["results"]) == 2


def test_no_model_picks_the_first_model_of_the_routes_kind(server):
    assert server.embed().json["model"] == "minilm"
    assert server.rerank().json["model"] == "ce"
    assert server.client.simulate_post("/embedding", json={"content": "x", "model": None}).status_code == 200
    assert server.engines.of("minilm")[0].embed_calls and not server.engines.of("tiny")
    minilm, ce = server.engines.of("minilm")[0], server.engines.of("ce")[0]
    n_minilm, n_ce = len(minilm.encode_calls), len(ce.encode_calls)
    assert server.client.simulate_post("/tokenize", json={"content": "a b"}).status_code == 200
    assert (len(minilm.encode_calls), len(ce.encode_calls)) == (n_minilm + 1, n_ce)  # the first model of any kind
    assert server.client.simulate_post("/tokenize", json={"content": "a", "model": "ce"}).status_code == 200
    assert (len(minilm.encode_calls), len(ce.encode_calls)) == (n_minilm + 1, n_ce + 1)


def test_an_unknown_model_or_one_of_the_other_kind_is_400(server):
    res = server.embed("text-embedding-ada-002")
    assert res.status_code == 400 and res.json["error"] == {
        "code": 400, "type": "invalid_request_error",
        "message": "model 'text-embedding-ada-002' not found; this server serves: minilm, tiny, ce"}
    res = server.embed("ce")
    assert res.status_code == 400
    assert res.json["error"]["message"] == ("model 'ce' is a reranker: the embedding routes need an embedding "
                                            "model (minilm, tiny)")
    assert server.rerank("tiny").json["error"]["message"] == ("model 'tiny' is an embedding model: the rerank "
                                                              "routes need a reranker (ce)")
    assert server.client.simulate_post("/v1/embeddings", json={"input": "x", "model": 7}).status_code == 400
    assert server.engines.made == []  # nothing was loaded for these


def test_a_route_with_no_model_of_its_kind_is_501(tmp_path):
    server = Server(tmp_path, "[tiny]\nmodel = /models/tiny\n")
    res = server.rerank()
    assert res.status_code == 501 and "no reranking model is configured" in res.json["error"]["message"]
    server = Server(tmp_path, "[ce]\nmodel = /models/ce\nreranking = true\n")
    assert server.embed().status_code == 501


def test_models_lists_every_model_with_its_kind_aliases_state_and_meta_once_loaded(server):
    listing = server.client.simulate_get("/v1/models").json
    assert list(listing) == ["data", "object"] and listing["object"] == "list"
    minilm = listing["data"][0]
    assert list(minilm) == ["id", "aliases", "tags", "object", "owned_by", "created", "status", "kind", "memory_bytes",
                            "stats"]
    assert minilm["memory_bytes"] == 0
    assert (minilm["id"], minilm["aliases"], minilm["kind"], minilm["object"], minilm["owned_by"]) == (
        "minilm", ["text-embedding-3-small"], "embedding", "model", "llamacpp")
    assert minilm["status"] == {"value": "unloaded", "in_use": 0}
    server.embed("minilm")
    models = server.models()
    assert models["minilm"]["status"]["value"] == "loaded" and models["tiny"]["status"]["value"] == "unloaded"
    assert models["minilm"]["meta"]["n_embd"] == 4 and "meta" not in models["tiny"]
    assert models["ce"]["kind"] == "rerank"
    assert models["minilm"]["memory_bytes"] == 90868376 and models["tiny"]["memory_bytes"] == 0
    assert models["minilm"]["stats"] == {"requests": 1, "items": 1, "tokens": 4, "errors": 0, "queue_seconds": 0.002,
                                         "compute_seconds": 0.0125, "load_seconds": 0.125,
                                         "loaded_bytes": 90868376, "last_error": None}


def test_load_and_unload(server):
    ok = {"success": True}
    assert server.client.simulate_post("/models/load", json={"model": "text-embedding-3-small"}).json == ok
    assert server.models()["minilm"]["status"]["value"] == "loaded"
    res = server.client.simulate_post("/models/load", json={"model": "minilm"})
    assert (res.status_code, res.json["error"]["message"]) == (400, "model is already running")
    assert server.client.simulate_post("/models/unload", json={"model": "minilm"}).json == ok
    assert server.models()["minilm"]["status"]["value"] == "unloaded"
    assert not server.engines.of("minilm")[0].is_loaded
    res = server.client.simulate_post("/models/unload", json={"model": "minilm"})
    assert (res.status_code, res.json["error"]["message"]) == (400, "model is not running")
    assert server.client.simulate_post("/models/load", json={"model": "gpt"}).status_code == 400
    assert server.client.simulate_post("/models/load", json={}).status_code == 400


def test_a_failed_load_is_a_server_error_shown_in_models_and_retried(server):
    server.engines.broken.add("ce")
    res = server.rerank()
    assert res.status_code == 500 and res.json["error"]["type"] == "server_error"
    assert "not a Hugging Face model folder" in res.json["error"]["message"]
    ce = server.models()["ce"]
    assert ce["status"]["value"] == "failed" and ce["status"]["failed"] is True
    assert "not a Hugging Face model folder" in ce["status"]["error"]
    assert ce["stats"]["errors"] == 1 and "not a Hugging Face" in ce["stats"]["last_error"]
    server.engines.broken.clear()
    assert server.rerank().status_code == 200  # the next request retries the load
    assert server.models()["ce"]["status"] == {"value": "loaded", "in_use": 0}


def test_a_reload_lets_the_request_in_flight_finish_on_the_engine_it_started_with(server):
    server.embed("tiny")  # tiny loaded, idle
    server.engines.gated.add("minilm")
    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(server.embed, "minilm")
        old = server.engines.first_made("minilm")
        assert old.entered.wait(10)
        # minilm changes (a new engine), tiny goes away, ce stays, bge arrives
        server.preset.write_text(PRESET.replace("[tiny]\nmodel = /models/tiny\n", "[bge]\nmodel = /models/bge\n")
                                 .replace("alias = text-embedding-3-small", "alias = small\npooling = cls"))
        listing = server.client.simulate_post("/models?reload=1")
        assert listing.status_code == 200 and [m["id"] for m in listing.json["data"]] == ["minilm", "bge", "ce"]
        assert not server.engines.of("tiny")[0].is_loaded  # removed and idle: unloaded at once
        assert old.is_loaded  # kept for its request, while /models already shows the new configuration
        assert server.models()["minilm"]["status"] == {"value": "unloaded", "in_use": 0}
        metrics = server.client.simulate_get("/metrics").text
        assert "llamacpp:requests_processing 1" in metrics  # the old copy still counts
        old.gate.set()
        assert in_flight.result(10).status_code == 200
    assert not old.is_loaded  # released: the old copy goes
    server.engines.gated.clear()
    assert server.embed("small").status_code == 200
    new = server.engines.of("minilm")[1]
    assert new is not old and server.engines.made[-1][0].pooling is Pooling.CLS and len(new.embed_calls) == 1
    assert server.embed("tiny").status_code == 400 and server.embed("text-embedding-3-small").status_code == 400


def test_a_broken_reload_keeps_the_previous_configuration(server):
    server.preset.write_text(PRESET + "port = 9\n")
    res = server.client.simulate_get("/models", params={"reload": "1"})
    assert res.status_code == 400 and res.json["error"]["message"].startswith("the configuration was not reloaded: ")
    assert f'{server.preset}: [ce] line 10: key "port"' in res.json["error"]["message"]
    assert list(server.models()) == ["minilm", "tiny", "ce"] and server.embed("tiny").status_code == 200
    assert server.client.simulate_post("/models").status_code == 501  # llama's download route


def test_metrics_count_per_model_and_sum_llamas_totals(server):
    for _ in range(3):
        server.embed("minilm", "a b c")
    server.embed("tiny")
    server.rerank()
    server.engines.of("tiny")[0].raise_on_embed = CheckpointNotFound("gone")
    server.embed("tiny")
    text = server.client.simulate_get("/metrics").text
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if not line.startswith("#")}
    assert values['mlx_embed:requests_total{model="minilm"}'] == 3
    assert values['mlx_embed:tokens_total{model="minilm"}'] == 15  # [CLS] a b c [SEP], three times
    assert values['mlx_embed:items_total{model="ce"}'] == 2 and values['mlx_embed:requests_total{model="ce"}'] == 1
    assert values['mlx_embed:requests_total{model="tiny"}'] == 2 and values['mlx_embed:errors_total{model="tiny"}'] == 1
    assert values['mlx_embed:loaded{model="minilm"}'] == 1 and values['mlx_embed:load_seconds{model="minilm"}'] == 0.125
    assert values['mlx_embed:compute_seconds_total{model="minilm"}'] == pytest.approx(3 * 0.0125)
    # llama's totals are every engine's counters summed (the fakes count 0.5 s and their tokens per embed)
    embedded = [e for name in ("minilm", "tiny") for e in server.engines.of(name)]
    assert values["llamacpp:prompt_tokens_total"] == sum(e.counters["prompt_tokens_total"] for e in embedded) == 19
    assert values["llamacpp:n_decode_total"] == 4
    assert server.models()["tiny"]["stats"]["last_error"] == "gone"


def test_props_is_the_routers_unless_a_model_is_named(server):
    props = server.client.simulate_get("/props").json
    assert (props["role"], props["max_instances"], props["model_path"]) == ("router", 4, "none")
    props = server.client.simulate_get("/props", params={"model": "text-embedding-3-small"}).json
    assert props["model_alias"] == "minilm" and props["total_slots"] == 2
    assert server.client.simulate_get("/props", params={"model": "nope"}).status_code == 400
    assert len(server.client.simulate_get("/slots", params={"model": "ce"}).json) == 2


def test_timing_headers_and_health_do_not_wait_for_models(server):
    assert server.client.simulate_get("/health").json == {"status": "ok"} and server.engines.made == []
    res = server.embed()
    assert {"x-tokenization-time", "x-queue-time", "x-inference-time", "x-total-time"} <= set(res.headers)


def test_the_single_model_server_only_echoes_model_and_has_no_model_management(make_client):
    client = make_client("--embedding")
    res = client.simulate_post("/v1/embeddings", json={"input": "x", "model": "text-embedding-3-small"})
    assert res.status_code == 200 and res.json["model"] == "text-embedding-3-small"
    assert client.simulate_post("/models/load", json={"model": "x"}).status_code == 404
    assert '{model="' not in make_client("--embedding", "--metrics").simulate_get("/metrics").text  # no per-model series


def test_a_load_outlasting_the_timeout_is_a_504_not_a_503(server):
    server.engines.slow.add("tiny")
    res = server.embed("tiny")
    assert res.status_code == 504
    assert res.json["error"]["message"] == "model 'tiny' did not finish loading within 3600 s"
    assert server.embed("minilm").status_code == 200  # other models are not held up


def test_one_folder_under_two_names_is_loaded_once(tmp_path):
    server = Server(tmp_path, "[first]\nmodel = /models/minilm\nalias = one,uno\n[second]\nmodel = /models/minilm/\n")
    for name in ("first", "one", "uno", "second"):
        assert server.embed(name).status_code == 200
    assert len(server.engines.of("minilm")) == 1
    models = server.models()
    assert models["first"]["status"]["value"] == models["second"]["status"]["value"] == "loaded"


def test_the_memory_budget_keeps_the_least_recently_used_out_and_refuses_a_model_alone_over_it(tmp_path):
    engines = Engines()
    engines.sizes = {"minilm": 600_000_000, "tiny": 300_000_000, "ce": 2_000_000_000}
    server = Server(tmp_path, PRESET, "--models-memory", "1G", engines=engines)
    assert server.embed("minilm").status_code == 200 and server.embed("tiny").status_code == 200
    models = server.models()
    assert (models["minilm"]["memory_bytes"], models["tiny"]["memory_bytes"]) == (600_000_000, 300_000_000)
    res = server.rerank("ce")  # 2e9 bytes alone: over the 1 GiB budget, whatever is unloaded
    assert res.status_code == 500
    message = res.json["error"]["message"]
    assert "2000000000 bytes" in message and "1073741824 bytes" in message and "--models-memory" in message
    models = server.models()
    assert models["ce"]["status"]["value"] == "failed" and models["ce"]["stats"]["last_error"] == message
    assert models["ce"]["stats"]["requests"] == 1 and models["ce"]["stats"]["errors"] == 1
    assert models["ce"]["memory_bytes"] == 0
    assert server.embed("minilm").status_code == 200  # the others serve on
    text = server.client.simulate_get("/metrics").text
    assert 'mlx_embed:memory_bytes{model="minilm"} 600000000' in text


def test_two_first_use_requests_under_a_budget_of_one_model_both_answer(tmp_path):
    """Seed 003's race through the routes: two requests resolve different models before either has loaded."""
    engines = Engines()
    engines.gated = {"minilm", "tiny"}
    server = Server(tmp_path, PRESET, "--models-memory", "100M", engines=engines)
    with ThreadPoolExecutor(2) as pool:
        answers = [pool.submit(server.embed, name) for name in ("minilm", "tiny")]
        first, second = engines.first_made("minilm"), engines.first_made("tiny")
        assert first.entered.wait(10) and second.entered.wait(10)  # both are computing on their own engine
        first.gate.set()
        second.gate.set()
        assert [answer.result(10).status_code for answer in answers] == [200, 200]
    loaded = [name for name, item in server.models().items() if item["status"]["value"] == "loaded"]
    assert len(loaded) == 1 and len(engines.of("minilm")) == len(engines.of("tiny")) == 1


def test_a_load_refused_by_the_budget_without_a_request_shows_its_error_in_models(tmp_path):
    engines = Engines()
    engines.sizes = {"ce": 2_000_000_000}
    server = Server(tmp_path, PRESET, "--models-memory", "1G", engines=engines)
    assert server.client.simulate_post("/models/load", json={"model": "ce"}).json == {"success": True}
    engines.first_made("ce")
    deadline = time.monotonic() + 10
    while server.models()["ce"]["status"]["value"] != "failed":  # measured when its load ended
        assert time.monotonic() < deadline
        time.sleep(0.01)
    stats = server.models()["ce"]["stats"]
    assert stats["requests"] == 0 and "2000000000 bytes resident" in stats["last_error"]
