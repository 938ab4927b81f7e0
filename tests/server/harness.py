"""Start the real server as a subprocess on a loopback port and speak HTTP to it."""
from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without llama variables, with a private config home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "HF_"))}
    home = tempfile.mkdtemp(prefix="mlx-embed-home-")
    env.update(HOME=home, XDG_CONFIG_HOME=str(Path(home) / ".config"), HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


class ServerProcess:
    def __init__(self, *args: str, env: dict[str, str] | None = None, host_args: bool = True,
                 cwd: Path | None = None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        net = ["--host", "127.0.0.1", "--port", str(self.port)] if host_args else []
        self.argv = [sys.executable, "-m", "compat.cli", *net, *args]
        self.env = env if env is not None else clean_env()
        self.log = tempfile.NamedTemporaryFile(prefix="mlx-embed-log-", suffix=".txt", delete=False)
        self.proc: subprocess.Popen | None = None
        self.cwd = cwd or ROOT
        if cwd is not None:  # started elsewhere (relative -m paths), the sources still come from the repository
            self.env = {**self.env, "PYTHONPATH": str(ROOT)}

    def start(self, wait: bool = True, timeout: float = 90) -> "ServerProcess":
        self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready(timeout)
        return self

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def wait_ready(self, timeout: float = 90, headers: dict | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if requests.get(self.base + "/health", timeout=2, headers=headers).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"server not ready in {timeout} s:\n{self.output()}")

    def get(self, path: str, **kw) -> requests.Response:
        return requests.get(self.base + path, timeout=60, **kw)

    def post(self, path: str, json=None, **kw) -> requests.Response:
        return requests.post(self.base + path, json=json, timeout=120, **kw)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

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
