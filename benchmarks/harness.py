"""The benchmarks' shared harness: server processes, seeded texts, HTTP clients, bounded load, RSS, tables.

Owns what more than one benchmark (and tests/server/harness.py) needs, so each script keeps only its own
workloads, report and command line:
- seeded texts: the word list, `random_words`, `make_texts` (cut to a token budget with the model's tokenizer),
  `request_texts` (request i's slice of a pool);
- `Measurement` and `bounded_load`: one engine under one load, bounded by a request count and a duration;
- RSS: `RssSampler` (process and children, psutil, every 50 ms), `rss_mib` (/proc, the process alone) and a
  process's exact high-water mark (`reset_peak`, `peak_mib`: /proc VmHWM, reset through clear_refs);
- long inputs: `long_input_ids` (one input of exactly n token ids, new for every call), `http_embed_ids`
  (one such input through /v1/embeddings, timed, with its vector) and `cosine`;
- server processes: `free_port`, `ServerProcess` (a subprocess whose output goes to a log file: start,
  wait for GET /health, stop), `MeasuredServer` (the benchmarks' one: timed to ready, RSS-sampled), and the
  command lines of ours and llama-server (`our_server_argv`, `llama_argv`);
- HTTP clients for /v1/embeddings and /v1/rerank (`http_embed_client`, `http_rerank_client`, both on
  `http_json_client`; `warm_http`);
- tables: `Scenario`, `scenario_table`, `print_scenario`, `ratio`, `fmt`, `machine_lines`, `utc_stamp`.
Every address is 127.0.0.1. Only the standard library and numpy are imported here at load time; requests,
orjson, psutil and tokenizers are imported where they are used, so a worker process that imports this module
carries none of them, and the tests (whose extras have no psutil) can use the server-process class.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import itertools
import os
import platform
import random
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"  # the only address the benchmarks talk to
RERANK_DOCS = 20
SHORT_WORDS = 12
LONG_TOKENS = 200
DOC_TOKENS = 100

WORDS = """the of and to in is was for on that with as by at from it an be this are or which have has not but
were their its also one all can more been other new first time used may would who two when there into only
after most some such over these world data model search query document passage index vector memory server
system network request response client latency throughput batch token sentence embedding ranking retrieval
language learning training research science history city river mountain music film game team season player
company market price energy water health school student family church village station island library museum
government council election party policy court law report study analysis method result process structure
university professor engineer computer software hardware machine algorithm performance benchmark evaluation
quickly slowly carefully however therefore although because between against during without within around
small large early late long short high low public private national local general special important different
Paris London Berlin Tokyo California Europe Africa January October summer winter morning evening yesterday
""".split()


# ---------------------------------------------------------------------------------------------------------------
# Texts: seeded, deterministic, cut to a token budget with the model's own tokenizer
# ---------------------------------------------------------------------------------------------------------------
def load_tokenizer(model_dir: Path) -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def random_words(rng: random.Random, n: int) -> str:
    """n words as sentences: capitalised starts, a full stop every 6-16 words, an occasional comma."""
    out: list[str] = []
    until_stop = rng.randint(6, 16)
    for i in range(n):
        word = rng.choice(WORDS)
        if not out or out[-1].endswith("."):
            word = word[:1].upper() + word[1:]
        until_stop -= 1
        if until_stop == 0 or i == n - 1:
            word += "."
            until_stop = rng.randint(6, 16)
        elif rng.random() < 0.06:
            word += ","
        out.append(word)
    return " ".join(out)


def cut_to_tokens(tok: Any, text: str, n_tokens: int) -> str:
    """Cut `text` at the end of the word holding content token n_tokens - 2 (about n_tokens with [CLS]/[SEP])."""
    enc = tok.encode(text, add_special_tokens=False)
    n_content = max(1, n_tokens - 2)
    if len(enc.ids) <= n_content:
        return text
    end = enc.offsets[n_content - 1][1]
    space = text.find(" ", end)
    return text if space < 0 else text[:space]


def make_texts(tok: Any, n: int, kind: str, seed: int) -> list[str]:
    """`short`: 12 words; `long`: ~200 tokens; `doc`: ~100 tokens. Distinct texts, the same on every run."""
    rng = random.Random(f"{kind}-{seed}")
    if kind == "short":
        return [random_words(rng, SHORT_WORDS) for _ in range(n)]
    target = LONG_TOKENS if kind == "long" else DOC_TOKENS
    return [cut_to_tokens(tok, random_words(rng, target * 2), target) for _ in range(n)]


def token_counts(tok: Any, texts: Sequence[str]) -> list[int]:
    return [len(e.ids) for e in tok.encode_batch(list(texts))]


def exact_token_lists(tok: Any, n_rows: int, n_tokens: int, seed: int) -> list[list[int]]:
    """Token lists of exactly n_tokens each: [CLS] + content + [SEP] from the model's post-processor."""
    rng = random.Random(f"ids-{n_tokens}-{seed}")
    rows = []
    for _ in range(n_rows):
        ids = tok.encode(random_words(rng, n_tokens * 2)).ids
        rows.append(ids[: n_tokens - 1] + ids[-1:])
    return rows


