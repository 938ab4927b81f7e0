"""Soak: many clients for a long time against one server; every answer checked, memory watched.

    nice -n 10 .venv/bin/python benchmarks/soak.py [--duration S] [--clients N] [--warmup S] [--out PATH]
        [--server-args "..."]

Starts our server (a subprocess on 127.0.0.1, the bundled all-MiniLM-L6-v2 unless --server-args names a model),
computes each text's reference vector with a request of that text alone, then runs `--clients` threads for
`--duration` seconds. Each request takes 1-8 random texts from a pool of short and longer ones, on a random
embedding route and encoding (/v1/embeddings float or base64, /embedding), and every vector in every answer is
compared with its reference (the largest difference is the drift). The server's RSS is sampled every 5 s
(/proc). RSS moves with the size of the passes in flight, so growth compares medians: the last quarter of
the samples after the warm-up against the first quarter.
The report (--out, default benchmarks/SOAK.md) is rewritten; the exit status is 0 only when there were no
errors, the drift stayed within 1e-5 and the growth under 5%.
This script owns its checking clients and SOAK.md; the server process, free port, texts and /proc RSS are
benchmarks/harness.py's.
"""
from __future__ import annotations

import argparse
import base64
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.harness import HOST, ServerProcess, free_port, random_words, rss_mib, utc_stamp  # noqa: E402

MAX_DRIFT = 1e-5
MAX_GROWTH = 0.05
RSS_EVERY_S = 5.0
CLIENT_TIMEOUT_S = 900  # a shared 2-core machine can be very slow; a lost answer still shows as a transport error
ROUTES = ("/v1/embeddings float", "/v1/embeddings base64", "/embedding")


@dataclass
class Tally:
    requests: int = 0
    vectors: int = 0
    errors: list[str] = field(default_factory=list)
    drift: float = 0.0
    latencies: list[float] = field(default_factory=list)
    by_route: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def vectors_of(route: str, res: requests.Response) -> list[np.ndarray]:
    body = res.json()
    if route == "/embedding":
        return [np.asarray(item["embedding"][0]) for item in body]
    if route.endswith("base64"):
        return [np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4").astype(np.float64)
                for item in body["data"]]
    return [np.asarray(item["embedding"]) for item in body["data"]]


def ask(session: requests.Session, base: str, route: str, texts: list[str]) -> requests.Response:
    path = route.split()[0]
    if path == "/embedding":
        payload = {"content": texts}
    else:
        payload = {"input": texts, "encoding_format": route.split()[1]}
    return session.post(base + path, json=payload, timeout=CLIENT_TIMEOUT_S)


def client(k: int, base: str, pool: list[str], reference: dict[str, np.ndarray], until: float,
           tally: Tally) -> None:
    rng = random.Random(k)
    session = requests.Session()
    while time.monotonic() < until:
        texts = rng.sample(pool, rng.randint(1, 8))
        route = rng.choice(ROUTES)
        started = time.monotonic()
        try:
            res = ask(session, base, route, texts)
            if res.status_code != 200:
                raise RuntimeError(f"{route}: {res.status_code} {res.text[:200]}")
            got = vectors_of(route, res)
            if len(got) != len(texts):
                raise RuntimeError(f"{route}: {len(got)} vectors for {len(texts)} texts")
            drift = max(float(np.max(np.abs(v - reference[t]))) for v, t in zip(got, texts))
        except Exception as exc:  # noqa: BLE001 - every failure is a finding, counted and reported
            with tally.lock:
                tally.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            continue
        with tally.lock:
            tally.requests += 1
            tally.vectors += len(texts)
            tally.drift = max(tally.drift, drift)
            tally.latencies.append(time.monotonic() - started)
            tally.by_route[route] = tally.by_route.get(route, 0) + 1


def make_pool(n: int) -> list[str]:
    rng = random.Random("soak")
    lengths = [rng.choice((4, 12, 12, 30, 60, 120)) for _ in range(n)]
    return [random_words(rng, words) for words in lengths]


