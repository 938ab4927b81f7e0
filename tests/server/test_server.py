"""The real server end to end: startup, loading state, auth, option sources, queue limits, numbers."""
from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from engine import default_model
from engine.runtime import threads
from tests.conftest import parse_metrics
from tests.server.harness import ServerProcess, clean_env, run_cli

LOADING = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}


@pytest.fixture(scope="module")
def server():
    with ServerProcess("--embedding", "--metrics") as srv:
        yield srv


def test_vectors_match_sentence_transformers(server):
    from sentence_transformers import SentenceTransformer

    texts = ["The cat sits on the mat.", "Où est la gare ?", "A 200-page report on 3.5% growth in Q4 2025",
             "def f(x): return x ** 2", "東京は日本の首都です。", ""]
    ref = SentenceTransformer(default_model(), device="cpu").encode(texts, normalize_embeddings=True)
    res = server.post("/v1/embeddings", {"input": texts, "encoding_format": "float"})
    assert res.status_code == 200
    data = res.json()["data"]
    assert [item["index"] for item in data] == list(range(len(texts)))
    for item, want in zip(data, ref, strict=True):
        got = np.asarray(item["embedding"])
        assert np.dot(got, want) / np.linalg.norm(got) / np.linalg.norm(want) >= 0.999999
        assert abs(np.linalg.norm(got) - 1) < 1e-6


def test_non_oai_route_nests_the_pooled_vector(server):
    body = server.post("/embedding", {"content": "hello", "embd_normalize": -1}).json()
    oai = server.post("/v1/embeddings", {"input": "hello"}).json()["data"][0]["embedding"]
    assert [item["index"] for item in body] == [0] and len(body[0]["embedding"]) == 1
    raw = np.asarray(body[0]["embedding"][0])
    np.testing.assert_allclose(raw / np.linalg.norm(raw), oai, atol=1e-6)
    assert abs(np.linalg.norm(raw) - 1) > 1e-2  # -1 really left it unnormalized


def test_concurrent_requests_keep_their_vectors(server):
    # that concurrent inputs share passes is shown deterministically in tests/engine/test_service.py
    texts = [("word " * n).strip() for n in (1, 3, 7, 20, 60, 150)] * 3
    alone = [server.post("/v1/embeddings", {"input": t}).json()["data"][0]["embedding"] for t in texts[:6]]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda t: server.post("/v1/embeddings", {"input": t}).json(), texts))
    for i, body in enumerate(together):
        assert len(body["data"]) == 1
        np.testing.assert_allclose(body["data"][0]["embedding"], alone[i % 6], atol=1e-5)


def test_metrics_count_embedding_tokens(server):
    before = {name: _metric(server, name) for name in ("prompt_tokens_total", "n_decode_total")}
    server.post("/v1/embeddings", {"input": ["I believe the meaning of life is", "This is a test"]})
    res = server.get("/metrics")
    assert res.status_code == 200 and "Process-Start-Time-Unix" in res.headers
    assert _metric(server, "prompt_tokens_total") - before["prompt_tokens_total"] == 9 + 6
    # two short inputs: one pass with one engine lane; with two, each lane takes one (its even share)
    lanes, _ = threads.plan(-1)
    assert _metric(server, "n_decode_total") - before["n_decode_total"] == min(2, lanes)
    assert _metric(server, "tokens_predicted_total") == 0


def _metric(server: ServerProcess, name: str) -> float:
    return float(parse_metrics(server.get("/metrics").text)[f"llamacpp:{name}"])


def test_every_route_answers_503_while_loading():
    srv = ServerProcess("--embedding", "--api-key", "secret").start(wait=False)
    try:
        seen = None
        deadline = time.monotonic() + 60
        while seen is None and time.monotonic() < deadline:
            try:
                seen = requests.post(srv.base + "/v1/embeddings", json={"input": "x"}, timeout=5)
            except requests.ConnectionError:
                time.sleep(0.01)
        assert seen is not None and seen.status_code == 503, srv.output()
        assert seen.json() == LOADING  # even with no API key: the loading check runs first
        srv.wait_ready()
        assert srv.post("/v1/embeddings", {"input": "x"}).status_code == 401
    finally:
        srv.stop()


def test_more_inputs_than_the_queue_holds_is_413_and_the_server_keeps_serving():
    with ServerProcess("--embedding", "--max-queue-items", "4") as srv:
        res = srv.post("/v1/embeddings", {"input": ["a", "b", "c", "d", "e"]})
        assert res.status_code == 413  # it can never fit: retrying later would not help (a full queue is 503)
        assert res.json() == {"error": {"code": 413, "type": "invalid_request_error", "message":
                              "this request has 5 inputs; the engine queue holds at most 4 (--max-queue-items)"}}
        assert srv.post("/v1/embeddings", {"input": ["a", "b", "c", "d"]}).status_code == 200


def test_api_keys_from_flag_and_file(tmp_path):
    key_file = tmp_path / "keys.txt"
    key_file.write_text("# operators\nsk-from-file\n\n")
    with ServerProcess("--embedding", "--api-key", "sk-one,sk-two", "--api-key-file", str(key_file)) as srv:
        assert srv.get("/health").status_code == 200
        denied = srv.post("/v1/embeddings", {"input": "x"})
        assert denied.status_code == 401
        assert denied.json() == {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}
        assert srv.post("/v1/embeddings", {"input": "x"}, headers={"Authorization": "Bearer wrong"}).status_code == 401
        for headers in ({"Authorization": "Bearer sk-two"}, {"X-Api-Key": "sk-one"},
                        {"Authorization": "Bearer sk-from-file"}):
            assert srv.post("/v1/embeddings", {"input": "x"}, headers=headers).status_code == 200
    assert not any(key in srv.output() for key in ("sk-one", "sk-two", "sk-from-file"))
    assert "readable by every user" in srv.output()  # the file was written with the usual 0644