def request_texts(pool: Sequence[str], batch: int, i: int) -> list[str]:
    """Request i takes the next `batch` texts of the pool, wrapping around."""
    start = (i * batch) % len(pool)
    return [pool[(start + j) % len(pool)] for j in range(batch)]


# ---------------------------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------------------------
class RssSampler:
    """Samples the RSS of a process and its children every `interval` s; `peak_mib` since the last reset."""

    def __init__(self, pid: int, interval: float = 0.05):
        import psutil

        self._proc = psutil.Process(pid)
        self._interval = interval
        self._peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> int:
        import psutil

        total = 0
        try:
            for p in [self._proc, *self._proc.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, self._sample())
            self._stop.wait(self._interval)

    def reset(self) -> None:
        self._peak = self._sample()

    @property
    def peak_mib(self) -> float:
        return max(self._peak, self._sample()) / 2**20

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)


def rss_mib(pid: int) -> float:
    """The resident set of one process (not its children), MiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def reset_peak(pid: int | str = "self") -> None:
    """Reset a process's high-water mark (VmHWM) to its current RSS (Linux >= 4.0); nothing where it cannot."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        pass


def peak_mib(pid: int | str = "self") -> float:
    """A process's resident high-water mark (VmHWM, MiB) since its start or the last `reset_peak`: exact, where
    a sampler can miss a short peak. NaN when the process is gone (this process: getrusage's maximum)."""
    import resource

    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if pid == "self" else float("nan")


# ---------------------------------------------------------------------------------------------------------------
# Results and bounded load
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class Measurement:
    """One engine under one load: counts, wall time, per-request latencies and the peak RSS seen meanwhile."""

    engine: str
    texts: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    peak_rss_mib: float | None = None
    errors: int = 0
    note: str = ""

    @property
    def texts_per_s(self) -> float:
        return self.texts / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Measurement:
        return Measurement(**d)


Call = Callable[[int], tuple[int, int]]  # request index -> (texts, tokens)


def bounded_load(engine: str, make_client: Callable[[], Call], concurrency: int, max_requests: int,
                 duration: float, sampler: RssSampler | None) -> Measurement:
    """`concurrency` threads share a request counter; each stops at max_requests or after `duration` seconds.

    Requests in flight at the deadline finish and count; the wall time runs to the last one.
    """
    counter = itertools.count()
    lock = threading.Lock()
    result = Measurement(engine)
    errors: list[str] = []
    if sampler is not None:
        sampler.reset()
    started = time.perf_counter()
    deadline = started + duration

    def client() -> None:
        call = make_client()
        while True:
            i = next(counter)
            if i >= max_requests or time.perf_counter() >= deadline:
                return
            t0 = time.perf_counter()
            try:
                n_texts, n_tokens = call(i)
            except Exception as exc:  # noqa: BLE001 - a failed request is counted and reported, not fatal
                with lock:
                    result.errors += 1
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            latency = (time.perf_counter() - t0) * 1000
            with lock:
                result.texts += n_texts
                result.tokens += n_tokens
                result.latencies_ms.append(latency)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.wall_s = time.perf_counter() - started
    if sampler is not None:
        result.peak_rss_mib = sampler.peak_mib
    if errors:
        result.note = f"{result.errors} failed requests, first: {errors[0]}"
    return result