def first_of_each_minute(samples: list[tuple[float, float]]) -> list[float]:
    firsts: dict[int, float] = {}
    for t, rss in samples:
        firsts.setdefault(int(t // 60), rss)
    return list(firsts.values())


def median_between(samples: list[tuple[float, float]], start: float, end: float) -> float:
    inside = [rss for t, rss in samples if start <= t <= end]
    return statistics.median(inside) if inside else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of load (default 1800)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=None, help="seconds before the RSS baseline (default: "
                        "a tenth of the duration, at most 300)")
    parser.add_argument("--pool", type=int, default=200, help="distinct texts (default 200)")
    parser.add_argument("--server-args", default="", help="extra flags for the server")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "SOAK.md")
    args = parser.parse_args(argv)
    warmup = args.warmup if args.warmup is not None else min(300.0, args.duration / 10)

    # the code the server runs: the checkout as it is now, when the server starts
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    port = free_port()
    server_argv = [sys.executable, "-m", "compat.cli", "--embedding", "--metrics", "--host", HOST, "--port",
                   str(port), *shlex.split(args.server_args)]
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"soak-server-{port}.log"
    with open(log_path, "wb") as log:
        server = ServerProcess(server_argv, port, log).start()
    base = server.base
    try:
        if server.poll_ready(180, interval=0.1) != "ready":
            raise SystemExit(f"the server did not start; log: {log_path}")
        pool = make_pool(args.pool)
        reference = {t: np.asarray(requests.post(base + "/v1/embeddings", json={"input": t}, timeout=60)
                                   .json()["data"][0]["embedding"]) for t in pool}
        tally = Tally()
        samples: list[tuple[float, float]] = []
        every = min(RSS_EVERY_S, max(0.5, args.duration / 40))  # short smoke runs still get samples
        started = time.monotonic()
        until = started + args.duration
        threads = [threading.Thread(target=client, args=(k, base, pool, reference, until, tally), daemon=True)
                   for k in range(args.clients)]
        for thread in threads:
            thread.start()
        while time.monotonic() < until:
            samples.append((time.monotonic() - started, rss_mib(server.proc.pid)))
            time.sleep(min(every, max(0.0, until - time.monotonic())))
        for thread in threads:
            thread.join(timeout=180)
        samples.append((time.monotonic() - started, rss_mib(server.proc.pid)))
        healthy = requests.get(base + "/health", timeout=10).status_code == 200
        metrics = requests.get(base + "/metrics", timeout=10).text
        elapsed = time.monotonic() - started
    finally:
        exit_code = server.terminate(60)
    window = (elapsed - warmup) / 4
    baseline = median_between(samples, warmup, warmup + window)
    final = median_between(samples, elapsed - window, elapsed)
    growth = final / baseline - 1
    passed = not tally.errors and tally.drift <= MAX_DRIFT and growth < MAX_GROWTH and healthy and exit_code == 0
    write_report(args, server_argv, tally, samples, warmup, window, baseline, final, growth, elapsed, healthy,
                 exit_code, metrics, passed, commit)
    print(args.out.read_text())
    return 0 if passed else 1


def write_report(args: argparse.Namespace, server_argv: list[str], tally: Tally, samples: list[tuple[float, float]],
                 warmup: float, window: float, baseline: float, final: float, growth: float, elapsed: float,
                 healthy: bool, exit_code: int, metrics: str, passed: bool, commit: str) -> None:
    latencies = sorted(tally.latencies) or [float("nan")]
    load = os.getloadavg()
    lines = [
        "# Soak run",
        "",
        f"`{' '.join(['benchmarks/soak.py', *(argv_text for argv_text in sys.argv[1:])])}` at commit `{commit}`, "
        f"{utc_stamp()}, {platform.machine()} "
        f"{os.cpu_count()} cores. The machine was shared with other work during the run (load average at the "
        f"end {load[0]:.1f}), so the throughput below is not a speed measurement.",
        "",
        f"Server: `{' '.join(server_argv[1:])}`",
        "",
        "| check | result | bound |",
        "|---|---|---|",
        f"| requests answered 200 and checked | {tally.requests} ({tally.vectors} vectors, "
        f"{tally.requests / elapsed:.1f} requests/s) | |",
        f"| errors (non-200, wrong count, transport) | {len(tally.errors)} | 0 |",
        f"| largest difference from the single-request reference vector | {tally.drift:.2e} | {MAX_DRIFT:g} |",
        f"| RSS after warm-up (median of the {window:.0f} s after {warmup:.0f} s) | {baseline:.1f} MiB | |",
        f"| RSS at the end (median of the last {window:.0f} s) | {final:.1f} MiB | |",
        f"| RSS growth | {growth * 100:+.2f}% | < {MAX_GROWTH * 100:g}% |",
        f"| /health after the run | {'200' if healthy else 'not 200'} | 200 |",
        f"| exit status after SIGTERM | {exit_code} | 0 |",
        f"| latency p50 / p99 / max | {latencies[len(latencies) // 2] * 1000:.0f} / "
        f"{latencies[int(len(latencies) * 0.99)] * 1000:.0f} / {latencies[-1] * 1000:.0f} ms | |",
        "",
        f"**{'PASS' if passed else 'FAIL'}**: {args.clients} clients for {elapsed:.0f} s; requests per route: "
        + ", ".join(f"{route} {n}" for route, n in sorted(tally.by_route.items())) + ".",
        "",
        "RSS over time (MiB, the first sample of each minute):",
        "",
        "```",
        " ".join(f"{rss:.0f}" for rss in first_of_each_minute(samples)) or "-",
        "```",
    ]
    if tally.errors:
        lines += ["", "First errors:", "", *[f"- {e}" for e in tally.errors[:20]]]
    lines += ["", "Metrics at the end:", "", "```",
              *[line for line in metrics.splitlines() if line and not line.startswith("#")], "```", ""]
    args.out.write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
