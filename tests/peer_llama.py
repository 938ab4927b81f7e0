"""The real llama-server (shared/peers/llama-server) on a GGUF, for side-by-side answers in tests.

Tests that need it skip when the binary is absent; it only ever listens on 127.0.0.1.
"""
from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import shared_dir
from tests.server.harness import clean_env, free_port


def binary() -> Path:
    path = shared_dir() / "peers" / "llama-server"
    if not path.is_file():
        pytest.skip("shared/peers/llama-server is not available")
    return path


class LlamaServer:
    def __init__(self, model: Path, *args: str):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        argv = [str(binary()), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port), "-t", "2",
                "-c", "2048", "-np", "1", "--fit", "off", *args]
        # its log goes to a file: a pipe nobody reads fills up and blocks the server mid-test
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server-log-", suffix=".txt")
        self.proc = subprocess.Popen(argv, env=clean_env(), stdout=subprocess.DEVNULL, stderr=self.log)

    def __enter__(self) -> "LlamaServer":
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {Path(self.log.name).read_text(errors='replace')[-2000:]}")
            try:
                if requests.get(self.base + "/health", timeout=5).status_code == 200:
                    return self
            except requests.RequestException:  # not listening yet, or busy loading
                pass
            time.sleep(0.1)
        self.__exit__()
        raise RuntimeError("llama-server did not become ready within 180 s")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def post(self, route: str, body: dict) -> dict | list:
        res = requests.post(self.base + route, json=body, timeout=60)
        res.raise_for_status()
        return res.json()

    def tokenize(self, text: str) -> list[int]:
        return self.post("/tokenize", {"content": text, "add_special": True})["tokens"]

    def embeddings(self, texts: list[str]) -> list[list[float]]:
        return [item["embedding"] for item in self.post("/v1/embeddings", {"input": texts})["data"]]
