"""Start the real server as a subprocess on a loopback port and speak HTTP to it.

The process plumbing (start, wait for GET /health, stop, the log) is benchmarks/harness.py's ServerProcess,
the one the benchmarks use; this module owns what the tests add to it: the `compat.cli` command line built
from the test's flags, a clean environment with a private config home, the log in a temporary file, request
helpers, and the payload helpers for multimodal inputs. benchmarks/harness.py imports only the standard
library and numpy at load time, so the test extras (no psutil) suffice.
"""
from __future__ import annotations

import base64
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import requests

from benchmarks.harness import HOST, free_port
from benchmarks.harness import ServerProcess as _ServerProcess

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["ROOT", "ServerProcess", "b64", "clean_env", "free_port", "image_part", "run_cli"]


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without llama variables, with a private config home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "HF_"))}
    home = tempfile.mkdtemp(prefix="mlx-embed-home-")
    env.update(HOME=home, XDG_CONFIG_HOME=str(Path(home) / ".config"), HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


class ServerProcess(_ServerProcess):
    """`python -m compat.cli` with the given flags (plus --host/--port unless host_args=False), in a clean
    environment; `with ServerProcess(...) as srv` starts it, waits until ready and stops it."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, host_args: bool = True,
                 cwd: Path | None = None):
        port = free_port()
        net = ["--host", HOST, "--port", str(port)] if host_args else []
        env = env if env is not None else clean_env()
        if cwd is not None:  # started elsewhere (relative -m paths), the sources still come from the repository
            env = {**env, "PYTHONPATH": str(ROOT)}
        log = tempfile.NamedTemporaryFile(prefix="mlx-embed-log-", suffix=".txt", delete=False)
        super().__init__([sys.executable, "-m", "compat.cli", *net, *args], port, log, cwd=cwd or ROOT, env=env,
                         stdin=None)

    def start(self, wait: bool = True, timeout: float = 90) -> "ServerProcess":
        super().start()
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 90, headers: dict | None = None) -> None:
        # a probe that times out (a loaded machine, a load holding the GIL) is tried again, as a refused connection is
        super().wait_ready(timeout, probe_timeout=2, headers=headers, retry=(requests.ConnectionError, requests.Timeout))

    def get(self, path: str, **kw) -> requests.Response:
        return requests.get(self.base + path, timeout=60, **kw)

    def post(self, path: str, json=None, **kw) -> requests.Response:
        return requests.post(self.base + path, json=json, timeout=120, **kw)

    def stop(self) -> None:
        super().stop(grace=5, kill_wait=None)

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def b64(data: bytes) -> str:
    """Bytes as the base64 text a multimodal_data entry carries."""
    return base64.b64encode(data).decode()


def image_part(data: bytes) -> dict:
    """An OpenAI image_url content part holding PNG bytes as a data: URL."""
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(data)}"}}


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    """Run the command to completion (for startup errors and --help)."""
    return subprocess.run([sys.executable, "-m", "compat.cli", *args], cwd=ROOT, env=env or clean_env(),
                          capture_output=True, text=True, timeout=timeout)
