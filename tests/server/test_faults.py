"""Faults the server survives: a model whose files are corrupt or vanish before its lazy load fails with 500
naming the reason and shows `failed` in /models while the other models serve on unchanged (a real several-model
server); a forward pass that raises, or runs out of memory, fails its batch with 500 and the next request is
served (the real engine behind the app)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from falcon.testing import TestClient

from compat.app import create_app
from compat.settings import parse_settings
from tests.conftest import minilm_dir, tiny_bert_dir
from tests.engine.helpers import start_engine
from tests.server.harness import ServerProcess

FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _copy_of_tiny_bert(folder: Path) -> Path:
    folder.mkdir()
    for name in FILES:
        shutil.copy(tiny_bert_dir() / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    for name in ("healthy", "corrupt", "vanishing"):
        _copy_of_tiny_bert(root / name)
    preset = root / "models.ini"
    preset.write_text("".join(f"[{name}]\nmodel = {root / name}\n" for name in ("healthy", "corrupt", "vanishing")))
    with ServerProcess("--models-preset", str(preset), "-t", "1") as srv:
        srv.root = root
        yield srv


def _embed(server: ServerProcess, model: str):
    return server.post("/v1/embeddings", {"input": ["a fault test", "two"], "model": model})


def _status(server: ServerProcess, model: str) -> dict:
    return {m["id"]: m for m in server.get("/models").json()["data"]}[model]["status"]


def test_corrupt_or_vanished_weights_fail_that_model_only(server):
    before = np.asarray([d["embedding"] for d in _embed(server, "healthy").json()["data"]])
    # the weights are overwritten with garbage, or the folder disappears, before the first use of the model
    (server.root / "corrupt" / "model.safetensors").write_bytes(b"\x00" * 64)
    shutil.rmtree(server.root / "vanishing")
    for model, reason in (("corrupt", "Invalid json header length"), ("vanishing", "no config.json")):
        res = _embed(server, model)
        assert res.status_code == 500, res.text
        error = res.json()["error"]
        assert error["type"] == "server_error" and f"{model} failed to load" in error["message"], error
        assert reason.lower() in error["message"].lower(), error
        status = _status(server, model)
        assert status["value"] == "failed" and status["failed"] is True and reason.lower() in status["error"].lower()
    after = np.asarray([d["embedding"] for d in _embed(server, "healthy").json()["data"]])
    # the other model never noticed (to batch invariance: the two inputs may share a pass or not)
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-6)
    assert _status(server, "healthy")["value"] == "loaded"
    assert server.get("/health").status_code == 200
    # mended files: the next request retries the load and succeeds
    _copy_of_tiny_bert(server.root / "vanishing")
    assert _embed(server, "vanishing").status_code == 200 and _status(server, "vanishing")["value"] == "loaded"


# -- the real engine behind the app, in this process: a forward pass that fails ------------------------------------
@pytest.fixture(scope="module")
def app_on_minilm():
    engine = start_engine(minilm_dir())
    settings = parse_settings(["--embedding"], {}, system_config_files=[])
    yield engine, TestClient(create_app(settings, engine))
    engine.close()


@pytest.mark.parametrize("error,status_message", [
    (RuntimeError("kernel exploded"), "the forward pass failed: kernel exploded"),
    (MemoryError("std::bad_alloc"), "the forward pass ran out of memory (std::bad_alloc); batches are now capped"),
])
def test_a_failing_forward_pass_is_a_500_for_its_batch_and_the_next_request_is_served(app_on_minilm, monkeypatch,
                                                                                        error, status_message):
    engine, client = app_on_minilm
    healthy = client.simulate_post("/v1/embeddings", json={"input": ["one", "two"]}).json["data"]
    real = engine._worker._runner
    calls = []

    def fails_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise error
        return real(*args)

    monkeypatch.setattr(engine._worker, "_runner", fails_once)
    res = client.simulate_post("/v1/embeddings", json={"input": ["one", "two"]})
    assert res.status_code == 500
    assert res.json["error"]["type"] == "server_error" and res.json["error"]["message"].startswith(status_message)
    again = client.simulate_post("/v1/embeddings", json={"input": ["one", "two"]})
    assert again.status_code == 200
    for got, want in zip(again.json["data"], healthy, strict=True):
        np.testing.assert_allclose(got["embedding"], want["embedding"], atol=1e-6)