# ---------------------------------------------------------------------------------------------------------------
# Server processes (ours and llama-server)
# ---------------------------------------------------------------------------------------------------------------
def compile_bytecode() -> None:
    """Our modules' bytecode written once, as pip writes an installed package's (__pycache__/, ignored by git): a
    checkout run under PYTHONDONTWRITEBYTECODE, as this machine's environment sets it, would otherwise compile
    every module of ours from source at each start (0.3 s of a server's startup), which no installed server does."""
    import compileall

    for package in ("compat", "engine"):
        compileall.compile_dir(str(REPO / package), quiet=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server subprocess whose stdout and stderr go to a log file; GET /health on 127.0.0.1:port says ready.

    Nothing runs until `start()`. `wait_ready` raises when the process exits first (RuntimeError) or the timeout
    passes (TimeoutError); `poll_ready` only says which ("ready", "exited", "timeout"), for callers that word
    their own error. `stop` sends SIGTERM, waits `grace` seconds for the exit, then kills. `log` is the caller's
    binary file, open for writing; `output()` reads it back by its name.
    """

    def __init__(self, argv: list[str], port: int, log: IO[bytes], *, cwd: Path = REPO,
                 env: dict[str, str] | None = None, stdin: int | None = subprocess.DEVNULL):
        self.argv = argv
        self.port = port
        self.base = f"http://{HOST}:{port}"
        self.log = log
        self.log_path = Path(log.name)
        self.cwd = cwd
        self.env = env  # None: this process's environment
        self.stdin = stdin  # None: this process's stdin
        self.proc: subprocess.Popen | None = None

    def start(self) -> ServerProcess:
        self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=self.stdin)
        return self

    def poll_ready(self, timeout: float, *, probe_timeout: float = 1.0, interval: float = 0.02,
                   headers: dict | None = None, retry: type[Exception] | tuple[type[Exception], ...] | None = None) -> str:
        """Probe GET /health every `interval` s until it answers 200 ("ready"), the process ends ("exited") or
        `timeout` s pass ("timeout"). A probe that raises `retry` (default: any requests error) is tried again."""
        import requests

        retry = retry or requests.RequestException
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return "exited"
            try:
                if requests.get(self.base + "/health", timeout=probe_timeout, headers=headers).status_code == 200:
                    return "ready"
            except retry:
                pass
            time.sleep(interval)
        return "timeout"

    def wait_ready(self, timeout: float = 90, **probe: Any) -> None:
        outcome = self.poll_ready(timeout, **probe)
        if outcome == "exited":
            raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
        if outcome == "timeout":
            raise TimeoutError(f"server not ready in {timeout} s:\n{self.output()}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float) -> int:
        """SIGTERM, then the exit status within `timeout` s (subprocess.TimeoutExpired past it)."""
        self.proc.terminate()
        return self.proc.wait(timeout=timeout)

    def stop(self, grace: float = 15.0, kill_wait: float | None = 15.0) -> None:
        """SIGTERM if it still runs; SIGKILL when it has not exited after `grace` s."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.terminate(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=kill_wait)


class MeasuredServer(ServerProcess):
    """The benchmarks' server: started at construction, its log `name-port.log` in `log_dir`, `startup_s` = process
    start to the first GET /health answering 200, and its RSS with children sampled from then on (`sampler`)."""

    def __init__(self, name: str, argv: list[str], port: int, log_dir: Path, ready_timeout: float = 180.0):
        super().__init__(argv, port, open(log_dir / f"{name}-{port}.log", "wb"))
        self.name = name
        self.sampler: RssSampler | None = None
        self.startup_s = float("nan")
        started = time.perf_counter()
        self.start()
        outcome = self.poll_ready(ready_timeout - (time.perf_counter() - started))  # the deadline counts from the start
        if outcome != "ready":  # the log is read before stop() closes it
            tail = self.log_tail()
            self.stop()
            why = f"exited with {self.proc.returncode} while starting" if outcome == "exited" else \
                f"was not ready within {ready_timeout:g} s"
            raise RuntimeError(f"{name} {why}; log:\n{tail}")
        self.startup_s = time.perf_counter() - started
        self.sampler = RssSampler(self.proc.pid)

    def log_tail(self, n: int = 30) -> str:
        self.log.flush()
        return "\n".join(self.output().splitlines()[-n:])

    def blas_line(self) -> str | None:
        match = re.search(r"BLAS: (.+)", self.output())
        return match.group(1).strip() if match else None

    def stop(self) -> None:  # type: ignore[override]
        if self.sampler is not None:
            self.sampler.close()
        super().stop()
        self.log.close()


def our_server_argv(model: Path | None, port: int, rerank: bool) -> list[str]:
    argv = [sys.executable, "-m", "compat.cli", "--embedding", "--host", HOST, "--port", str(port)]
    if model is not None:
        argv += ["-m", str(model)]
    if rerank:
        argv.append("--reranking")
    return argv


def llama_argv(binary: str, gguf: str, port: int, rerank: bool, extra: str) -> list[str]:
    argv = [binary, "--embedding", "--host", HOST, "--port", str(port), "-m", gguf]
    if rerank:
        argv.append("--reranking")
    return argv + shlex.split(extra)


# ---------------------------------------------------------------------------------------------------------------
# HTTP clients
# ---------------------------------------------------------------------------------------------------------------
def http_json_client(url: str, body: Callable[[int], dict], answers: str, per_request: int, noun: str,
                     of: str) -> Callable[[], Call]:
    """Request i POSTs `body(i)` as JSON (serialised with orjson inside the timed call), one requests.Session per
    client thread; the answer must hold `per_request` entries under `answers`. Returns (per_request, the answer's
    usage.prompt_tokens)."""
    import orjson
    import requests

    def make() -> Call:
        session = requests.Session()

        def call(i: int) -> tuple[int, int]:
            data = orjson.dumps(body(i))
            resp = session.post(url, data=data, headers={"Content-Type": "application/json"}, timeout=600)
            resp.raise_for_status()
            reply = orjson.loads(resp.content)
            if len(reply[answers]) != per_request:
                raise RuntimeError(f"{len(reply[answers])} {noun} for {per_request} {of}")
            return per_request, int(reply["usage"]["prompt_tokens"])

        return call

    return make


def http_embed_client(base: str, pool: Sequence[str], batch: int) -> Callable[[], Call]:
    """/v1/embeddings: request i embeds the next `batch` texts of the pool (a single text as a string)."""

    def body(i: int) -> dict:
        texts = request_texts(pool, batch, i)
        return {"input": texts[0] if batch == 1 else texts, "model": "bench"}

    return http_json_client(base + "/v1/embeddings", body, "data", batch, "vectors", "texts")


def http_rerank_client(base: str, queries: Sequence[str], docs: Sequence[str]) -> Callable[[], Call]:
    """/v1/rerank: request i ranks the next RERANK_DOCS documents against query i (cycling through both)."""

    def body(i: int) -> dict:
        return {"query": queries[i % len(queries)], "documents": request_texts(docs, RERANK_DOCS, i),
                "top_n": RERANK_DOCS, "model": "bench"}

    return http_json_client(base + "/v1/rerank", body, "results", RERANK_DOCS, "results", "documents")


def http_embed_ids(base: str, timeout: float = 1800.0) -> Callable[[list[int]], tuple[float, list[float]]]:
    """One input given as token ids through /v1/embeddings: returns (seconds from send to the parsed answer, its
    vector). A refusal raises RuntimeError with the status and the server's message; a dead server, requests'
    ConnectionError."""
    import orjson
    import requests

    session = requests.Session()

    def call(ids: list[int]) -> tuple[float, list[float]]:
        data = orjson.dumps({"input": ids, "encoding_format": "float", "model": "bench"})
        started = time.perf_counter()
        resp = session.post(base + "/v1/embeddings", data=data, headers={"Content-Type": "application/json"},
                            timeout=timeout)
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
        vector = orjson.loads(resp.content)["data"][0]["embedding"]
        return time.perf_counter() - started, vector

    return call


def long_input_ids(n: int, call: int, eos: int, high: int = 150_000) -> list[int]:
    """n token ids for the call-th call at that length: a pseudo-random sequence in [200, high), a new one for
    every call (llama-server would otherwise reuse its cache of the previous prompt and compute one token), the
    last one `eos` (what last-token pooling reads)."""
    return [int(t) for t in np.random.default_rng([n, call + 1]).integers(200, high, n - 1)] + [eos]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def warm_http(make_client: Callable[[], Call], n: int = 2) -> None:
    call = make_client()
    for i in range(n):
        call(i)


# ---------------------------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------------------------
def ratio(value: float, base: float) -> str:
    if not base or base != base or value != value:
        return "-"
    return f"{value / base:.2f}"


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:,.{digits}f}"


