"""The real server under an operator's conditions: SIGTERM under load, oversized bodies, hundreds of idle
connections, stalled clients. Loopback only."""
from __future__ import annotations

import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests

from tests.server.harness import ServerProcess

TEXTS = [" ".join(f"word{i * 7 + j}" for j in range(n)) for i, n in enumerate((5, 40, 90, 17, 120, 60, 8, 30))]
SHUTTING_DOWN = {"error": {"message": "Server is shutting down", "type": "unavailable_error", "code": 503}}


def _vectors(res: requests.Response) -> list[list[float]]:
    assert res.status_code == 200, res.text
    return [item["embedding"] for item in res.json()["data"]]


def test_sigterm_under_load_answers_every_accepted_request_then_exits_0():
    srv = ServerProcess("--embedding", "--shutdown-timeout", "60").start()
    try:
        reference = {text: _vectors(srv.post("/v1/embeddings", {"input": text}))[0] for text in TEXTS}
        signalled = threading.Event()
        signal_at: list[float] = []
        outcomes: list[tuple[float, list[str], object]] = []  # (sent at, inputs, response or exception)

        def client(k: int) -> None:
            session = requests.Session()
            n = 0
            while not signalled.is_set():
                inputs = [TEXTS[(k + n + i) % len(TEXTS)] for i in range(12)]
                n += 1
                sent = time.monotonic()
                try:
                    outcome: object = session.post(srv.base + "/v1/embeddings", json={"input": inputs}, timeout=120)
                except requests.RequestException as exc:
                    outcome = exc
                outcomes.append((sent, inputs, outcome))

        with ThreadPoolExecutor(6) as pool:
            clients = [pool.submit(client, k) for k in range(6)]
            time.sleep(3)
            signal_at.append(time.monotonic())
            srv.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            # requests are still being finished: a new connection is refused politely, /health says 503
            health = requests.get(srv.base + "/health", timeout=30)
            late = requests.post(srv.base + "/v1/embeddings", json={"input": "too late"}, timeout=30)
            signalled.set()
            for future in clients:
                future.result()
        assert srv.proc.wait(90) == 0, srv.output()
    finally:
        srv.stop()
    assert (health.status_code, health.json()) == (503, SHUTTING_DOWN)
    assert health.headers["Retry-After"] == "1" and health.headers["Connection"] == "close"
    assert (late.status_code, late.json()) == (503, SHUTTING_DOWN)
    answered_after_signal = 0
    for sent, inputs, outcome in outcomes:
        if isinstance(outcome, requests.Response) and outcome.status_code == 200:
            for got, text in zip(_vectors(outcome), inputs, strict=True):
                np.testing.assert_allclose(got, reference[text], atol=1e-5)
            answered_after_signal += sent < signal_at[0] < sent + outcome.elapsed.total_seconds()
            continue
        # a request sent before the signal was accepted: it must have been answered
        assert sent > signal_at[0] - 0.5, f"accepted request lost: {outcome!r}\n{srv.output()}"
        if isinstance(outcome, requests.Response):  # one sent around the signal: a clean refusal, never a drop
            assert (outcome.status_code, outcome.json()) == (503, SHUTTING_DOWN)
        else:
            assert isinstance(outcome, requests.ConnectionError) and "refused" in str(outcome), outcome
    assert answered_after_signal >= 3, "too few requests were in flight at the signal to test anything"
    assert "all answers written; exiting" in srv.output()


def test_sigint_drains_too_and_a_second_signal_stops_waiting():
    with ServerProcess("--embedding", "--shutdown-timeout", "600") as srv:
        stalled = socket.create_connection(("127.0.0.1", srv.port))  # a request that never finishes arriving
        stalled.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        time.sleep(0.2)
        srv.proc.send_signal(signal.SIGINT)  # Ctrl-C drains like SIGTERM
        time.sleep(0.5)
        assert srv.proc.poll() is None  # it owes that request an answer and waits
        assert requests.get(srv.base + "/health", timeout=10).status_code == 503
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(30) == 0
        stalled.close()
        assert "1 request(s) unanswered" in srv.output()


@pytest.fixture(scope="module")
def server():
    with ServerProcess("--embedding", "--payload-limit", "100000") as srv:  # the default --connection-limit
        yield srv


def test_a_body_over_the_payload_limit_is_413_before_it_is_read(server):
    big = {"input": "x" * 200_000}
    res = server.post("/v1/embeddings", big)
    assert res.status_code == 413
    assert res.json() == {"error": {"message": "the request body is larger than the server accepts (100000 bytes, "
                                               "--payload-limit)", "type": "invalid_request_error", "code": 413}}

    def chunks():  # no Content-Length: refused while reading, once past the limit
        for _ in range(64):
            yield b"x" * 65536

    chunked = requests.post(server.base + "/v1/embeddings", data=chunks(), timeout=60)
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == 413
    assert server.post("/v1/embeddings", {"input": "x" * 90_000}).status_code == 200


def _keep_alive_connection(port: int) -> socket.socket:
    """A client that made one request, read its answer and keeps the connection open, idle."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=30)
    conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while not answer.endswith(b'{"status":"ok"}'):
        chunk = conn.recv(4096)
        assert chunk, f"the server closed the connection: {answer!r}"
        answer += chunk
    return conn


def test_hundreds_of_idle_keep_alive_connections_do_not_lock_out_a_new_client(server):
    idle = []
    try:
        for _ in range(300):
            idle.append(_keep_alive_connection(server.port))
        res = requests.post(server.base + "/v1/embeddings", json={"input": "still served"}, timeout=20)
        assert res.status_code == 200
    finally:
        for conn in idle:
            conn.close()


def test_the_connection_limit_is_enforced_and_released():
    with ServerProcess("--embedding", "--connection-limit", "4") as srv:
        idle = [_keep_alive_connection(srv.port) for _ in range(4)]
        try:
            with pytest.raises(requests.Timeout):  # a fifth connection waits in the backlog
                requests.get(srv.base + "/health", timeout=2)
            idle.pop().close()
            assert requests.get(srv.base + "/health", timeout=20).status_code == 200
        finally:
            for conn in idle:
                conn.close()


def test_stalled_and_slow_clients_do_not_hold_up_others(server):
    stalled = []
    try:
        for _ in range(20):  # more than the HTTP threads: each sent half a request and went silent
            conn = socket.create_connection(("127.0.0.1", server.port))
            conn.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"input\":")
            stalled.append(conn)
        for _ in range(3):  # ... or sent a request and never read the answer
            conn = socket.create_connection(("127.0.0.1", server.port))
            body = b'{"input": "' + b"never read " * 20 + b'"}'
            conn.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            stalled.append(conn)
        started = time.monotonic()
        for _ in range(5):
            assert requests.post(server.base + "/v1/embeddings", json={"input": "hello"}, timeout=20).status_code == 200
        assert time.monotonic() - started < 20
    finally:
        for conn in stalled:
            conn.close()
    assert requests.get(server.base + "/health", timeout=10).status_code == 200
