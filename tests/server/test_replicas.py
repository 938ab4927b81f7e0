"""Two replicas behind a real nginx running config/nginx-replicas.conf (ports swapped for free loopback ones): one
replica is killed under load and no client sees an error. Skipped when nginx is not installed
(scripts/setup.sh --test installs it when run as root)."""
from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.conftest import parse_metrics
from tests.server.harness import ROOT, ServerProcess, free_port

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()),
                                      None)
pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (Debian: apt-get install nginx; "
                                                      "scripts/setup.sh --test does it when run as root)")

TEXTS = [f"replica test sentence number {i} " + "with more words " * (i % 5) for i in range(24)]


def nginx_config(front: int, first: int, second: int) -> str:
    text = (ROOT / "config" / "nginx-replicas.conf").read_text()
    for old, new in (("listen 127.0.0.1:8080;", f"listen 127.0.0.1:{front};"),
                     ("server 127.0.0.1:8081 ", f"server 127.0.0.1:{first} "),
                     ("server 127.0.0.1:8082 ", f"server 127.0.0.1:{second} ")):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def test_a_replica_killed_under_load_is_invisible_to_clients(tmp_path):
    replicas = [ServerProcess("--embedding", "--metrics").start(wait=False) for _ in range(2)]
    nginx = None
    try:
        for replica in replicas:
            replica.wait_ready(180)
        front = free_port()
        (tmp_path / "nginx.conf").write_text(nginx_config(front, replicas[0].port, replicas[1].port))
        log = open(tmp_path / "nginx.log", "wb")
        nginx = subprocess.Popen([NGINX, "-p", str(tmp_path), "-e", "stderr", "-c", str(tmp_path / "nginx.conf")],
                                 stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{front}"
        _wait_until_served(base, nginx, tmp_path / "nginx.log")
        reference = {text: replicas[1].post("/v1/embeddings", {"input": text}).json()["data"][0]["embedding"]
                     for text in TEXTS}

        served = threading.Semaphore(0)
        outcomes: list[object] = []

        def client(k: int) -> None:
            session = requests.Session()
            for n in range(12):
                batch = [TEXTS[(k * 5 + n + i) % len(TEXTS)] for i in range(4)]
                try:
                    res = session.post(base + "/v1/embeddings", json={"input": batch}, timeout=120)
                    outcomes.append((batch, res))
                except requests.RequestException as exc:
                    outcomes.append((batch, exc))
                served.release()

        with ThreadPoolExecutor(4) as pool:
            clients = [pool.submit(client, k) for k in range(4)]
            for _ in range(8):
                assert served.acquire(timeout=120)
            before_kill = _decodes(replicas[0])
            replicas[0].proc.send_signal(signal.SIGKILL)  # a crash, with requests in flight on it
            for future in clients:
                future.result()
        assert before_kill > 0  # round robin: the killed replica was serving before it died
        assert len(outcomes) == 48
        for batch, outcome in outcomes:
            assert isinstance(outcome, requests.Response) and outcome.status_code == 200, outcome
            for item, text in zip(outcome.json()["data"], batch, strict=True):
                np.testing.assert_allclose(item["embedding"], reference[text], atol=1e-5)
        assert requests.get(base + "/health", timeout=10).status_code == 200
    finally:
        if nginx is not None:
            nginx.send_signal(signal.SIGQUIT)
            try:
                nginx.wait(10)
            except subprocess.TimeoutExpired:
                nginx.kill()
        for replica in replicas:
            replica.stop()


def _wait_until_served(base: str, nginx: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if nginx.poll() is not None:
            raise AssertionError(f"nginx exited with {nginx.returncode}: {log.read_text()}")
        try:
            if requests.get(base + "/health", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"nginx did not answer: {log.read_text()}")


def _decodes(replica: ServerProcess) -> float:
    return float(parse_metrics(replica.get("/metrics").text)["llamacpp:n_decode_total"])