@dataclass
class Scenario:
    """A table of the report: a title and one measurement per engine, ours first (the ratio base)."""

    key: str
    title: str
    rows: list[Measurement] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "engine: why"

    def ours(self) -> Measurement | None:
        return next((m for m in self.rows if m.engine.startswith("ours")), None)

    def row(self, prefix: str) -> Measurement | None:
        return next((m for m in self.rows if m.engine.startswith(prefix)), None)


def scenario_table(sc: Scenario, markdown: bool) -> list[str]:
    """Markdown: the listed columns plus 'ratio to ours' (throughput, p50). Console: every figure with its ratio."""
    base = sc.ours()
    lines = []
    if markdown:
        lines += ["| engine | texts/s | tokens/s | p50 ms | p95 ms | peak RSS MiB | ratio to ours (texts/s, p50) |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
    for m in sc.rows:
        cells = [(m.texts_per_s, base.texts_per_s if base else None, 1),
                 (m.tokens_per_s, base.tokens_per_s if base else None, 0),
                 (m.percentile(50), base.percentile(50) if base else None, 1),
                 (m.percentile(95), base.percentile(95) if base else None, 1),
                 (m.peak_rss_mib, base.peak_rss_mib if base else None, 0)]
        note = f" ({m.note})" if m.note else ""
        if markdown:
            r = f"{ratio(m.texts_per_s, base.texts_per_s)}, {ratio(m.percentile(50), base.percentile(50))}" if base else "-"
            lines.append(f"| {m.engine}{note} | " + " | ".join(fmt(v, d) for v, _, d in cells) + f" | {r} |")
        else:
            parts = [f"{fmt(v, d)} (x{ratio(v, b or float('nan'))})" for v, b, d in cells]
            lines.append(f"  {m.engine:<44} texts/s {parts[0]}  tokens/s {parts[1]}  p50 ms {parts[2]}  "
                         f"p95 ms {parts[3]}  RSS MiB {parts[4]}{note}")
    for why in sc.skipped:
        lines.append(f"| {why} | - | - | - | - | - | - |" if markdown else f"  skipped: {why}")
    return lines


def print_scenario(sc: Scenario) -> None:
    print(f"\n{sc.title}  [ratios to ours in parentheses]", flush=True)
    print("\n".join(scenario_table(sc, markdown=False)), flush=True)


def machine_lines(blas_line: str | None) -> list[str]:
    import psutil

    cpu = "unknown"
    try:
        match = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        cpu = match.group(1).strip() if match else platform.processor() or "unknown"
    except OSError:
        cpu = platform.processor() or "unknown"
    os_name = platform.platform()
    try:
        match = re.search(r'PRETTY_NAME="(.+)"', Path("/etc/os-release").read_text())
        os_name = f"{match.group(1)} ({platform.system()} {platform.release()})" if match else os_name
    except OSError:
        pass

    def version(pkg: str) -> str:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    coretype = os.environ.get("OPENBLAS_CORETYPE")
    return [
        f"- CPU: {cpu}, {psutil.cpu_count(logical=True)} logical cores ({psutil.cpu_count(logical=False)} physical)",
        f"- RAM: {psutil.virtual_memory().total / 2**30:.1f} GiB",
        f"- OS: {os_name}",
        f"- Python {platform.python_version()}; mlx {version('mlx')}, torch {version('torch')}, onnxruntime "
        f"{version('onnxruntime')}, transformers {version('transformers')}, sentence-transformers "
        f"{version('sentence-transformers')}",
        f"- BLAS (our engine): {blas_line or 'unknown'}" + (f"; OPENBLAS_CORETYPE={coretype}" if coretype else ""),
        f"- Date: {utc_stamp()}",
    ]


def utc_stamp() -> str:
    """Now in UTC as the reports print it: `2025-01-31 14:05 UTC`."""
    return f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