def _model_id(srv: ServerProcess) -> str:
    return srv.get("/v1/models").json()["data"][0]["id"]


def test_option_sources_in_precedence_order(tmp_path):
    env = clean_env()
    config_dir = Path(env["XDG_CONFIG_HOME"]) / "llama.cpp"
    config_dir.mkdir(parents=True)
    (config_dir / "config.ini").write_text("[*]\nalias = from-xdg\nembedding = true\n")
    with ServerProcess(env=env) as srv:
        assert _model_id(srv) == "from-xdg"
    extra = tmp_path / "extra.ini"
    extra.write_text("[*]\na = from-config-file\n")
    with ServerProcess("--config", str(extra), env=env) as srv:
        assert _model_id(srv) == "from-config-file"
    with ServerProcess("--config", str(extra), env={**env, "LLAMA_ARG_ALIAS": "from-env"}) as srv:
        assert _model_id(srv) == "from-env"
    with ServerProcess("--config", str(extra), "--alias", "from-cli", env={**env, "LLAMA_ARG_ALIAS": "from-env"}) as srv:
        assert _model_id(srv) == "from-cli"
        assert "LLAMA_ARG_ALIAS environment variable is set, but will be overwritten" in srv.output()


def test_env_flags_follow_llama_truthiness():
    env = clean_env(LLAMA_ARG_EMBEDDINGS="yes", LLAMA_ARG_ENDPOINT_METRICS="1")
    with ServerProcess(env=env) as srv:
        # "yes" is not truthy for llama: embeddings stay off; "1" is: metrics are on.
        assert srv.post("/v1/embeddings", {"input": "x"}).status_code == 501
        assert srv.get("/metrics").status_code == 200
    bad = run_cli("--embedding", env=clean_env(LLAMA_ARG_ENDPOINT_SLOTS="maybe"))
    assert bad.returncode == 1
    assert 'LLAMA_ARG_ENDPOINT_SLOTS' in bad.stderr and "invalid boolean value" in bad.stderr


def test_unknown_flag_exits_1():
    res = run_cli("--embedding", "--bogus-flag")
    assert res.returncode == 1
    assert "error: invalid argument: --bogus-flag" in res.stderr


def test_help_lists_options_with_env_names():
    res = run_cli("--help")
    assert res.returncode == 0
    for text in ("--embedding", "LLAMA_ARG_EMBEDDINGS", "--embd-normalize", "LLAMA_API_KEY", "--pooling"):
        assert text in res.stdout


def test_model_load_failure_exits_with_the_reason(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}')
    res = run_cli("--port", "0", "-m", str(tmp_path), "--embedding")
    assert res.returncode != 0
    assert "gpt2" in res.stderr and "not supported" in res.stderr


def test_llama_flags_without_meaning_here_are_accepted():
    with ServerProcess("--embedding", "-ngl", "99", "-fa", "on", "--jinja", "-cb", "--temp", "0.8",
                       "-ctk", "q8_0", "--log-colors", "off") as srv:
        assert srv.post("/v1/embeddings", {"input": "x"}).status_code == 200
        assert "n-gpu-layers" in srv.output() or "ngl" in srv.output()


def test_unix_socket(tmp_path):
    sock = str(tmp_path / "embed.sock")
    srv = ServerProcess("--embedding", "--host", sock, host_args=False).start(wait=False)
    try:
        deadline = time.monotonic() + 60
        import http.client
        import socket as socketlib

        class UnixConnection(http.client.HTTPConnection):
            def connect(self):
                self.sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
                self.sock.connect(sock)

        status = None
        while time.monotonic() < deadline and status != 200:
            if srv.proc.poll() is not None:
                raise AssertionError(srv.output())
            try:
                conn = UnixConnection("localhost")
                conn.request("GET", "/health")
                status = conn.getresponse().status
            except (FileNotFoundError, ConnectionRefusedError):
                time.sleep(0.05)
        assert status == 200
    finally:
        srv.stop()


def test_hf_repo_resolves_through_the_hugging_face_cache(tmp_path):
    # The hub cache layout, built by hand: models--org--name/{refs/main, snapshots/<commit>/...}
    repo = tmp_path / "hub" / "models--example-org--minilm"
    snapshot = repo / "snapshots" / "0123456789abcdef"
    snapshot.mkdir(parents=True)
    for item in Path(default_model()).iterdir():
        (snapshot / item.name).symlink_to(item)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123456789abcdef")
    env = clean_env(HF_HUB_CACHE=str(tmp_path / "hub"))
    with ServerProcess("--embedding", "-hf", "example-org/minilm", "--offline", env=env) as srv:
        assert _model_id(srv) == "example-org/minilm"  # llama's name rule: the -hf string
        assert srv.get("/props").json()["model_path"] == str(snapshot)
        usage = srv.post("/v1/embeddings", {"input": "I believe the meaning of life is"}).json()["usage"]
        assert usage["prompt_tokens"] == 9
    missing = run_cli("--embedding", "-hf", "example-org/absent", "--offline", "--port", "0", env=env)
    assert missing.returncode != 0 and "example-org/absent" in missing.stderr
