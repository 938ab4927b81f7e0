"""llama.cpp's own server tests, run unmodified against our server and against the real llama-server.

upstream/ holds llama.cpp's tools/server/tests files as they are at commit 3f545bec (README.md). Their harness
(upstream/utils.py) starts the binary named by LLAMA_SERVER_BIN_PATH with flags built from a ServerProcess's
attributes; every module runs twice, once with that variable pointing at a wrapper that runs `python -m
compat.cli` with the same argv, once at shared/peers/llama-server. What this file changes, and nothing else:

- the models: the presets name Hugging Face files (unreachable here); `ServerProcess.start` is wrapped to serve
  a local GGUF of the same architecture instead (LOCAL_MODELS), and `ServerPreset.load_all`, which exists to
  download them, does nothing;
- the port: each started server gets a free port (their default, 8080, is shared by every engineer here);
- reuse: their harness starts a fresh server for every test; here a server started with the same binary and
  flags is kept for the module's later tests (our server takes ~10 s to start on this 2-core machine, and the
  three files have 42 tests). `LLAMA_CPP_TESTS_FRESH_SERVERS=1` restores a fresh server per test;
- MODEL_FACTS: the tests that assert a fact of the model llama.cpp downloads, which the local model cannot have,
  each with its reason; they still run, as strict xfails, on both servers: they fail on llama-server on the same
  file too, and a test that starts passing (a model swapped for one that has the fact) is reported.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from benchmarks.harness import free_port
from tests.conftest import gguf_fixture, shared_dir
from tests.llama_cpp_server.models import write_tiny_jina_reranker_gguf, write_tiny_llama_spm_gguf

UPSTREAM = Path(__file__).resolve().parent / "upstream"
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(UPSTREAM))  # where their conftest finds it (`from utils import *`)
import utils  # noqa: E402  (upstream/utils.py, their harness)

FRESH_SERVERS = os.environ.get("LLAMA_CPP_TESTS_FRESH_SERVERS") == "1"
START_TIMEOUT = 180  # theirs is 60 s; a loaded 2-core machine needs more for our server's imports and load

# the Hugging Face file each preset names -> a builder of the local GGUF served in its place
LOCAL_MODELS = {
    # bge-small-en-v1.5 is a BERT with bert-base-uncased's WordPiece vocabulary; all-MiniLM-L6-v2 is a BERT with
    # the same vocabulary (llama.cpp's F16 conversion, shared/fixtures/gguf)
    ("ggml-org/models", "bert-bge-small/ggml-model-f16.gguf"): lambda folder: gguf_fixture("minilm-f16.gguf"),
    # jina-reranker-v1-tiny-en: `jina-bert-v2` with its classifier as `cls` and a `jina-v1-en` BPE vocabulary,
    # written in the published file's layout with random weights (models.py)
    ("ggml-org/models", "jina-reranker-v1-tiny-en/ggml-model-f16.gguf"):
        lambda folder: write_tiny_jina_reranker_gguf(folder / "tiny-jina-reranker-v1-f16.gguf"),
    # stories260K: a tiny `llama` decoder with a SentencePiece vocabulary (BOS 1 added, byte fallback); one in
    # that layout, random weights, the vocabulary trained here (models.py)
    ("ggml-org/test-model-stories260K", None): lambda folder: write_tiny_llama_spm_gguf(folder / "tiny-llama.gguf"),
}

# a test below upstream/ (`unit/FILE.py::NAME`, every parametrization) -> why it cannot pass on the local model,
# on either server
MODEL_FACTS = {
    "unit/test_rerank.py::test_rerank": "jina-reranker-v1-tiny-en's trained weights rank the machine-learning "
    "document first and the French one last; no trained jina reranker can be had here, and random weights rank "
    "at random (the trained bert-tiny-ce-distilled GGUF puts the French one second on llama-server; orderings "
    "on trained weights: tests/server/test_llama_rerank.py)",
    "unit/test_rerank.py::test_rerank_tei_format": "the same ordering as test_rerank, in TEI's response shape",
    "unit/test_rerank.py::test_rerank_usage": "19 and 26 tokens are counts of jina-reranker-v1-tiny-en's own "
    "`jina-v1-en` BPE vocabulary; the local file's BPE is trained here on a small corpus and splits differently",
}

TARGETS = ("mlx-embed-server", "llama-server")


_models: dict[tuple[str | None, str | None], Path] = {}
_kept: dict[tuple, "utils.ServerProcess"] = {}
_original_start = utils.ServerProcess.start
_original_stop = utils.ServerProcess.stop
_VOLATILE = {"server_port", "process", "ready", "_log"}


def _local_model(server: "utils.ServerProcess") -> None:
    ref = (server.model_hf_repo, server.model_hf_file)
    if ref == (None, None):
        return
    if ref not in _models:
        raise AssertionError(f"no local GGUF stands in for {ref}: add it to LOCAL_MODELS")
    server.model_file = str(_models[ref])
    server.model_hf_repo = server.model_hf_file = None


def _start(self, timeout_seconds: int = START_TIMEOUT) -> None:
    _local_model(self)
    key = (os.environ.get("LLAMA_SERVER_BIN_PATH"),
           tuple(sorted((k, repr(v)) for k, v in vars(self).items() if k not in _VOLATILE)))
    kept = _kept.get(key)
    if kept is not None and kept.process is not None and kept.process.poll() is None:
        self.server_port = kept.server_port
        self.ready = True
        return
    self.server_port = free_port()
    _original_start(self, timeout_seconds=max(timeout_seconds, START_TIMEOUT))
    if not FRESH_SERVERS:
        _kept[key] = self


def _stop(self) -> None:
    if any(kept is self for kept in _kept.values()):
        utils.server_instances.discard(self)  # kept for the module's later tests; stopped at its end
        return
    _original_stop(self)


def _stop_kept() -> None:
    for server in list(_kept.values()):
        _original_stop(server)
    _kept.clear()


def _nothing_to_download() -> None:
    """ServerPreset.load_all starts every preset once to download its model; the local ones are built at session
    start (local_models), and presets no test here uses have none."""


utils.ServerProcess.start = _start
utils.ServerProcess.stop = _stop
utils.ServerPreset.load_all = staticmethod(_nothing_to_download)


def _our_server(folder: Path) -> Path:
    """A wrapper that runs our server with the harness's argv, in a private config home."""
    home = folder / "home"
    home.mkdir(exist_ok=True)
    script = folder / "mlx-embed-server"
    script.write_text(f"""#!/bin/sh
export PYTHONPATH="{ROOT}" HOME="{home}" XDG_CONFIG_HOME="{home}/.config" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec "{sys.executable}" -m compat.cli "$@"
""", encoding="utf-8")
    script.chmod(0o755)
    return script


