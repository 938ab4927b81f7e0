"""The real llama-server (shared/peers/llama-server) on a GGUF, for side-by-side answers in tests.

Tests that need it skip when the binary is absent; it only ever listens on 127.0.0.1.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import requests

from tests.conftest import shared_dir
from benchmarks.harness import ServerProcess
from tests.server.harness import clean_env, free_port


def binary() -> Path:
    path = shared_dir() / "peers" / "llama-server"
    if not path.is_file():
        pytest.skip("shared/peers/llama-server is not available")
    return path


class LlamaServer(ServerProcess):
    """llama-server on `model` through the benchmarks' server process (its log in a temporary file: a pipe nobody
    reads fills up and blocks the server mid-test)."""

    def __init__(self, model: Path, *args: str):
        port = free_port()
        argv = [str(binary()), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", "2",
                "-c", "2048", "-np", "1", "--fit", "off", *args]
        super().__init__(argv, port, tempfile.NamedTemporaryFile(prefix="llama-server-log-", suffix=".txt"),
                         env=clean_env())
        self.start()

    def __enter__(self) -> "LlamaServer":
        outcome = self.poll_ready(180, probe_timeout=5, interval=0.1)  # 5 s probes: busy loading
        if outcome != "ready":
            tail = self.output()[-2000:]
            self.__exit__()
            raise RuntimeError(f"llama-server {'exited' if outcome == 'exited' else 'was not ready within 180 s'}: "
                               f"{tail}")
        return self

    def __exit__(self, *exc) -> None:
        self.stop(grace=10, kill_wait=None)
        self.log.close()

    def post(self, route: str, body: dict) -> dict | list:
        res = requests.post(self.base + route, json=body, timeout=60)
        res.raise_for_status()
        return res.json()

    def tokenize(self, text: str) -> list[int]:
        return self.post("/tokenize", {"content": text, "add_special": True})["tokens"]

    def embeddings(self, texts: list[str]) -> list[list[float]]:
        return [item["embedding"] for item in self.post("/v1/embeddings", {"input": texts})["data"]]

    def rerank(self, query: str, documents: list[str]) -> list[float]:
        """/rerank's raw relevance_score of each document, in the documents' order."""
        results = self.post("/rerank", {"query": query, "documents": documents})["results"]
        return [item["relevance_score"] for item in sorted(results, key=lambda item: item["index"])]