@pytest.fixture(scope="session", autouse=True)
def local_models(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("llama-cpp-server-models")
    for ref, build in LOCAL_MODELS.items():
        _models[ref] = Path(build(folder))
    return _models


@pytest.fixture(scope="module", autouse=True, params=TARGETS)
def server_binary(request, tmp_path_factory):
    """Each upstream module against our server, then against the real llama-server."""
    if request.param == "llama-server":
        binary = shared_dir() / "peers" / "llama-server"
        if not binary.is_file():
            pytest.skip("shared/peers/llama-server is not available")
    else:
        binary = _our_server(tmp_path_factory.mktemp("mlx-embed-server-bin"))
    patch = pytest.MonkeyPatch()
    patch.setenv("LLAMA_SERVER_BIN_PATH", str(binary))
    patch.chdir(tmp_path_factory.mktemp("llama-cpp-server-cwd"))  # their LLAMA_CACHE=tmp is relative to it
    try:
        yield request.param
    finally:
        _stop_kept()
        patch.undo()


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        if UPSTREAM in path.parents:
            reason = MODEL_FACTS.get(f"{path.relative_to(UPSTREAM).as_posix()}::{item.originalname}")
            if reason:
                reason = f"a fact of llama.cpp's test model, not of the local one: {reason}"
                item.add_marker(pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason))
